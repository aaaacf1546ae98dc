"""Run and session ids: unguessable ``run_`` handles that are plain strings on the wire.

Seed cases ``generated_run_ids_are_unique`` and ``ids_serialize_as_plain_strings`` [§1.21].
"""

from __future__ import annotations

import itertools
import json
import re

from pydantic import BaseModel

from agent_plugin.ids import RunId, SessionId, new_run_id

_RUN_ID = re.compile(r"run_([0-9a-f]+)")


def test_generated_run_ids_are_unique() -> None:
    ids = [new_run_id() for _ in range(1000)]
    assert len(set(ids)) == 1000
    assert all(i.startswith("run_") for i in ids)


def test_run_ids_carry_at_least_122_random_bits() -> None:
    run_id = new_run_id()
    match = _RUN_ID.fullmatch(run_id)
    assert match is not None, run_id
    assert len(match.group(1)) * 4 >= 122
    # every id has the same shape, so none is shorter (a leading-zero trim would be)
    assert {len(new_run_id()) for _ in range(200)} == {len(run_id)}


def test_run_id_hex_digits_are_not_a_counter() -> None:
    """Consecutive ids share no long prefix: the suffix is random, not time or a sequence."""
    ids = [_RUN_ID.fullmatch(new_run_id()) for _ in range(200)]
    suffixes = [m.group(1) for m in ids if m is not None]
    assert len(suffixes) == 200
    # each hex position takes many values across the sample
    for position in range(len(suffixes[0])):
        assert len({s[position] for s in suffixes}) >= 8
    shared = [len(_common_prefix(a, b)) for a, b in itertools.pairwise(suffixes)]
    assert max(shared) < 8


def _common_prefix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


class _Record(BaseModel):
    run_id: RunId
    session_id: SessionId | None = None


def test_ids_serialize_as_plain_strings() -> None:
    run_id = new_run_id()
    record = _Record(run_id=run_id, session_id=SessionId("sess_42"))
    encoded = record.model_dump_json()
    assert json.loads(encoded) == {"run_id": run_id, "session_id": "sess_42"}
    assert f'"run_id":"{run_id}"' in encoded
    decoded = _Record.model_validate_json(encoded)
    assert decoded == record
    assert type(decoded.run_id) is str
    assert json.dumps(run_id) == f'"{run_id}"'

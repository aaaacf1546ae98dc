"""The loop guard [AP-32]: warn at 3, stop at 5 within 30 calls, fingerprints survive a resume."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.loop_guard import (
    OK,
    LoopGuard,
    Ok,
    Stop,
    Warn,
    fingerprint,
    warning_note,
)
from agent_plugin.messages import ChatMessage
from agent_plugin.outcomes import RunState

WEATHER_ARGS = {"city": "Oslo", "units": "metric"}
WEATHER = '{"temp":4}'


def test_identical_calls_warn_then_stop() -> None:
    tracker = LoopGuard().tracker()
    verdicts = [tracker.record("get_weather", WEATHER_ARGS, WEATHER) for _ in range(5)]
    assert verdicts == [OK, OK, Warn(3), Warn(4), Stop(5)]


def test_argument_key_order_does_not_matter() -> None:
    tracker = LoopGuard().tracker()
    tracker.record("get_weather", {"city": "Oslo", "units": "metric"}, WEATHER)
    tracker.record("get_weather", {"units": "metric", "city": "Oslo"}, WEATHER)
    assert tracker.record("get_weather", WEATHER_ARGS, WEATHER) == Warn(3)


def test_changing_results_are_not_a_loop() -> None:
    tracker = LoopGuard().tracker()
    for i in range(40):
        assert tracker.record("job_status", {"id": 7}, f'{{"progress":{i}}}') is OK
    # a different tool name or different arguments are different calls too
    tracker = LoopGuard().tracker()
    for i in range(40):
        assert tracker.record(f"tool_{i % 2}", {"page": i}, "same") is OK


def test_ping_pong_is_caught() -> None:
    tracker = LoopGuard().tracker()
    verdicts = [
        tracker.record(name, {"q": name}, f"result of {name}")
        for _ in range(5)
        for name in ("search", "open")
    ]
    assert verdicts == [OK, OK, OK, OK, Warn(3), Warn(3), Warn(4), Warn(4), Stop(5), Stop(5)]


def test_disabled_guard_never_fires() -> None:
    guard = LoopGuard.disabled()
    assert not guard.enabled
    tracker = guard.tracker([1, 2, 3])
    for _ in range(100):
        assert tracker.record("get_weather", WEATHER_ARGS, WEATHER) is OK
    assert tracker.recent == []
    assert len(tracker) == 0


def test_saved_fingerprints_round_trip() -> None:
    guard = LoopGuard()
    before_pause = guard.tracker()
    assert before_pause.record("get_weather", WEATHER_ARGS, WEATHER) is OK
    assert before_pause.record("get_weather", WEATHER_ARGS, WEATHER) is OK
    state = RunState(
        run_id="run-1", messages=[ChatMessage.user("hi")], recent_calls=before_pause.recent
    )
    restored = RunState.model_validate_json(state.model_dump_json())
    assert restored.recent_calls == before_pause.recent
    after_resume = guard.tracker(restored.recent_calls)
    assert after_resume.record("get_weather", WEATHER_ARGS, WEATHER) == Warn(3)


def test_restored_fingerprints_keep_only_the_window() -> None:
    guard = LoopGuard(warn_after=2, stop_after=4, window=4)
    tracker = guard.tracker([10, 11, 12, 13, 14, 15])
    assert tracker.recent == [12, 13, 14, 15]


def test_calls_that_leave_the_window_stop_counting() -> None:
    tracker = LoopGuard(warn_after=2, stop_after=3, window=3).tracker()
    assert tracker.record("a", {}, "x") is OK
    assert tracker.record("b", {}, "y") is OK
    assert tracker.record("c", {}, "z") is OK
    # the first "a" has just been pushed out of the window of 3
    assert tracker.record("a", {}, "x") is OK
    assert tracker.record("a", {}, "x") == Warn(2)
    assert tracker.record("a", {}, "x") == Stop(3)
    assert tracker.recent == [fingerprint("a", {}, "x")] * 3


@st.composite
def guards(draw: st.DrawFn) -> LoopGuard:
    """Valid guards: disabled (window 0), or 1 <= warn_after <= stop_after <= window."""
    window = draw(st.integers(min_value=0, max_value=8))
    if window == 0:
        return LoopGuard.disabled()
    stop_after = draw(st.integers(min_value=1, max_value=window))
    warn_after = draw(st.integers(min_value=1, max_value=stop_after))
    return LoopGuard(warn_after=warn_after, stop_after=stop_after, window=window)


@settings(max_examples=200, deadline=None)
@given(
    guard=guards(),
    saved=st.lists(st.integers(min_value=0, max_value=2**53 - 1), max_size=12),
    calls=st.lists(
        st.tuples(
            st.sampled_from(["a", "b"]), st.sampled_from([0, 1]), st.sampled_from(["x", "y"])
        ),
        max_size=40,
    ),
)
def test_window_bound_property(
    guard: LoopGuard, saved: list[int], calls: list[tuple[str, int, str]]
) -> None:
    """The tracker never holds more than ``window`` fingerprints, repeats never exceed it, and
    each verdict matches a plain recount over the last ``window`` calls."""
    window, warn_after, stop_after = guard.window, guard.warn_after, guard.stop_after
    tracker = guard.tracker(saved)
    model: deque[int] = deque(saved[-window:] if window else [], maxlen=window)
    assert tracker.recent == list(model)
    for name, arg, content in calls:
        verdict = tracker.record(name, {"arg": arg}, content)
        assert len(tracker.recent) <= window
        if window == 0:
            assert verdict is OK
            continue
        model.append(fingerprint(name, {"arg": arg}, content))
        repeats = model.count(model[-1])
        assert repeats <= window
        if repeats >= stop_after:
            assert verdict == Stop(repeats)
        elif repeats >= warn_after:
            assert verdict == Warn(repeats)
        else:
            assert verdict == Ok()
        assert tracker.recent == list(model)


# A fixed value: if this changes, fingerprints saved by older versions stop matching.
# (It changed once, from 64 to 53 bits: a resumed run then starts counting repeats afresh.)
KNOWN_FINGERPRINT = 2141943281691661


def test_fingerprint_is_stable_across_processes() -> None:
    args = {"city": "Zürich", "days": [1, 2], "nested": {"b": None, "a": 1.5}}
    here = fingerprint("get_weather", args, "sunny ☀")
    code = (
        "from agent_plugin.loop_guard import fingerprint;"
        "print(fingerprint('get_weather',"
        " {'nested': {'a': 1.5, 'b': None}, 'days': [1, 2], 'city': 'Zürich'}, 'sunny ☀'))"
    )
    for seed in ("1", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONIOENCODING": "utf-8"}
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        assert int(out.stdout) == here
    assert here == KNOWN_FINGERPRINT
    assert 0 <= here < 2**53


def test_fingerprint_follows_the_documented_recipe() -> None:
    """SHA-256 over length-prefixed UTF-8 parts; the first 53 bits, big endian, unsigned."""
    args = {"b": [1, "é"], "a": None}
    digest = hashlib.sha256()
    for part in ("tool", '{"a":null,"b":[1,"é"]}', "out"):
        data = part.encode()
        digest.update(len(data).to_bytes(8, "big") + data)
    expected = int.from_bytes(digest.digest()[:8], "big") >> 11
    assert fingerprint("tool", args, "out") == expected
    assert expected.bit_length() <= 53
    assert float(expected) == expected  # a JavaScript number holds it exactly


@settings(max_examples=50, deadline=None)
@given(st.text(), st.text())
def test_fingerprints_fit_in_53_bits(name: str, content: str) -> None:
    value = fingerprint(name, {"q": content}, content)
    assert 0 <= value < 2**53
    assert json.loads(json.dumps(value)) == int(float(value)) == value


def test_fingerprint_parts_cannot_run_into_each_other() -> None:
    # name "a" + arguments 12 and name "a1" + arguments 2 concatenate to the same text
    assert fingerprint("a", 12, "") != fingerprint("a1", 2, "")
    assert fingerprint("a", "b", "c") != fingerprint("a", "bc", "")
    assert fingerprint("t", {}, "x") != fingerprint("t", {}, "y")
    assert fingerprint("t", {"k": 1}, "x") == fingerprint("t", {"k": 1}, "x")
    # odd argument values a provider may send still fingerprint (never raise on the hot path)
    assert fingerprint("t", {"k": float("nan")}, "x") != fingerprint("t", {"k": None}, "x")
    infinite = json.loads('{"k": [Infinity, -Infinity, NaN]}')
    assert fingerprint("t", infinite, "x") == fingerprint("t", infinite, "x")
    assert fingerprint("t", {"k": "\ud800"}, "x") != fingerprint("t", {"k": ""}, "x")


def test_warning_note_prefix() -> None:
    note = warning_note("get_weather", 3)
    assert note.startswith("\n[harness] You called get_weather 3 times")
    assert "identical" in note
    assert "answer with what you have" in note
    assert warning_note("search", 4).startswith("\n[harness] You called search 4 times")


def test_defaults_and_validation() -> None:
    assert LoopGuard() == LoopGuard(warn_after=3, stop_after=5, window=30)
    for bad in (
        {"warn_after": 0},
        {"stop_after": 0},
        {"window": -1},
        {"warn_after": 6},  # warns after it has stopped
        {"window": 4},  # 5 repeats never fit in a window of 4: it could never stop
        {"warn_after": 1, "stop_after": 2, "window": 1},
    ):
        with pytest.raises(AgentError) as caught:
            LoopGuard(**bad)
        assert caught.value.kind is ErrorKind.CONFIG
        assert "loop guard" in caught.value.message
    # the tightest valid guards
    assert LoopGuard(warn_after=1, stop_after=1, window=1).tracker().record("t", {}, "x") == Stop(1)
    assert LoopGuard(warn_after=5, stop_after=5, window=5).enabled


def test_disabled_is_window_zero_only() -> None:
    assert LoopGuard.disabled() == LoopGuard(window=0)
    assert not LoopGuard(warn_after=99, stop_after=1, window=0).enabled  # thresholds ignored

"""Request bodies as bytes, with the work of earlier requests kept: the wire clients' encoding.

:func:`dumps` is the one request encoding (compact, UTF-8 as is); :func:`encode_json` splices
:class:`RawJson` (bytes encoded earlier) into a body. Two stores keep what was encoded:
:class:`EncodedCache` holds the encoding of an immutable object by identity (a tuple of tool
definitions), and :class:`EncodedPrefixes` holds the encoded ``messages`` array of each
conversation a client is carrying on, extended by the new messages of each request, so a
request encodes only what is new however long the conversation has grown.
"""

from __future__ import annotations

import json
import operator
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from typing import Any, Final, Generic, TypeVar

from agent_plugin.errors import AgentError

__all__ = [
    "MESSAGE_COST",
    "EncodedCache",
    "EncodedPrefix",
    "EncodedPrefixes",
    "RawJson",
    "compact_json",
    "dumps",
    "encode_json",
]

M = TypeVar("M")

MESSAGE_COST: Final = 1024
"""About what a message object costs in memory (a frozen model, its parts and their fields): an
:class:`EncodedPrefixes` entry keeps its messages alive, and counts them at this size."""


def _not_json(value: object) -> object:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


# The one request encoding: compact, UTF-8 as is (not \u-escaped), the text json.dumps gives
# with those options. The C encoder json.JSONEncoder builds on every call is built once here
# (a third of the cost of encoding a message); without the C accelerator, the encoder does.
_ENCODER: Final = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))
_C_ENCODER: Final = (
    None
    if c_make_encoder is None
    else c_make_encoder(None, _not_json, encode_basestring, None, ":", ",", False, False, True)
)
_FAILURES: Final = (TypeError, ValueError, RecursionError)  # RecursionError: a cycle


def compact_json(value: object) -> str:
    """``value`` as request JSON text: compact separators, non-ASCII characters as they are."""
    try:
        if _C_ENCODER is None:
            return _ENCODER.encode(value)
        return "".join(_C_ENCODER(value, 0))
    except _FAILURES as error:
        raise _unsendable(error) from None


def dumps(value: object) -> bytes:
    """``value`` as request JSON: :func:`compact_json` in UTF-8."""
    try:
        if _C_ENCODER is None:
            return _ENCODER.encode(value).encode()
        return "".join(_C_ENCODER(value, 0)).encode()
    except _FAILURES as error:  # a non-JSON value, a lone surrogate, a cycle
        raise _unsendable(error) from None


def _unsendable(error: Exception) -> AgentError:
    return AgentError.config(f"the request cannot be sent as JSON: {error}")


class RawJson:
    """JSON encoded earlier (by :func:`dumps`), for :func:`encode_json` to splice in verbatim:
    the ``parts`` one after another (``RawJson(b"[", prefix, b"]")`` copies nothing)."""

    __slots__ = ("parts",)

    def __init__(self, *parts: bytes | memoryview) -> None:
        self.parts = parts


def encode_json(body: Mapping[str, Any]) -> bytes:
    """``body`` as request JSON, with every top-level :class:`RawJson` value spliced in as is.

    The bytes are those :func:`dumps` gives for ``body`` with each ``RawJson`` replaced by the value
    it encodes, keys in the same order; the other values are encoded in runs, one
    :func:`dumps` per run of consecutive keys.
    """
    out: list[bytes | memoryview] = [b"{"]
    run: dict[str, Any] = {}
    for key, value in body.items():
        if type(value) is not RawJson:
            run[key] = value
            continue
        if run:
            out += (dumps(run)[1:-1], b",")
            run = {}
        out += (dumps(key), b":", *value.parts, b",")
    if run:
        out.append(dumps(run)[1:-1])
    elif len(out) > 1:
        out.pop()  # the comma after the last spliced value
    out.append(b"}")
    return b"".join(out)


class EncodedCache:
    """Encodings of immutable objects (tuples of tool definitions), by identity.

    An entry keeps its object alive, so the object's ``id`` cannot be reused while the entry
    exists, and :meth:`get` checks identity anyway. Bounded both in entries and in encoded bytes:
    the least recently used entries go first, and an encoding larger than the whole byte budget
    is not kept. Equal but distinct objects get entries of their own. Each client has its own;
    not thread-safe (one event loop uses a client).
    """

    def __init__(self, *, max_entries: int = 4096, max_bytes: int = 32 * 1024 * 1024) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._entries: OrderedDict[int, tuple[object, bytes]] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def size(self) -> int:
        """The encoded bytes held."""
        return self._bytes

    def clear(self) -> None:
        """Drop every entry (and the references to their objects)."""
        self._entries.clear()
        self._bytes = 0

    def get(self, key: object) -> bytes | None:
        """The encoding stored for this very object, or None."""
        entry = self._entries.get(id(key))
        if entry is None or entry[0] is not key:
            return None
        self._entries.move_to_end(id(key))
        return entry[1]

    def put(self, key: object, data: bytes) -> None:
        """Store ``data`` for ``key``; the least recently used entries beyond the bounds go."""
        if len(data) > self.max_bytes:
            return
        old = self._entries.pop(id(key), None)
        if old is not None:
            self._bytes -= len(old[1])
        self._entries[id(key)] = (key, data)
        self._bytes += len(data)
        while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
            _, (_, evicted) = self._entries.popitem(last=False)
            self._bytes -= len(evicted)


@dataclass(slots=True, eq=False)
class EncodedPrefix(Generic[M]):
    """The encoded ``messages`` array of a list of messages, without its brackets.

    ``data`` is the non-empty encodings joined with commas; the last of them starts at ``last``
    and belongs to ``messages[last_index]`` (``-1`` when every encoding was empty).
    ``skipped`` are the messages whose encoding was empty, in order (Anthropic sends system
    messages apart). Read it at once: the store extends ``messages`` and ``skipped`` in place
    when a longer request of the same conversation comes.
    """

    messages: list[M]
    data: bytes = b""
    last: int = 0
    last_index: int = -1
    skipped: list[M] = field(default_factory=list)

    @property
    def size(self) -> int:
        """The memory the entry keeps, roughly: its encoding and the message objects it keeps
        alive (:data:`MESSAGE_COST` each)."""
        return len(self.data) + MESSAGE_COST * len(self.messages)


class EncodedPrefixes(Generic[M]):
    """The encoded ``messages`` array of each conversation a client is carrying on.

    A request's messages are looked up by their longest prefix the store has encoded, as the
    very same objects in the same order (an identity check in C, no encoding); only the rest
    are encoded, with ``encode``, and the prefix grows by them, so the encoding work of a
    request does not grow with the conversation. The entry of a prefix is replaced by the
    entry of the longer list, so a conversation holds one entry; one that forks from an
    earlier point is encoded afresh, as is a list whose head changed (history truncated, a
    message replaced). Bounded in entries and in bytes (the encodings and the messages they
    keep alive), least recently used first: a conversation in progress uses its entry at
    every step, so finished ones go first. The defaults hold a thousand conversations, or
    about 32 MiB of them. Messages must be immutable: a message's content edited in place
    after it was sent is not noticed.
    """

    def __init__(
        self,
        encode: Callable[[M], bytes],
        *,
        max_entries: int = 1024,
        max_bytes: int = 32 * 1024 * 1024,
    ) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._encode = encode
        # keyed by the id of a prefix's last message, which the entry keeps alive
        self._entries: OrderedDict[int, EncodedPrefix[M]] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def size(self) -> int:
        """The bytes held: encodings and message references."""
        return self._bytes

    def clear(self) -> None:
        """Drop every entry (and the references to their messages)."""
        self._entries.clear()
        self._bytes = 0

    def encoded(self, messages: Sequence[M]) -> EncodedPrefix[M]:
        """The encoding of ``messages``, from the longest stored prefix of them and the rest."""
        entries = self._entries
        end = len(messages)
        found: EncodedPrefix[M] | None = None
        while end:
            candidate = entries.get(id(messages[end - 1]))
            if (
                candidate is not None
                and len(candidate.messages) == end
                and all(map(operator.is_, candidate.messages, messages))
            ):
                found = candidate
                break
            end -= 1
        if found is not None and end == len(messages):
            entries.move_to_end(id(messages[-1]))
            return found
        new = messages[end:]
        chunks = [self._encode(message) for message in new]  # may raise: nothing changed yet
        if found is None:
            entry: EncodedPrefix[M] = EncodedPrefix(list(new))
        else:
            entry = found
            self._forget(id(messages[end - 1]), entry)
            entry.messages += new
        parts = [entry.data] if entry.data else []
        offset = len(entry.data) + 1 if entry.data else 0  # where the next encoding starts
        for index, (message, chunk) in enumerate(zip(new, chunks, strict=True), start=end):
            if not chunk:
                entry.skipped.append(message)
                continue
            parts.append(chunk)
            entry.last, entry.last_index = offset, index
            offset += len(chunk) + 1
        if entry.last_index >= end:  # something new to send
            entry.data = b",".join(parts)
        if messages:
            self._keep(id(messages[-1]), entry)
        return entry

    def _forget(self, key: int, entry: EncodedPrefix[M]) -> None:
        del self._entries[key]
        self._bytes -= entry.size

    def _keep(self, key: int, entry: EncodedPrefix[M]) -> None:
        size = entry.size
        if size > self.max_bytes:
            return
        old = self._entries.pop(key, None)
        if old is not None:
            self._bytes -= old.size
        self._entries[key] = entry
        self._bytes += size
        while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
            _, evicted = self._entries.popitem(last=False)
            self._bytes -= evicted.size

"""Secret redaction for everything that leaves the process: events, errors, logs and what is
stored. Every function replaces what it finds with :data:`REDACTED` and never raises.

:func:`redact_text` (known values and credential-looking substrings), :func:`redact` (a JSON
value for in-process events), :func:`redact_deep` (the stricter cleaning of what is published
or stored: JSON held in strings, ``password: ...`` assignments), :func:`redact_message` (one
text by those rules: an error's message on its way out) and :func:`scrub` (one given
secret, in an error message). :class:`RedactingFilter` (:func:`redact_logs`) cleans log records;
:func:`mask_url` and :func:`url_password` handle the password of a URL.

A secret of no familiar shape is redacted by value once registered (:func:`register_secret`,
:func:`registered_secrets`): process-wide, counted, thread-safe, at least
:data:`MIN_SECRET_LENGTH` characters. Values nest at most :data:`MAX_DEPTH` levels. What the
provider sees is never altered. ``docs/guide/secrets.md`` tells the whole story.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Final
from urllib.parse import parse_qsl, quote, quote_plus, unquote, urlencode, urlsplit, urlunsplit

from pydantic import JsonValue

__all__ = [
    "ASSIGNED_SECRET",
    "MAX_DEPTH",
    "MIN_SECRET_LENGTH",
    "REDACTED",
    "RedactingFilter",
    "known_secret_spans",
    "known_secret_words",
    "looks_secret",
    "mask_url",
    "needs_no_redaction",
    "redact",
    "redact_deep",
    "redact_logs",
    "redact_message",
    "redact_text",
    "register_secret",
    "registered_secrets",
    "scrub",
    "unregister_secret",
    "url_password",
]

REDACTED: Final = "[REDACTED]"

MIN_SECRET_LENGTH: Final = 8
"""The shortest value :func:`register_secret` accepts; shorter ones are refused."""

MAX_DEPTH: Final = 100
"""How deep values are walked: a container nested deeper becomes :data:`REDACTED`."""

# --- known secret values -----------------------------------------------------------------------

_PERCENT_ESCAPE: Final = re.compile(r"%[0-9A-F]{2}")


def _written_forms(value: str) -> set[str]:
    """``value`` as it is written in JSON strings and in URLs (either case of hex digits)."""
    forms = {value, json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1]}
    try:
        encoded = {quote(value, safe=""), quote(value), quote_plus(value, safe="")}
    except UnicodeEncodeError:  # a lone surrogate has no UTF-8 form, so no URL form either
        return forms
    forms |= encoded
    forms |= {_PERCENT_ESCAPE.sub(lambda m: m.group().lower(), form) for form in encoded}
    return forms


class _KnownSecrets:
    """A counted set of secret values and the tuple of their written forms, longest first.

    Writers hold the lock and publish a new tuple; readers take the current tuple without it.
    """

    __slots__ = ("_counts", "_forms", "_lock", "most_words")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self._forms: tuple[str, ...] = ()
        self.most_words = 0
        """The most whitespace-separated words a known value spans (0: none is known)."""

    def add(self, value: str | None) -> bool:
        if not value or len(value) < MIN_SECRET_LENGTH or value in REDACTED:
            return False
        with self._lock:
            count = self._counts.get(value, 0)
            self._counts[value] = count + 1
            if count == 0:
                self._publish()
        return True

    def discard(self, value: str | None) -> None:
        if not value:
            return
        with self._lock:
            count = self._counts.get(value, 0)
            if count > 1:
                self._counts[value] = count - 1
            elif count == 1:
                del self._counts[value]
                self._publish()

    def _publish(self) -> None:
        forms: set[str] = set()
        for value in self._counts:
            forms |= _written_forms(value)
        self._forms = tuple(sorted(forms, key=len, reverse=True))
        self.most_words = max((len(value.split()) for value in self._counts), default=0)

    def found_in(self, text: str) -> bool:
        """Whether any known form occurs in ``text``."""
        return any(form in text for form in self._forms)

    def redact(self, text: str) -> str:
        """``text`` with every run of characters that belong to a known form replaced."""
        forms = self._forms  # one snapshot: a registration may publish a new tuple meanwhile
        for form in forms:
            if form in text:
                break
        else:  # the common case: no secret at all
            return text
        spans = sorted(_spans(forms, text))
        pieces: list[str] = []
        done = 0  # text[:done] is in pieces
        run_start, run_end = spans[0]
        for start, stop in spans[1:]:
            if start > run_end:
                pieces += (text[done:run_start], REDACTED)
                done, run_start, run_end = run_end, start, stop
            else:
                run_end = max(run_end, stop)
        pieces += (text[done:run_start], REDACTED, text[run_end:])
        return "".join(pieces)

    def spans(self, text: str) -> list[tuple[int, int]]:
        """Where known forms occur in ``text``, as ``(start, stop)``, in no order."""
        return _spans(self._forms, text)


def _spans(forms: tuple[str, ...], text: str) -> list[tuple[int, int]]:
    spans: list[tuple[int, int]] = []
    for form in forms:
        start = text.find(form)
        while start >= 0:
            spans.append((start, start + len(form)))
            start = text.find(form, start + 1)
    return spans


_KNOWN: Final = _KnownSecrets()


def register_secret(value: str | None) -> bool:
    """Redact ``value`` by value from now on, wherever it appears, whatever its shape.

    Returns whether it is now redacted: ``None``, ``""``, a value shorter than
    :data:`MIN_SECRET_LENGTH` and a part of :data:`REDACTED` are refused (False). Registrations
    are counted: each must be matched by one :func:`unregister_secret`.
    """
    return _KNOWN.add(value)


def unregister_secret(value: str | None) -> None:
    """Undo one :func:`register_secret` of ``value``; a value not registered is ignored."""
    _KNOWN.discard(value)


def known_secret_spans(text: str) -> list[tuple[int, int]]:
    """Where registered secrets occur in ``text`` as it would be published, as ``(start,
    stop)`` pairs in no order: what a guard of streamed text must not cut through."""
    return _KNOWN.spans(text)


def known_secret_words() -> int:
    """The most whitespace-separated words a registered secret spans (0: none registered): a
    passphrase streamed word by word is whole only once that many words have come."""
    return _KNOWN.most_words


@contextmanager
def registered_secrets(*values: str | None) -> Iterator[None]:
    """Register ``values`` for the ``with`` block and unregister them after it."""
    accepted = [value for value in values if register_secret(value)]
    try:
        yield
    finally:
        for value in accepted:
            unregister_secret(value)


# --- patterns ------------------------------------------------------------------------------------

# Field names are compared normalised: lower-cased, without "-" and "_", so "x-api-key",
# "x_api_key", "X-Api-Key" and "xApiKey" are one name.
_SECRET_KEYS: Final = frozenset({"authorization", "proxyauthorization"})
_SECRET_SUFFIXES: Final = ("password", "passwd", "secret", "token", "apikey", "privatekey")

_SECRET_PATTERN: Final = re.compile(
    r"\bsk-[A-Za-z0-9_\-]{20,}"  # OpenAI-style and Anthropic (sk-ant-...) keys
    r"|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"  # GitHub tokens
    r"|\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s/:@]+:[^\s/@]+@[^\s]+"  # credentialed URLs
    r"|\beyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}"  # JWTs
    r"|\b(?:Bearer|Basic)\s+[A-Za-z0-9._~+/\-]{16,}=*"  # authorization values
)
# Substrings without which _SECRET_PATTERN cannot match: checking them is much cheaper than the
# pattern, which therefore runs only on texts that hold one. No match is shorter than 9.
_PATTERN_HINTS: Final = ("sk-", "://", "eyJ", "Bearer", "Basic")

ASSIGNED_SECRET: Final = re.compile(
    r"(?i)(\b[\w.-]*(?:password|passwd|secret|token|api[_-]?key|private[_-]?key|authorization)"
    r"[\"']?\s*[:=]\s*[\"']?(?:(?:basic|bearer|digest)\s+)?)"
    r"(?!\[REDACTED\])([^\s\"',;&}\]]+)"
)
"""``password: hunter2``, ``api_key="..."``, ``?token=...``: the name stays, the value goes.

``Authorization: Basic ...`` too (a header echoed in a text body, or logged): its scheme
stays, the credentials go, however short (the ``Basic``/``Bearer`` pattern wants 16 or more)."""


def _may_hold_pattern(text: str) -> bool:
    for hint in _PATTERN_HINTS:
        if hint in text:
            return True
    return "_" in text and ("gh" in text or "github_pat_" in text)


def _folded(text: str) -> str:
    """``text`` case-folded so that every letter a rule matches ignoring case is its ASCII
    letter: as ``casefold`` does, and the two "i"s it leaves apart (the dotless "ı", and the
    dotted "İ", which folds to "i" and a combining dot) made plain "i"s, as the rules take
    them."""
    folded = text.casefold()
    if "ı" in folded:
        folded = folded.replace("ı", "i")
    if "\u0307" in folded:
        folded = folded.replace("i\u0307", "i")
    return folded


def _may_hold_assignment(text: str) -> bool:
    """False only if :data:`ASSIGNED_SECRET` cannot match ``text``.

    Case-folded (:func:`_folded`), every letter the pattern matches ignoring case is its
    ASCII letter.
    """
    if ":" not in text and "=" not in text:
        return False
    folded = _folded(text)
    return (
        "passw" in folded
        or "secret" in folded
        or "token" in folded
        or ("key" in folded and ("api" in folded or "private" in folded))
        or "authorization" in folded
    )


def _is_secret_key(key: str) -> bool:
    # Field names repeat, so short ones are remembered; long ones (any size) are not kept.
    return _is_secret_name(key) if len(key) <= 64 else _is_secret_name.__wrapped__(key)


@functools.lru_cache(maxsize=4096)
def _is_secret_name(key: str) -> bool:
    name = key.lower().replace("-", "").replace("_", "")
    return name in _SECRET_KEYS or name.endswith(_SECRET_SUFFIXES)


def looks_secret(text: str) -> bool:
    """Whether ``text`` holds a known secret value or something that looks like a credential."""
    return redact_text(text) != text


def redact_text(text: str) -> str:
    """``text`` with known secret values and credential-looking substrings replaced."""
    if len(text) < MIN_SECRET_LENGTH:
        return text
    text = _KNOWN.redact(text)
    if _may_hold_pattern(text):
        text = _SECRET_PATTERN.sub(REDACTED, text)
    return text


def _redact_prose(text: str) -> str:
    """:func:`redact_text`, and the values of ``name: value`` assignments of secret names."""
    text = redact_text(text)
    if _may_hold_assignment(text):
        text = ASSIGNED_SECRET.sub(lambda m: m.group(1) + REDACTED, text)
    return text


# --- values ------------------------------------------------------------------------------------


def redact(value: JsonValue) -> JsonValue:
    """A copy of a JSON value with secret-named fields and secrets in strings and names redacted."""
    return _walk(value, json_in_strings=False)


def redact_deep(value: JsonValue) -> JsonValue:
    """A copy of a JSON value cleaned of secrets everywhere, for what is published or stored.

    Secret-named fields and secrets in strings (and in field names) become ``[REDACTED]`` as in
    :func:`redact`; a string holding a JSON object, array or string (a tool's result, encoded)
    is redacted as JSON, and stays byte-for-byte the same when nothing in it is secret (one
    nested deeper than :data:`MAX_DEPTH` is cleaned as text); ``name: value`` assignments of
    secret names in text lose their value.
    """
    return _walk(value, json_in_strings=True)


_JSON_OPENERS: Final = {"{": "}", "[": "]", '"': '"'}
_COMPACT: Final[dict[str, Any]] = {"ensure_ascii": False, "separators": (",", ":")}
_NOT_JSON: Final = object()
_CONTAINERS: Final = (dict, list, tuple)
_SHORTEST_MATCH: Final = len("token=x")
"""No rule matches a shorter text: shorter strings are kept without a look."""


def _parsed_json(text: str) -> object:
    """The JSON value ``text`` holds if it is an object, array or string, else ``_NOT_JSON``."""
    stripped = text.strip()
    if not (stripped[:1] in _JSON_OPENERS and stripped[-1:] == _JSON_OPENERS[stripped[0]]):
        return _NOT_JSON
    try:
        return json.loads(stripped)
    except (ValueError, RecursionError):
        return _NOT_JSON


class _Reencode:
    """A step of the walk: put back a string whose JSON was walked, once its walk is done."""

    __slots__ = ("changes", "cleaned", "overflows", "text")

    def __init__(self, text: str, changes: int, overflows: int) -> None:
        self.text = text
        self.changes = changes
        self.overflows = overflows
        self.cleaned: list[Any] = [None]


def _walk(value: object, *, json_in_strings: bool) -> JsonValue:
    """A cleaned copy of ``value``, walked with a stack of its own (no recursion).

    A step ``(item, where, slot, depth)`` cleans ``item`` into ``where[slot]``; strings that
    hold no JSON are cleaned on the spot. Counting changes and overflows tells whether the JSON
    held in a string was changed (then it is re-encoded) or nested too deep (then the string is
    cleaned as text).
    """
    clean: Callable[[str], str] = _redact_prose if json_in_strings else redact_text
    top: list[Any] = [None]
    stack: list[tuple[object, Any, Any, int]] = [(value, top, 0, 0)]
    changes = overflows = 0
    while stack:
        item, where, slot, depth = stack.pop()
        if isinstance(item, str):
            parsed = _parsed_json(item) if json_in_strings and depth < MAX_DEPTH else _NOT_JSON
            if parsed is _NOT_JSON:
                cleaned = clean(item)
                changes += cleaned != item
                where[slot] = cleaned
            else:
                step = _Reencode(item, changes, overflows)
                stack += ((step, where, slot, depth), (parsed, step.cleaned, 0, depth + 1))
            continue
        if isinstance(item, _Reencode):
            changes, overflows, where[slot] = _reencoded(item, changes, overflows)
            continue
        if not isinstance(item, _CONTAINERS):
            where[slot] = item
            continue
        if depth >= MAX_DEPTH:
            where[slot] = REDACTED
            changes += 1
            overflows += 1
            continue
        copy: Any
        if isinstance(item, dict):
            copy = {}
            children: Any = item.items()
        else:
            copy = list(item)
            children = enumerate(copy)
        where[slot] = copy
        for key, child in children:
            name = key
            if copy.__class__ is dict and isinstance(key, str):
                if len(key) >= _SHORTEST_MATCH:
                    name = redact_text(key)
                    changes += name != key
                if child is not None and _is_secret_key(key):
                    copy[name] = REDACTED
                    changes += child != REDACTED
                    continue
            copy[name] = child
            if isinstance(child, str):
                if len(child) < _SHORTEST_MATCH:
                    continue
                if json_in_strings and (child[0] in _JSON_OPENERS or child[0].isspace()):
                    stack.append((child, copy, name, depth + 1))
                    continue
                cleaned = clean(child)
                changes += cleaned != child
                copy[name] = cleaned
            elif isinstance(child, _CONTAINERS):
                stack.append((child, copy, name, depth + 1))
    result: JsonValue = top[0]
    return result


def needs_no_redaction(*documents: str) -> bool:
    """Whether :func:`redact_deep` certainly leaves every value of each JSON document
    (``documents``, one or more) as it is, so each may be published as written; False means
    "clean them" (one by one: asking of them together costs one look, not one each).

    A cheap look at the text, never a parse. Escapes of one character (``\\"``, ``\\n``, ...:
    a quote in a string, JSON held in a string such as a tool's result) are undone first, so
    that every key and string (and what JSON held in a string holds) stands in the text as it
    reads; a document with any other escape (``\\u``, or an escaped backslash: JSON held in
    JSON held in a string) or nested deeply is always cleaned. Each rule of the walk is then
    asked of the whole text at once, more strictly than of one string: a known secret
    anywhere, a credential pattern or a ``name: value`` assignment anywhere, or a key whose
    name ends like a secret's, all mean "clean it".
    """
    texts: list[str] = []
    for document in documents:
        if document.count("{") + document.count("[") >= MAX_DEPTH:
            return False
        if "\\" in document:
            unescaped = _unescaped(document)
            if unescaped is None:
                return False
            document = unescaped
        texts.append(document)
    text = _APART.join(texts)
    if _KNOWN.found_in(text):
        return False
    if _may_hold_pattern(text) and _SECRET_PATTERN.search(text):
        return False
    folded = _folded(text)  # every letter the rules match ignoring case is ASCII now
    if any(assignment.search(folded) for assignment in _ASSIGNMENTS):
        return False
    names = folded.replace("-", "").replace("_", "")
    return all(end not in names for end in _SECRET_NAME_ENDS)


_ONE_CHARACTER_ESCAPES: Final = (
    ('\\"', '"'),
    ("\\n", "\n"),
    ("\\r", "\r"),
    ("\\t", "\t"),
    ("\\b", "\b"),
    ("\\f", "\f"),
    ("\\/", "/"),
)
_APART: Final = "\x1f"
"""What keeps documents apart in one look: a control character, which JSON text holds only
escaped (a match across two documents only sends them the slow way)."""


def _unescaped(document: str) -> str | None:
    """``document`` with its escapes of one character undone, or ``None`` if it holds any
    other (a ``\\u`` escape, or an escaped backslash, after which one level of undoing no
    longer shows a string as it reads)."""
    if "\\\\" in document or "\\u" in document:
        return None
    for escape, character in _ONE_CHARACTER_ESCAPES:
        if escape in document:
            document = document.replace(escape, character)
    return None if "\\" in document else document


_ASSIGNMENTS: Final = tuple(
    re.compile(name + r"[\"']?\s*[:=]")
    for name in (
        r"passw(?:or)?d",
        "secret",
        "token",
        r"api[_-]?key",
        r"private[_-]?key",
        "authorization",
    )
)
"""What every match of :data:`ASSIGNED_SECRET` holds, in case-folded text, one pattern per
name: found much faster, with no open-ended start to try at every word, and each pattern
starts with a fixed letter the regex engine looks for alone (one pattern of alternatives is
tried at every letter of the text)."""
_SECRET_NAME_ENDS: Final = tuple(f'{name}"' for name in (*_SECRET_SUFFIXES, *_SECRET_KEYS))
"""How the name of a secret field ends in a document, normalised: followed by its quote."""


def _reencoded(step: _Reencode, changes: int, overflows: int) -> tuple[int, int, str]:
    """The counters after ``step``'s string is put back, and the string to put back."""
    text = step.text
    if overflows == step.overflows:
        if changes == step.changes:
            return changes, overflows, text
        try:
            return changes, overflows, json.dumps(step.cleaned[0], **_COMPACT)
        except (ValueError, RecursionError):
            pass
    cleaned = _redact_prose(text)
    return step.changes + (cleaned != text), step.overflows, cleaned


def scrub(text: str, secret: str | None) -> str:
    """``text`` with every occurrence of ``secret`` and of the known secrets replaced.

    Unlike :func:`redact_text` this knows the exact secret, so it also catches keys of a shape
    no pattern expects (a proxy's own tokens, say). No secret (None or ``""``) leaves only the
    known ones to replace.
    """
    if secret and secret in text:
        text = text.replace(secret, REDACTED)
    return _KNOWN.redact(text)


# --- logs ----------------------------------------------------------------------------------------

_RECORD_FIELDS: Final = frozenset(
    logging.LogRecord("", 0, "", 0, "", None, None).__dict__.keys() | {"message", "asctime"}
)


class RedactingFilter(logging.Filter):
    """Redacts log records, with the text rules of :func:`redact_deep`.

    The message is formatted first (so secrets in arguments of any type are caught) and
    replaces ``msg`` (``args`` become empty); a traceback is formatted into ``exc_text`` and
    redacted, and so is ``stack_info``; string, list and dict fields added with ``extra=`` go
    through :func:`redact_deep`. The record is always let through.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a broken format string: keep the template, drop the arguments
            message = str(record.msg) if isinstance(record.msg, str) else "<unformattable>"
        record.msg, record.args = redact_message(message), ()
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact_message(record.exc_text)
        if record.stack_info:
            record.stack_info = redact_message(record.stack_info)
        for name, field in list(record.__dict__.items()):
            if name not in _RECORD_FIELDS and isinstance(field, str | list | dict):
                record.__dict__[name] = redact_deep(field)
        return True


def redact_message(text: str) -> str:
    """``text`` cleaned as :func:`redact_deep` cleans a string: what leaves the process as
    text (an error in a problem response, a health report, a span, a log line) gets the rules
    of what is published or stored, ``password: ...`` and ``"api_key": "..."`` included, not
    only :func:`redact_text`'s patterns."""
    cleaned = redact_deep(text)
    return cleaned if isinstance(cleaned, str) else text


def redact_logs(*targets: logging.Logger | logging.Handler | str) -> None:
    """Install one :class:`RedactingFilter` on each logger (or logger name) and handler.

    A logger's filters see only the records logged on that very logger, not those of its
    children: to cover a whole tree (``agent_plugin``, ``httpx``, ...) install the filter on the
    handlers. Installing twice on one target adds nothing.
    """
    for target in targets:
        where = logging.getLogger(target) if isinstance(target, str) else target
        if not any(isinstance(f, RedactingFilter) for f in where.filters):
            where.addFilter(RedactingFilter())


# --- passwords in URLs -------------------------------------------------------------------------

_MASK: Final = "***"


def mask_url(url: str) -> str:
    """``url`` with its password (``user:pass@`` or a ``password=`` query value) masked as ``***``.

    Safe for logs and reprs; a string that is not a URL comes back unchanged.
    """
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return url
    netloc = parts.netloc
    if password:
        userinfo, _, host = netloc.rpartition("@")
        user = userinfo.partition(":")[0]
        netloc = f"{user}:{_MASK}@{host}"
    query = parts.query
    pairs = parse_qsl(query, keep_blank_values=True)
    if any(key.lower() == "password" for key, _ in pairs):
        query = urlencode(
            [(key, _MASK if key.lower() == "password" else value) for key, value in pairs],
            safe="*",
        )
    if netloc == parts.netloc and query == parts.query:
        return url
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def url_password(url: str | None) -> str | None:
    """The password of ``url`` (``user:password@`` or a ``password=`` query value), decoded,
    or ``None``."""
    if not url:
        return None
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return None
    if password:
        return unquote(password)
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key.lower() == "password" and value:
            return value
    return None

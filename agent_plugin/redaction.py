"""Secret redaction for everything that leaves the process: events, errors, logs and what is
stored [OP-35].

Three tools, one marker (:data:`REDACTED`):

- :func:`redact` cleans tool arguments for in-process events: values of secret-named fields and
  strings that look like credentials become ``"[REDACTED]"``.
- :func:`redact_deep` is the stricter cleaning of everything that is published or stored (event
  streams, the database): on top of :func:`redact` it looks into JSON held in strings (a tool
  result) and drops the values of ``password: ...`` / ``api_key=...`` assignments in text.
- :func:`scrub` removes one known secret (the provider API key) from a text, such as an error
  message built from what a server echoed back.

What the provider sees is never altered: redaction applies to copies that leave the run.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Final

from pydantic import JsonValue

__all__ = [
    "ASSIGNED_SECRET",
    "REDACTED",
    "looks_secret",
    "redact",
    "redact_deep",
    "redact_text",
    "scrub",
]

REDACTED: Final = "[REDACTED]"

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
# pattern, which therefore runs only on texts that hold one.
_PATTERN_HINTS: Final = ("sk-", "://", "eyJ", "Bearer", "Basic")

ASSIGNED_SECRET: Final = re.compile(
    r"(?i)(\b[\w.-]*(?:password|passwd|secret|token|api[_-]?key|private[_-]?key)"
    r"[\"']?\s*[:=]\s*[\"']?)"
    r"(?!\[REDACTED\])([^\s\"',;&}\]]+)"
)
"""``password: hunter2``, ``api_key="..."``, ``?token=...``: the name stays, the value goes."""


def _may_hold_pattern(text: str) -> bool:
    for hint in _PATTERN_HINTS:
        if hint in text:
            return True
    return "_" in text and ("gh" in text or "github_pat_" in text)


def _may_hold_assignment(text: str) -> bool:
    """False only if :data:`ASSIGNED_SECRET` cannot match ``text``.

    Case-folded, every letter the pattern matches ignoring case is its ASCII letter, except the
    dotless "ı" (which the pattern takes for "i"), hence the one replacement.
    """
    if ":" not in text and "=" not in text:
        return False
    folded = text.casefold()
    if "ı" in folded:
        folded = folded.replace("ı", "i")
    return (
        "passw" in folded
        or "secret" in folded
        or "token" in folded
        or ("key" in folded and ("api" in folded or "private" in folded))
    )


def _is_secret_key(key: str) -> bool:
    name = key.lower().replace("-", "").replace("_", "")
    return name in _SECRET_KEYS or name.endswith(_SECRET_SUFFIXES)


def looks_secret(text: str) -> bool:
    """Whether ``text`` holds something that looks like a credential."""
    return _may_hold_pattern(text) and _SECRET_PATTERN.search(text) is not None


def redact_text(text: str) -> str:
    """``text`` with every credential-looking substring replaced by ``[REDACTED]``."""
    return _SECRET_PATTERN.sub(REDACTED, text) if _may_hold_pattern(text) else text


def redact(value: JsonValue) -> JsonValue:
    """A copy of a JSON value with secret-named fields and credential strings redacted."""
    return _redacted(value, redact_text)


def redact_deep(value: JsonValue) -> JsonValue:
    """A copy of a JSON value cleaned of secrets everywhere, for what is published or stored.

    Secret-named fields and credential-looking strings become ``[REDACTED]`` as in
    :func:`redact`; a string holding a JSON object, array or string (a tool's result, encoded)
    is redacted as JSON, and stays byte-for-byte the same when nothing in it is secret;
    ``name: value`` assignments of secret names in text lose their value.
    """
    return _redacted(value, _redact_string)


def _redacted(value: JsonValue, clean: Callable[[str], str]) -> JsonValue:
    """``value`` with secret-named fields redacted and every other string ``clean``-ed."""
    if isinstance(value, str):
        return clean(value)
    if isinstance(value, dict):
        return {
            key: REDACTED if _is_secret_key(key) and item is not None else _redacted(item, clean)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [_redacted(item, clean) for item in value]
    return value


_JSON_OPENERS: Final = {"{": "}", "[": "]", '"': '"'}


def _redact_string(text: str) -> str:
    stripped = text.strip()
    if stripped[:1] in _JSON_OPENERS and stripped[-1:] == _JSON_OPENERS[stripped[0]]:
        try:
            parsed: JsonValue = json.loads(stripped)
        except ValueError:
            pass
        else:
            cleaned = redact_deep(parsed)
            if cleaned == parsed:
                return text
            return json.dumps(cleaned, ensure_ascii=False, separators=(",", ":"))
    text = redact_text(text)
    if _may_hold_assignment(text):
        text = ASSIGNED_SECRET.sub(lambda m: m.group(1) + REDACTED, text)
    return text


def scrub(text: str, secret: str | None) -> str:
    """``text`` with every occurrence of ``secret`` replaced by ``[REDACTED]``.

    Unlike :func:`redact_text` this knows the exact secret, so it also catches keys of a shape
    no pattern expects (a proxy's own tokens, say). No secret (None or ``""``) changes nothing.
    """
    if secret and secret in text:
        return text.replace(secret, REDACTED)
    return text

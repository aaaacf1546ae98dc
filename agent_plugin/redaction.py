"""Secret redaction for everything that leaves the process as an event, an error or a log [OP-35].

Two tools, one marker (:data:`REDACTED`):

- :func:`redact` cleans tool arguments for events: values of secret-named fields and strings that
  look like credentials become ``"[REDACTED]"``. Provider-facing content (tool results, assistant
  text) is never altered.
- :func:`scrub` removes one known secret (the provider API key) from a text, such as an error
  message built from what a server echoed back.
"""

from __future__ import annotations

import re
from typing import Final

from pydantic import JsonValue

__all__ = ["REDACTED", "looks_secret", "redact", "redact_text", "scrub"]

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


def _is_secret_key(key: str) -> bool:
    name = key.lower().replace("-", "").replace("_", "")
    return name in _SECRET_KEYS or name.endswith(_SECRET_SUFFIXES)


def looks_secret(text: str) -> bool:
    """Whether ``text`` holds something that looks like a credential."""
    return _SECRET_PATTERN.search(text) is not None


def redact_text(text: str) -> str:
    """``text`` with every credential-looking substring replaced by ``[REDACTED]``."""
    return _SECRET_PATTERN.sub(REDACTED, text)


def redact(value: JsonValue) -> JsonValue:
    """A copy of a JSON value with secret-named fields and credential strings redacted."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {
            key: REDACTED if _is_secret_key(key) and item is not None else redact(item)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [redact(item) for item in value]
    return value


def scrub(text: str, secret: str | None) -> str:
    """``text`` with every occurrence of ``secret`` replaced by ``[REDACTED]``.

    Unlike :func:`redact_text` this knows the exact secret, so it also catches keys of a shape
    no pattern expects (a proxy's own tokens, say). No secret (None or ``""``) changes nothing.
    """
    if secret and secret in text:
        return text.replace(secret, REDACTED)
    return text

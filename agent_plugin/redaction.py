"""Secret redaction for everything that leaves the process as an event or a log [OP-35].

Tool arguments in events pass through :func:`redact`: values of secret-named fields and
strings that look like credentials become ``"[REDACTED]"``. Provider-facing content (tool
results, assistant text) is never altered.
"""

from __future__ import annotations

import re
from typing import Final

from pydantic import JsonValue

__all__ = ["REDACTED", "looks_secret", "redact", "redact_text"]

REDACTED: Final = "[REDACTED]"

_SECRET_KEYS: Final = frozenset(
    {
        "password",
        "passwd",
        "secret",
        "token",
        "api_key",
        "apikey",
        "api-key",
        "private_key",
        "access_token",
        "refresh_token",
        "authorization",
        "proxy-authorization",
        "client_secret",
        "x-api-key",
    }
)

_SECRET_PATTERN: Final = re.compile(
    r"\bsk-ant-[A-Za-z0-9_\-]{20,}"  # Anthropic keys
    r"|\bsk-[A-Za-z0-9_\-]{20,}"  # OpenAI-style keys
    r"|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"  # GitHub tokens
    r"|\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s/:@]+:[^\s/@]+@[^\s]+"  # credentialed URLs
    r"|\beyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}"  # JWTs
    r"|\b(?:Bearer|Basic)\s+[A-Za-z0-9._~+/\-]{16,}=*"  # authorization values
)


def _is_secret_key(key: str) -> bool:
    lowered = key.lower()
    return lowered in _SECRET_KEYS or lowered.endswith(("_password", "_secret", "_token"))


def looks_secret(text: str) -> bool:
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

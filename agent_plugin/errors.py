"""Errors are values with a kind; the HTTP status an app should answer derives from the kind."""

from __future__ import annotations

from enum import StrEnum
from typing import Final

from pydantic import BaseModel, ConfigDict

from agent_plugin.redaction import redact_message

__all__ = [
    "BODY_LIMIT",
    "AgentError",
    "ErrorInfo",
    "ErrorKind",
    "PrefixLocked",
    "SessionLocked",
    "SessionTaken",
    "describe",
]

BODY_LIMIT: Final = 500
"""At most this many characters of a provider's error body are kept in an error."""


class ErrorKind(StrEnum):
    CONFIG = "config"
    AUTHENTICATION = "authentication"
    RATE_LIMITED = "rate_limited"
    PROVIDER = "provider"
    TRANSPORT = "transport"
    UNAVAILABLE = "unavailable"
    TOOL = "tool"
    BUDGET = "budget"
    DECODE = "decode"
    CONFLICT = "conflict"
    NOT_FOUND = "not_found"
    INTERNAL = "internal"
    """An unexpected failure in the app's own code (a hook or a policy raised)."""
    OUT_OF_CREDIT = "out_of_credit"
    """The provider account has no credit left (OpenAI ``insufficient_quota``, HTTP 402):
    asking again does not help until someone pays."""
    CONTEXT_TOO_LONG = "context_too_long"
    """The conversation is longer than the model's context window: shorten it (compact, drop
    history) before asking again."""
    STREAM_INTERRUPTED = "stream_interrupted"
    """A streamed reply broke off after part of it had been delivered. The part was not kept
    (it is in no transcript); the whole call can be made again."""
    INVALID = "invalid"
    """A value is not acceptable as it is (a request breaks a limit, or data cannot be
    stored): it must change before it is tried again."""

    @property
    def display_name(self) -> str:
        """The seed's display name: ``rate_limited`` -> ``RateLimited``."""
        return "".join(word.capitalize() for word in self.value.split("_"))

    @property
    def http_status(self) -> int:
        return _HTTP_STATUS[self]

    @property
    def retryable(self) -> bool:
        """Worth trying again later: the provider was busy, down or unreachable, or a stream
        broke off midway."""
        return self in _RETRYABLE

    @classmethod
    def from_http_status(cls, status: int) -> ErrorKind:
        """Classify a provider's non-2xx HTTP status."""
        if status in (401, 403):
            return cls.AUTHENTICATION
        if status == 429:
            return cls.RATE_LIMITED
        if status == 413:
            return cls.BUDGET
        if status in (408, 425) or 500 <= status <= 599:
            return cls.UNAVAILABLE
        return cls.PROVIDER


_HTTP_STATUS: Final[dict[ErrorKind, int]] = {
    ErrorKind.CONFIG: 500,
    ErrorKind.AUTHENTICATION: 502,
    ErrorKind.RATE_LIMITED: 429,
    ErrorKind.PROVIDER: 502,
    ErrorKind.TRANSPORT: 503,
    ErrorKind.UNAVAILABLE: 503,
    ErrorKind.TOOL: 500,
    ErrorKind.BUDGET: 413,
    ErrorKind.DECODE: 500,
    ErrorKind.CONFLICT: 409,
    ErrorKind.NOT_FOUND: 404,
    ErrorKind.INTERNAL: 500,
    # the app's provider account is out of credit: the service is unavailable, and the app's
    # own client is not the one who must pay (402 would tell it so)
    ErrorKind.OUT_OF_CREDIT: 503,
    ErrorKind.CONTEXT_TOO_LONG: 413,
    ErrorKind.STREAM_INTERRUPTED: 503,
    ErrorKind.INVALID: 422,
}

_RETRYABLE: Final = frozenset(
    {
        ErrorKind.RATE_LIMITED,
        ErrorKind.UNAVAILABLE,
        ErrorKind.TRANSPORT,
        ErrorKind.STREAM_INTERRUPTED,
    }
)


class ErrorInfo(BaseModel):
    """An :class:`AgentError` as plain data: in job results, run records, events, HTTP bodies."""

    model_config = ConfigDict(frozen=True)

    kind: ErrorKind
    message: str
    provider: str | None = None
    status: int | None = None
    retry_after: float | None = None


class AgentError(Exception):
    """The one exception type the library raises.

    Provider errors also carry the provider's name, the HTTP status, the server's
    ``Retry-After`` in seconds when it sent one, and at most :data:`BODY_LIMIT` characters of the
    response body. API keys never appear in any of them.
    """

    def __init__(
        self,
        kind: ErrorKind,
        message: str,
        *,
        provider: str | None = None,
        status: int | None = None,
        retry_after: float | None = None,
        body: str | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = ErrorKind(kind)
        self.message = message
        self.provider = provider
        self.status = status
        self.retry_after = retry_after
        self.body = body[:BODY_LIMIT] if body is not None else None

    def __str__(self) -> str:
        return f"[{self.kind.display_name}] {self.message}"

    def __repr__(self) -> str:
        return f"AgentError(kind={self.kind.value!r}, message={self.message!r})"

    @property
    def http_status(self) -> int:
        """The status an app should answer when this error ends a request."""
        return self.kind.http_status

    @property
    def retryable(self) -> bool:
        return self.kind.retryable

    def info(self) -> ErrorInfo:
        """The error as plain data (never the key: messages are scrubbed where they are made)."""
        return ErrorInfo(
            kind=self.kind,
            message=self.message,
            provider=self.provider,
            status=self.status,
            retry_after=self.retry_after,
        )

    @classmethod
    def from_info(cls, info: ErrorInfo) -> AgentError:
        return cls(
            info.kind,
            info.message,
            provider=info.provider,
            status=info.status,
            retry_after=info.retry_after,
        )

    @classmethod
    def config(cls, message: str) -> AgentError:
        return cls(ErrorKind.CONFIG, message)

    @classmethod
    def decode(cls, message: str, *, provider: str | None = None) -> AgentError:
        return cls(ErrorKind.DECODE, message, provider=provider)

    @classmethod
    def tool(cls, message: str) -> AgentError:
        return cls(ErrorKind.TOOL, message)


class SessionTaken(AgentError):
    """A run of a session was not started because another run of the session is in progress
    (the database allows one at a time): wait for the session's turn. Kind ``conflict``."""

    def __init__(self, run_id: str) -> None:
        super().__init__(
            ErrorKind.CONFLICT,
            f"run {run_id} cannot start: another run of its session is in progress",
        )
        self.run_id = run_id


class PrefixLocked(AgentError):
    """A change to what a locked agent keeps fixed (its system prompt, its tools, the history
    its runs send): refused, so provider prompt caches keep hitting. Kind ``conflict``."""

    def __init__(self, what: str) -> None:
        super().__init__(
            ErrorKind.CONFLICT,
            f"{what}: the agent is locked (its prompt prefix is fixed); unlock() it first, "
            "accepting that the provider's prompt cache starts over",
        )


class SessionLocked(AgentError):
    """A change to what a locked session keeps fixed (the system prompt and tools its runs
    bring, the history up to the lock): refused, so prompt caches keep hitting. Kind
    ``conflict``."""

    def __init__(self, session_id: str, what: str) -> None:
        super().__init__(
            ErrorKind.CONFLICT,
            f"{what}: session {session_id!r} is locked (its prompt prefix is fixed); unlock it "
            "first, accepting that the provider's prompt cache starts over",
        )


def describe(error: BaseException) -> str:
    """One line about ``error`` for a log or a tool's error: an :class:`AgentError`'s message,
    else the exception's type and text; redacted as published text is
    (:func:`~agent_plugin.redaction.redact_message`: a provider's or a tool's error may say
    ``password: ...``, which the credential patterns alone let through)."""
    if isinstance(error, AgentError):
        return redact_message(error.message)
    text = redact_message(str(error))
    return f"{type(error).__name__}: {text}" if text else type(error).__name__

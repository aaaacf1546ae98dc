"""What a provider's error says: its kind from the HTTP status *and* the error body.

A status alone misleads: OpenAI answers 429 both for a rate limit (wait and retry) and for an
account without credit (``insufficient_quota``: retrying never helps), and a context window
overflow is a plain 400 everywhere. :func:`failure_kind` reads the codes and messages of the
error shapes real servers send (OpenAI's ``{"error": {"code", "type", "message"}}``,
Anthropic's ``{"type": "error", "error": {...}}``, OpenRouter's numeric codes with
``metadata.raw``, vLLM's and Mistral's top-level ``object: "error"``) and
:func:`failure_note` says in words what the kind means for the operator. Both clients use them
for errors answered with a status and for errors reported inside a 200 body or a stream.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Final

from agent_plugin.errors import ErrorKind

__all__ = ["failure_kind", "failure_note"]

# error codes and types that name the cause outright
_OUT_OF_CREDIT_CODES: Final = frozenset({"insufficient_quota", "insufficient_balance"})
_CONTEXT_CODES: Final = frozenset(
    {"context_length_exceeded", "context_window_exceeded", "exceed_context_size_error"}
)

# phrases of the messages servers send (compared in lower case). Gemini's per-minute quota 429
# also says "you exceeded your current quota": that one is a rate limit, so OpenAI's quota
# exhaustion is recognised by its code, never by that phrase.
_OUT_OF_CREDIT_PHRASES: Final = (
    "credit balance is too low",  # Anthropic
    "insufficient balance",  # DeepSeek
    "insufficient credits",  # OpenRouter
)
_CONTEXT_PHRASES: Final = (
    "prompt is too long",  # Anthropic
    "maximum context length",  # OpenAI (older models), vLLM, DeepSeek, OpenRouter, Mistral
    "context length exceeded",
    "exceeds the context window",  # OpenAI
    "exceeds the available context size",  # llama.cpp server
)

_PAYMENT_REQUIRED: Final = 402

_NOTES: Final[Mapping[ErrorKind, str]] = {
    ErrorKind.OUT_OF_CREDIT: "the provider account is out of credit; add credit or raise its "
    "spending limit, retrying will not help",
    ErrorKind.CONTEXT_TOO_LONG: "the conversation is longer than the model's context window",
}


def failure_kind(status: int | None, body: object) -> ErrorKind:
    """The kind of a provider error with HTTP ``status`` (None: reported inside a 200 answer)
    and ``body`` (the response text, or the error payload already parsed).

    402 Payment Required is out of credit; authentication (401, 403) and server failures (5xx)
    keep their status kind; for the other statuses the body decides between out of credit,
    context too long and the status kind.
    """
    if status == _PAYMENT_REQUIRED:  # DeepSeek, OpenRouter: the account has no credit left
        return ErrorKind.OUT_OF_CREDIT
    kind = ErrorKind.PROVIDER if status is None else ErrorKind.from_http_status(status)
    if kind in (ErrorKind.AUTHENTICATION, ErrorKind.UNAVAILABLE):
        return kind
    codes, messages = _read(body)
    if codes & _OUT_OF_CREDIT_CODES or _says(messages, _OUT_OF_CREDIT_PHRASES):
        return ErrorKind.OUT_OF_CREDIT
    if kind is ErrorKind.RATE_LIMITED:
        return kind
    if codes & _CONTEXT_CODES or _says(messages, _CONTEXT_PHRASES):
        return ErrorKind.CONTEXT_TOO_LONG
    return kind


def failure_note(kind: ErrorKind) -> str | None:
    """What ``kind`` means for whoever runs the app, for an error message (None: nothing)."""
    return _NOTES.get(kind)


def _says(messages: list[str], phrases: tuple[str, ...]) -> bool:
    return any(phrase in message for message in messages for phrase in phrases)


def _read(body: object) -> tuple[set[str], list[str]]:
    """The codes/types (lower case) and the messages (lower case) in an error body."""
    if isinstance(body, str | bytes):
        try:
            body = json.loads(body)
        except (ValueError, RecursionError):
            return set(), [body.lower() if isinstance(body, str) else ""]
    codes: set[str] = set()
    messages: list[str] = []
    for node in _error_objects(body):
        for key in ("code", "type"):
            value = node.get(key)
            if isinstance(value, str):
                codes.add(value.lower())
        message = node.get("message")
        if isinstance(message, str):
            messages.append(message.lower())
        elif message is not None:  # Mistral nests its validation detail here
            messages.append(json.dumps(message).lower())
        metadata = node.get("metadata")
        raw = metadata.get("raw") if isinstance(metadata, dict) else None
        if isinstance(raw, str):  # OpenRouter: the upstream provider's own error text
            messages.append(raw.lower())
    return codes, messages


def _error_objects(body: object) -> Iterator[Mapping[str, object]]:
    """The body and the ``error`` object inside it (a string ``error`` counts as a message)."""
    if not isinstance(body, dict):
        if isinstance(body, str):
            yield {"message": body}
        return
    yield body
    nested = body.get("error")
    if isinstance(nested, dict):
        yield nested
    elif isinstance(nested, str):
        yield {"message": nested}

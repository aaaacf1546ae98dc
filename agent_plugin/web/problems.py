"""Errors as RFC 9457 problem details: an :class:`~agent_plugin.errors.AgentError` answers
``application/problem+json`` with the status of its kind."""

from __future__ import annotations

import logging
import math
from typing import Any, Final

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from agent_plugin.errors import AgentError

__all__ = ["PROBLEM_TYPE_PREFIX", "agent_error_handler", "problem_response"]

logger = logging.getLogger("agent_plugin")

PROBLEM_TYPE_PREFIX: Final = "tag:fastapi-agent-plugin,2025:error/"
"""The ``type`` of a problem body is this prefix plus the error's kind (a ``tag:`` URI, RFC
4151: a problem type that is not meant to be dereferenced)."""


def problem_response(error: AgentError) -> JSONResponse:
    """The problem response for ``error``: ``type``, ``title``, ``status``, ``detail`` (the
    message; never a key) and ``kind``, plus ``provider`` and ``retry_after`` (with a
    ``Retry-After`` header) when known."""
    kind = error.kind
    body: dict[str, Any] = {
        "type": PROBLEM_TYPE_PREFIX + kind.value,
        "title": kind.display_name,
        "status": kind.http_status,
        "detail": error.message,
        "kind": kind.value,
    }
    headers: dict[str, str] = {}
    if error.provider is not None:
        body["provider"] = error.provider
    if error.retry_after is not None:
        body["retry_after"] = error.retry_after
        headers["retry-after"] = str(max(0, math.ceil(error.retry_after)))
    return JSONResponse(
        body,
        status_code=kind.http_status,
        headers=headers,
        media_type="application/problem+json",
    )


async def agent_error_handler(request: Request, error: Exception) -> Response:
    """The exception handler ``AgentPlugin.install`` registers for :class:`AgentError`."""
    if not isinstance(error, AgentError):  # pragma: no cover - registered for AgentError only
        raise error
    if error.kind.http_status >= 500:
        logger.warning("%s %s failed: %s", request.method, request.url.path, error)
    return problem_response(error)

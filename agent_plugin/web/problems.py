"""Errors as RFC 9457 problem details (``application/problem+json``): an
:class:`~agent_plugin.errors.AgentError` answers with the status of its kind, and the plugin's
routes (:func:`problem_route`) answer every error that way, request validation and a body
over the size limit included.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, Final, cast

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute, APIRouter
from pydantic import BaseModel, ConfigDict, Field, JsonValue
from starlette.exceptions import HTTPException
from starlette.types import Message, Receive, Scope, Send

from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.redaction import redact_deep, redact_message, redact_text

__all__ = [
    "PROBLEM_MEDIA_TYPE",
    "PROBLEM_TYPE_PREFIX",
    "Problem",
    "ProblemDetail",
    "agent_error_handler",
    "problem",
    "problem_response",
    "problem_responses",
    "problem_route",
]

logger = logging.getLogger("agent_plugin")

PROBLEM_TYPE_PREFIX: Final = "tag:fastapi-agent-plugin,2025:error/"
"""The ``type`` of a problem body is this prefix plus the error's kind (a ``tag:`` URI, RFC
4151: a problem type that is not meant to be dereferenced)."""

PROBLEM_MEDIA_TYPE: Final = "application/problem+json"

_EXCERPT_CHARS: Final = 80
_MAX_DETAILS: Final = 20
_KIND_OF_STATUS: Final = {
    400: ErrorKind.INVALID,
    404: ErrorKind.NOT_FOUND,
    405: ErrorKind.INVALID,
    409: ErrorKind.CONFLICT,
    413: ErrorKind.INVALID,
    415: ErrorKind.INVALID,
    422: ErrorKind.INVALID,
    429: ErrorKind.RATE_LIMITED,
    503: ErrorKind.UNAVAILABLE,
}


class ProblemDetail(BaseModel):
    """One thing wrong with a request: where, what, and a short excerpt of the value."""

    loc: list[str | int]
    msg: str
    type: str
    input: str | None = None


class Problem(BaseModel):
    """An error, as every agent route answers it (``application/problem+json``)."""

    model_config = ConfigDict(extra="allow")

    type: str = Field(examples=[PROBLEM_TYPE_PREFIX + "not_found"])
    title: str = Field(examples=["NotFound"])
    status: int = Field(examples=[404])
    detail: str = Field(examples=["no run 'run_0123'"])
    kind: str = Field(examples=["not_found"])
    provider: str | None = None
    retry_after: float | None = None
    errors: list[ProblemDetail] | None = None
    """What is wrong with the request, item by item (validation errors only)."""


def problem(
    status: int,
    kind: ErrorKind,
    detail: str,
    *,
    headers: Mapping[str, str] | None = None,
    **fields: JsonValue,
) -> JSONResponse:
    """A problem response: ``status`` with the ``type``, ``title`` and ``kind`` of ``kind``.

    ``detail`` is redacted as published text is (it may repeat what a client sent, such as a
    call id, or what a provider answered: ``password: ...`` too)."""
    body: dict[str, Any] = {
        "type": PROBLEM_TYPE_PREFIX + kind.value,
        "title": kind.display_name,
        "status": status,
        "detail": redact_message(detail),
        "kind": kind.value,
        **{key: value for key, value in fields.items() if value is not None},
    }
    return JSONResponse(
        body, status_code=status, headers=dict(headers or {}), media_type=PROBLEM_MEDIA_TYPE
    )


def problem_response(error: AgentError) -> JSONResponse:
    """The problem response for ``error``: the status of its kind, its message as the detail
    (never a key), and ``provider`` and ``retry_after`` (with a ``Retry-After`` header) when
    known."""
    headers: dict[str, str] = {}
    if error.retry_after is not None:
        headers["retry-after"] = str(max(0, math.ceil(error.retry_after)))
    return problem(
        error.kind.http_status,
        error.kind,
        error.message,
        headers=headers,
        provider=error.provider,
        retry_after=error.retry_after,
    )


async def agent_error_handler(request: Request, error: Exception) -> Response:
    """The exception handler ``AgentPlugin.install`` registers for :class:`AgentError`."""
    if not isinstance(error, AgentError):  # pragma: no cover - registered for AgentError only
        raise error
    if error.kind.http_status >= 500:
        logger.warning("%s %s failed: %s", request.method, request.url.path, error)
    return problem_response(error)


def problem_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` documenting ``statuses`` as problem details."""
    schema = {"$ref": "#/components/schemas/Problem"}
    return {
        status: {
            "model": Problem,
            "description": _DESCRIPTIONS.get(status, "An error (problem details)"),
            "content": {PROBLEM_MEDIA_TYPE: {"schema": schema}},
        }
        for status in statuses
    }


_DESCRIPTIONS: Final = {
    400: "The request is malformed",
    404: "No such run",
    409: "The run is not in a state that takes this request",
    413: "The request body is larger than the limit",
    422: "The request does not validate (the errors name each field)",
    503: "Redis or the database is unreachable, or the plugin is not running",
}


# --- the plugin's routes ----------------------------------------------------------------


class _BodyTooLarge(Exception):
    pass


def _capped(receive: Receive, limit: int) -> Receive:
    """``receive`` that fails once the request body passes ``limit`` bytes, before more of it
    is buffered."""
    seen = 0

    async def capped() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise _BodyTooLarge
        return message

    return capped


def _too_large(limit: int) -> JSONResponse:
    return problem(413, ErrorKind.INVALID, f"the request body is larger than {limit} bytes")


def _excerpt(value: object, field: str | int | None = None) -> str | None:
    """A short, redacted, encodable excerpt of a refused value (never the whole of it).

    The value is cleaned as a stored value is (:func:`redact_deep`, under the name of the
    ``field`` it was sent as) before it is cut: a ``"password"`` refused as an extra field, or
    a body echoed whole for a missing field, keep their secrets by their names, and a key cut
    at the excerpt's end would be too short for its pattern to find.
    """
    if value is None:
        return None
    if isinstance(field, str):
        value = cast(dict[str, Any], redact_deep({field: cast(JsonValue, value)}))
        value = next(iter(value.values()))
    else:
        value = redact_deep(cast(JsonValue, value))
    text = value if isinstance(value, str) else json.dumps(value, default=str)[:1000]
    text = redact_text(text)  # what default=str wrote of a value that is not JSON
    if len(text) > _EXCERPT_CHARS:
        text = text[:_EXCERPT_CHARS] + "…"
    return text.encode("utf-8", "replace").decode("utf-8")


def _last(loc: Sequence[Any]) -> str | int | None:
    return loc[-1] if loc and isinstance(loc[-1], str | int) else None


def _validation_problem(error: RequestValidationError) -> JSONResponse:
    found: Sequence[Any] = error.errors()
    details: list[JsonValue] = [
        ProblemDetail(
            loc=[part if isinstance(part, int) else str(part) for part in item.get("loc", ())],
            msg=_excerpt(item.get("msg", "")) or "",
            type=str(item.get("type", "")),
            input=_excerpt(item.get("input"), _last(item.get("loc", ()))),
        ).model_dump(mode="json", exclude_none=True)
        for item in found[:_MAX_DETAILS]
    ]
    first = found[0] if found else None
    if first is not None:
        where = ".".join(str(p) for p in first.get("loc", ())) or "the request"
        detail = f"{where}: {_excerpt(first.get('msg', ''))}"
    else:
        detail = "the request does not validate"
    if len(found) > 1:
        detail += f" (and {len(found) - 1} more)"
    return problem(422, ErrorKind.INVALID, detail, errors=details)


def _http_problem(error: HTTPException) -> JSONResponse:
    status = error.status_code
    kind = _KIND_OF_STATUS.get(status, ErrorKind.INTERNAL if status >= 500 else ErrorKind.INVALID)
    detail = error.detail if isinstance(error.detail, str) else kind.display_name
    return problem(status, kind, detail, headers=error.headers)


def allow_every_method_of_a_path(router: APIRouter) -> None:
    """Tell each problem route of ``router`` every method its path takes, so a 405 names them
    all in ``Allow`` (Starlette's own names only the first route's, when a path has a GET and
    a POST route)."""
    methods: dict[str, set[str]] = {}
    for route in router.routes:
        if isinstance(route, APIRoute):
            methods.setdefault(route.path, set()).update(route.methods or ())
    for route in router.routes:
        if isinstance(route, APIRoute):
            route.allowed_methods = tuple(sorted(methods[route.path]))  # type: ignore[attr-defined]


def _not_allowed(scope: Scope, allowed: Sequence[str]) -> Response:
    """405 as problem details, naming the methods the path takes."""
    listed = ", ".join(allowed)
    detail = f"{scope['method']} is not allowed here; allowed: {listed}"
    return _http_problem(HTTPException(405, detail, headers={"Allow": listed}))


def problem_route(body_limit: int) -> type[APIRoute]:
    """A route class whose every error is problem details: an :class:`AgentError`, a request
    that does not validate (422, naming each field, with short excerpts of the values) or is
    malformed, and a body over ``body_limit`` bytes (413, refused as it is read)."""

    class ProblemRoute(APIRoute):
        allowed_methods: tuple[str, ...] = ()
        """Every method of the route's path (see :func:`allow_every_method_of_a_path`)."""

        async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
            if self.methods and scope["method"] not in self.methods:
                allowed = self.allowed_methods or tuple(sorted(self.methods))
                await _not_allowed(scope, allowed)(scope, receive, send)
                return
            await super().handle(scope, receive, send)

        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            handler = super().get_route_handler()

            async def route(request: Request) -> Response:
                declared = request.headers.get("content-length")
                if declared is not None and declared.isdigit() and int(declared) > body_limit:
                    return _too_large(body_limit)
                capped = Request(request.scope, _capped(request.receive, body_limit))
                try:
                    return await handler(capped)
                except _BodyTooLarge:
                    return _too_large(body_limit)
                except RequestValidationError as error:
                    return _validation_problem(error)
                except HTTPException as error:
                    if isinstance(error.__cause__, _BodyTooLarge):
                        return _too_large(body_limit)
                    return _http_problem(error)
                except AgentError as error:
                    return await agent_error_handler(request, error)

            return route

    return ProblemRoute

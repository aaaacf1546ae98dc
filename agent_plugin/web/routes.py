"""The agent's HTTP routes, thin over :class:`~agent_plugin.web.handle.AppAgent`: the tools,
and with background runs on, a run's record, decisions, events, cancel, messages, the start
of a run and the run console. ``docs/live-runs.md`` and ``docs/background-runs.md`` describe
them for clients."""

from __future__ import annotations

import typing
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Final, Literal

from fastapi import APIRouter, Body, Header, Path, Query, Response
from fastapi.params import Depends as DependsParam
from fastapi.responses import HTMLResponse, StreamingResponse
from fastapi.routing import APIRoute
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    JsonValue,
    TypeAdapter,
    WithJsonSchema,
    create_model,
    model_validator,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from agent_plugin.branching import Branch
from agent_plugin.events import OutcomeSummary
from agent_plugin.jobs import RunHandle
from agent_plugin.jobs.args import RUN_ID_PATTERN
from agent_plugin.live import parse_event_id
from agent_plugin.outcomes import ApprovalDecision
from agent_plugin.output import Output
from agent_plugin.records import RunPage, RunRecord, RunStatus
from agent_plugin.steering import MessageMode
from agent_plugin.text import storable, unstorable
from agent_plugin.tools import Tool, ToolEffect
from agent_plugin.web.console import CONSOLE_HEADERS, console_page
from agent_plugin.web.handle import AgentHandle
from agent_plugin.web.problems import (
    allow_every_method_of_a_path,
    problem_responses,
    problem_route,
)
from agent_plugin.web.sse import sse_response

__all__ = [
    "DEFAULT_BODY_LIMIT",
    "CancelRequest",
    "RunRequest",
    "SteeringRequest",
    "ToolInfo",
    "agent_router",
]


class ToolInfo(BaseModel):
    """A tool as the agent routes list it."""

    model_config = ConfigDict(frozen=True)

    name: str
    description: str
    effect: ToolEffect
    input_schema: dict[str, JsonValue]

    @classmethod
    def of(cls, tool: Tool) -> ToolInfo:
        return cls(
            name=tool.name,
            description=tool.description,
            effect=tool.effect,
            input_schema=tool.input_schema,
        )


def _storable_id(text: str) -> str:
    problem = unstorable(text)
    if problem is not None:
        raise ValueError(f"must not contain {problem} (text every store accepts)")
    return text


MAX_DECISIONS: Final = 1000
"""The most decisions one request may carry (a pause takes one per call that waits)."""

Text = Annotated[str, AfterValidator(storable)]
"""Text a client sends (a prompt, a message, a reason): a NUL or a lone surrogate in it, which
no store accepts, becomes U+FFFD."""

Id = Annotated[
    str,
    AfterValidator(_storable_id),
    WithJsonSchema({"type": "string", "pattern": r"^[^\u0000\ud800-\udfff]*$"}),
]
"""An id a client names (a session): refused when it holds a NUL or a lone surrogate."""


EVENT_ID_PATTERN: Final = r"^\s*([0-9]{1,20}(-[0-9]{1,20})?)?\s*$"
"""An event id as the stream gives it (``<ms>-<seq>``), as ``Last-Event-ID`` sends it back;
empty for none."""

RunIdPath = Annotated[
    str, Path(pattern=RUN_ID_PATTERN, description="The run's id, as enqueueing answered it")
]
"""A run id in a path: an id that cannot be one is a 422, an unknown one a 404."""


def _json_integer(value: object) -> object:
    if isinstance(value, bool | str):
        raise ValueError("must be a JSON integer")  # not true for 1, nor "2" for 2
    return value


EntryNumber = Annotated[int, Field(ge=1), BeforeValidator(_json_integer)]
"""A session entry's number in a body: a JSON integer from 1 (``2``, or ``2.0``, which JSON
Schema counts as one); a boolean, a string or a fraction is refused rather than coerced."""


class RunRequest(BaseModel):
    """The body of ``POST {prefix}/runs``: a task to run in the background (and, with output
    types registered, ``output``: the name of the one the run must produce)."""

    model_config = ConfigDict(extra="forbid")

    prompt: Text = Field(min_length=1, max_length=32_000, examples=["Summarise today's tickets"])
    session: Id | None = Field(default=None, min_length=1, max_length=255)
    branch: EntryNumber | None = Field(
        default=None,
        description="The session entry the run continues (a branch's leaf; default: the head)",
    )
    message_mode: MessageMode | None = Field(
        default=None,
        description="When messages sent to the run without a mode join it (default steer)",
    )

    @model_validator(mode="after")
    def _branch_of_a_session(self) -> RunRequest:
        if self.branch is not None and self.session is None:
            raise ValueError("a branch needs a session")
        return self


class ForkRequest(BaseModel):
    """The body of ``POST {prefix}/sessions/{session}/branches``: where the branch starts."""

    model_config = ConfigDict(extra="forbid")

    at: EntryNumber = Field(description="The entry the new branch follows", examples=[2])


SessionPath = Annotated[
    Id, Path(min_length=1, max_length=255, description="The session's id, as runs named it")
]
"""A session id in a path."""


class SteeringRequest(BaseModel):
    """The body of ``POST {prefix}/runs/{run_id}/messages``: a message for a running run."""

    model_config = ConfigDict(extra="forbid")

    text: Text = Field(min_length=1, max_length=32_000, examples=["Also check the staging logs"])
    mode: MessageMode | None = Field(
        default=None,
        description="steer: before the next model call; followup: when the run would end; "
        "collect: every message meanwhile, as one follow-up; interrupt: at once, asking the "
        "model again (default: the run's message_mode, else steer)",
    )


class CancelRequest(BaseModel):
    """The (optional) body of ``POST {prefix}/runs/{run_id}/cancel``."""

    model_config = ConfigDict(extra="forbid")

    reason: Text = Field(default="cancelled over HTTP", min_length=1, max_length=500)


DEFAULT_BODY_LIMIT: Final = 1_048_576
"""The largest request body an agent route reads, in bytes (1 MiB)."""


def _operation_id(route: APIRoute) -> str:
    """Stable, readable operation ids: ``agent_<route name>`` (``agent_get_run``)."""
    return f"agent_{route.name}"


def agent_router(
    prefix: str,
    *,
    dependencies: Sequence[DependsParam] = (),
    background: bool,
    runs_route: bool = False,
    console: bool = False,
    body_limit: int = DEFAULT_BODY_LIMIT,
    outputs: Mapping[str, Output[Any]] | None = None,
) -> APIRouter:
    """The agent routes under ``prefix``, all behind ``dependencies``.

    * ``GET {prefix}/tools``: the tools the agent offers the model.
    * ``GET {prefix}/sessions/{session}/branches``: the session's branches (404: no entries);
      ``POST`` with ``{"at"}`` starts one after that entry (201; 404 for an unknown entry).

    With ``background`` (background runs on):

    * ``GET {prefix}/runs``: runs, newest first, a page at a time (``status``, ``session``,
      ``origin``, ``limit``, ``cursor``).
    * ``GET {prefix}/runs/{run_id}``: the run's record; 404 for an unknown id.
    * ``POST {prefix}/runs/{run_id}/decisions``: decisions for a paused run's calls; 202 with
      the run's handle, the resume queued; 409 when not accepted.
    * ``POST {prefix}/runs`` (``runs_route``): ``{"prompt", "session"?, "branch"?, "output"?}``
      starts a run (``output`` names one of ``outputs``); 202.
    * ``GET {prefix}/runs/{run_id}/events``: the run's events as Server-Sent Events, after
      ``Last-Event-ID`` (header, or the ``last_event_id`` query parameter); ``?follow=true``
      goes on through pauses; 204 when the client has seen the end already.
    * ``POST {prefix}/runs/{run_id}/cancel`` and ``POST {prefix}/runs/{run_id}/messages``.
    * ``GET {prefix}/console/{run_id}`` (``console``): the run console page.

    With ``outputs`` (the registered output types, by name), a record's ``outcome.output``
    is documented as one of them (``null`` for a text run).

    Every error is problem details (``application/problem+json``): request validation (422),
    a body over ``body_limit`` bytes (413) and every :class:`~agent_plugin.errors.AgentError`.
    """
    router = APIRouter(
        prefix=prefix,
        tags=["agent"],
        dependencies=list(dependencies),
        route_class=problem_route(body_limit),
        generate_unique_id_function=_operation_id,
    )

    @router.get(
        "/tools",
        response_model=list[ToolInfo],
        summary="The tools the agent offers the model",
        responses=problem_responses(503),
    )
    async def list_tools(agent: AgentHandle) -> list[ToolInfo]:
        return [ToolInfo.of(t) for t in agent.agent().tools]

    _add_session_routes(router)
    if background:
        _add_run_routes(router, runs_route=runs_route, outputs=outputs or {})
        _add_live_routes(router, console=console, prefix=prefix)
    allow_every_method_of_a_path(router)
    return router


def _accepted(response: Response, handle: RunHandle) -> RunHandle:
    response.headers["location"] = handle.status_path
    return handle


class _DocumentedAs:
    """A JSON value documented in the schema as ``tp`` (validated as any JSON value)."""

    def __init__(self, tp: Any) -> None:
        self.tp = tp

    def __get_pydantic_json_schema__(
        self, _core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return handler(TypeAdapter(self.tp).core_schema)


def _typed_models(
    outputs: Mapping[str, Output[Any]],
) -> tuple[type[RunRecord], type[RunPage], type[RunRequest]]:
    """The record, page and request models of the routes: with outputs registered, a
    record's ``outcome.output`` is documented as one of them (``null`` for a text run) and a
    request's ``output`` as one of their names."""
    if not outputs:
        return RunRecord, RunPage, RunRequest
    members: list[Any] = []
    for output in outputs.values():
        kinds = output.output_type
        for kind in kinds if isinstance(kinds, list | tuple) else [kinds]:
            if kind not in members:
                members.append(kind)
    documented: Any = typing.Union.__getitem__((*members, None))
    summary = create_model(
        "OutcomeSummary",
        __base__=OutcomeSummary,
        __doc__=OutcomeSummary.__doc__,
        output=(Annotated[JsonValue, _DocumentedAs(documented)], None),
    )
    record = create_model(
        "RunRecord",
        __base__=RunRecord,
        __doc__=RunRecord.__doc__,
        outcome=(summary | None, None),
    )
    page = create_model(
        "RunPage", __base__=RunPage, __doc__=RunPage.__doc__, runs=(list[record], ...)
    )
    names = Literal[tuple(sorted(outputs))]  # type: ignore[valid-type]
    request = create_model(
        "RunRequest",
        __base__=RunRequest,
        __doc__=RunRequest.__doc__,
        output=(
            names | None,
            Field(default=None, description="The output type the run must produce (default: text)"),
        ),
    )
    return record, page, request


def _add_session_routes(router: APIRouter) -> None:
    @router.get(
        "/sessions/{session}/branches",
        response_model=list[Branch],
        summary="A session's branches, one per leaf; the head's is active",
        responses=problem_responses(404, 422, 503),
    )
    async def list_branches(session: SessionPath, agent: AgentHandle) -> Any:
        return await agent.branches(session)

    @router.post(
        "/sessions/{session}/branches",
        status_code=201,
        response_model=Branch,
        summary="Start a branch after an entry: the session's next run continues it",
        responses=problem_responses(400, 404, 409, 413, 422, 503),
    )
    async def fork_session(session: SessionPath, body: ForkRequest, agent: AgentHandle) -> Any:
        return await agent.fork(session, body.at)


def _add_run_routes(
    router: APIRouter, *, runs_route: bool, outputs: Mapping[str, Output[Any]]
) -> None:
    record_model, page_model, request_model = _typed_models(outputs)

    @router.get(
        "/runs",
        response_model=page_model,
        summary="Background runs, newest first, a page at a time",
        responses=problem_responses(422, 503),
    )
    async def list_runs(
        agent: AgentHandle,
        status: RunStatus | None = None,
        session: Annotated[Id | None, Query(min_length=1, max_length=255)] = None,
        origin: Annotated[Id | None, Query(min_length=1, max_length=64)] = None,
        limit: Annotated[int, Query(ge=1, le=200)] = 50,
        cursor: Annotated[
            str | None,
            Query(
                min_length=1,
                max_length=1000,
                description="The next_cursor of the page before (opaque)",
            ),
        ] = None,
    ) -> Any:
        return await agent.list_runs(
            status=status, session=session, origin=origin, limit=limit, cursor=cursor
        )

    @router.get(
        "/runs/{run_id}",
        response_model=record_model,
        summary="A background run's status, progress and outcome",
        responses=problem_responses(404, 422, 503),
    )
    async def get_run(run_id: RunIdPath, agent: AgentHandle) -> Any:
        return await agent.run_status(run_id)

    @router.post(
        "/runs/{run_id}/decisions",
        status_code=202,
        response_model=RunHandle,
        summary="Approve, edit or reject the calls a paused run waits on, and resume it",
        responses=problem_responses(400, 404, 409, 413, 422, 503),
    )
    async def decide_run(
        run_id: RunIdPath,
        decisions: Annotated[list[ApprovalDecision], Body(max_length=MAX_DECISIONS)],
        agent: AgentHandle,
        response: Response,
    ) -> Any:
        return _accepted(response, await agent.enqueue_resume(run_id, decisions))

    if runs_route:

        async def start_run(
            body: RunRequest,
            agent: AgentHandle,
            response: Response,
            idempotency_key: Annotated[
                str | None,
                Header(
                    min_length=1,
                    max_length=255,
                    pattern=r"^[\x21-\x7e]+$",
                    description="A key of the client's (a UUID): the same key and body are "
                    "one run, whatever the retries; the same key with another body is a 409",
                ),
            ] = None,
        ) -> Any:
            handle = await agent.enqueue(
                body.prompt,
                session=body.session,
                branch=body.branch,
                output=getattr(body, "output", None),
                message_mode=body.message_mode,
                idempotency_key=idempotency_key,
            )
            return _accepted(response, handle)

        start_run.__annotations__["body"] = request_model  # its output: a registered name
        router.post(
            "/runs",
            status_code=202,
            response_model=RunHandle,
            summary="Start a background run",
            responses=problem_responses(400, 409, 413, 422, 503),
        )(start_run)


def _add_live_routes(router: APIRouter, *, console: bool, prefix: str) -> None:
    @router.get(
        "/runs/{run_id}/events",
        response_class=StreamingResponse,
        summary="A run's events as Server-Sent Events",
        responses={
            200: {"content": {"text/event-stream": {}}},
            204: {"description": "The client has seen the run's end already"},
            **problem_responses(404, 422, 503),
        },
    )
    async def run_events(
        run_id: RunIdPath,
        agent: AgentHandle,
        # Plain strings with an empty default, not Optional: a header cannot carry a null.
        last_event_id: Annotated[str, Header(pattern=EVENT_ID_PATTERN)] = "",
        after: Annotated[str, Query(alias="last_event_id", pattern=EVENT_ID_PATTERN)] = "",
        follow: bool = False,
    ) -> Response:
        last = parse_event_id(last_event_id or after or None)
        events = await agent.jobs.events(run_id, last_event_id=last, follow=follow)
        if events is None:
            return Response(status_code=204)
        return sse_response(events)

    @router.post(
        "/runs/{run_id}/cancel",
        status_code=202,
        response_model=RunHandle,
        summary="Cancel a queued, paused or running run",
        responses=problem_responses(400, 404, 409, 413, 422, 503),
    )
    async def cancel_run(
        run_id: RunIdPath,
        agent: AgentHandle,
        response: Response,
        body: Annotated[CancelRequest | None, Body()] = None,
    ) -> Any:
        await agent.cancel(run_id, body.reason if body else "cancelled over HTTP")
        return _accepted(response, agent.jobs.handle(run_id))

    @router.post(
        "/runs/{run_id}/messages",
        status_code=202,
        response_model=RunHandle,
        summary="Send a message that joins a running run before its next model call",
        responses=problem_responses(400, 404, 409, 413, 422, 503),
    )
    async def steer_run(
        run_id: RunIdPath, body: SteeringRequest, agent: AgentHandle, response: Response
    ) -> Any:
        await agent.steer(run_id, body.text, body.mode)
        return _accepted(response, agent.jobs.handle(run_id))

    if console:

        @router.get("/console/{run_id}", response_class=HTMLResponse, include_in_schema=False)
        async def run_console(run_id: RunIdPath, agent: AgentHandle) -> HTMLResponse:
            await agent.run_status(run_id)  # 404 for an unknown run
            return HTMLResponse(console_page(run_id, prefix=prefix), headers=CONSOLE_HEADERS)

"""What a background run runs (:class:`RunArgs`), stored whole in its record, and what
enqueueing it answers (:class:`RunHandle`)."""

from __future__ import annotations

import hashlib
from typing import Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agent_plugin.errors import AgentError
from agent_plugin.ids import RUN_ID_PATTERN, new_run_id
from agent_plugin.options import DEFAULT_OVERRIDES, AgentOverrides

__all__ = [
    "RUN_ID_PATTERN",
    "RunArgs",
    "RunHandle",
    "RunOrigin",
    "checked_run_id",
    "idempotent_run_id",
    "tick_run_id",
]

RunOrigin: TypeAlias = Literal["request", "followup", "heartbeat"]
"""Who started a run: an app request, an agent-booked follow-up, or a heartbeat tick."""


class RunArgs(BaseModel):
    """A background run's task: the prompt, the agent's overrides (``overrides.output`` names
    the registered output type it must produce), whether its end is reported (``deliver``)
    and who started it. Kept in the run's record, never in Redis. ``trace`` is the enqueueing
    request's trace context (W3C headers; empty without tracing): the worker's spans join it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    prompt: str = Field(min_length=1)
    overrides: AgentOverrides = DEFAULT_OVERRIDES
    deliver: bool = False
    origin: RunOrigin = "request"
    trace: dict[str, str] = Field(default_factory=dict, exclude_if=lambda v: not v)

    @classmethod
    def checked(
        cls,
        prompt: str,
        *,
        overrides: AgentOverrides | dict[str, object] = DEFAULT_OVERRIDES,
        deliver: bool = False,
        origin: RunOrigin = "request",
    ) -> RunArgs:
        """The arguments, validated; a ``config`` :class:`AgentError` names a bad field."""
        try:
            return cls.model_validate(
                {"prompt": prompt, "overrides": overrides, "deliver": deliver, "origin": origin}
            )
        except ValidationError as error:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc'] if p != 'overrides') or 'args'}: {e['msg']}"
                for e in error.errors(include_url=False)
            )
            raise AgentError.config(f"bad run arguments: {problems}") from None


class _RunId(BaseModel):
    run_id: str = Field(pattern=RUN_ID_PATTERN)


def checked_run_id(run_id: str | None) -> str:
    """``run_id`` if it is a valid run id (a new one for ``None``); else a ``config`` error."""
    if run_id is None:
        return new_run_id()
    try:
        return _RunId(run_id=run_id).run_id
    except ValidationError:
        raise AgentError.config(
            f"bad run arguments: run_id {run_id!r} must be 1 to 64 letters, digits, '_', '.' "
            "or '-', starting with a letter or digit"
        ) from None


class RunHandle(BaseModel):
    """What enqueueing a run answers: its id and where to poll it."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    status_path: str = Field(examples=["/agent/runs/run_0123456789abcdef0123456789abcdef"])


def idempotent_run_id(key: str) -> str:
    """The run id an ``Idempotency-Key`` stands for: ``run_`` and 32 hex digits derived from
    the key, so every retry of a request names the same run."""
    return f"run_{hashlib.sha256(f'idempotency:{key}'.encode()).hexdigest()[:32]}"


def tick_run_id(queue_name: str, tick_id: str) -> str:
    """The run id of a heartbeat tick's check-in: ``run_`` and 32 hex digits derived from the
    queue and the tick's arq job id (the same for every worker that enqueues a fleet tick)."""
    seed = f"heartbeat:{queue_name}:{tick_id}"
    return f"run_{hashlib.sha256(seed.encode('utf-8')).hexdigest()[:32]}"

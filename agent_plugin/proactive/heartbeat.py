"""Heartbeats: :class:`Heartbeat` says when an always-on agent checks in and what it may do;
:func:`heartbeat_tick` runs one tick with callbacks the jobs layer supplies.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, ClassVar, Final, Literal, TypeAlias
from zoneinfo import ZoneInfo

from agent_plugin.errors import AgentError, ErrorKind, describe
from agent_plugin.proactive.schedule import _UTC, CronFields, CronSchedule, EverySchedule

logger = logging.getLogger("agent_plugin.proactive")


# --- heartbeat -------------------------------------------------------------------------------

HEARTBEAT_TASK: Final = "agent_heartbeat"
"""The name of the scheduled job a heartbeat registers."""

DEFAULT_PROMPT: Final = (
    "This is a scheduled heartbeat check-in. Review your memory, your standing instructions, "
    "and anything your tools can show you. If something needs the user's attention, report it "
    "in a few sentences. If nothing needs attention, reply with exactly HEARTBEAT_OK."
)
"""The check-in prompt of a heartbeat that sets none."""

Precheck: TypeAlias = Callable[[Any], "bool | Awaitable[bool]"]
"""A cheap check of the app's state before a tick: False skips the tick with no model call."""

StartRun: TypeAlias = Callable[[str, "str | None", "str | None", bool], Awaitable[Any]]
"""How a tick starts its run: ``start_run(prompt, session, memory_scope, read_only)``."""

IsBusy: TypeAlias = Callable[["str | None"], "bool | Awaitable[bool]"]
"""Whether a run for the heartbeat's session is active now (then the tick is skipped)."""

_MAX_NAME: Final = 255


def _check_name(value: object, what: str) -> None:
    if value is None:
        return
    if not isinstance(value, str) or not value.strip() or len(value) > _MAX_NAME:
        raise AgentError.config(
            f"the heartbeat {what} must be a non-blank string of at most {_MAX_NAME} "
            f"characters, got {value!r}"
        )


def _is_async_callable(fn: object) -> bool:
    if inspect.iscoroutinefunction(fn):
        return True
    call = getattr(type(fn), "__call__", None)  # noqa: B004 - an object with async __call__
    return not inspect.isroutine(fn) and inspect.iscoroutinefunction(call)


async def _resolve(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


@dataclass(frozen=True, slots=True, repr=False)
class Heartbeat:
    """A periodic check-in for an always-on agent.

    ::

        # every 30 minutes during office hours, Oslo time, in the "ops" session
        heartbeat = Heartbeat.cron("0 */30 8-18 * * MON-FRI", timezone="Europe/Oslo",
                                   session="ops")
        heartbeat = Heartbeat.every(timedelta(minutes=15)).precheck(has_new_orders)

    Each tick asks ``prompt`` (keep its :data:`HEARTBEAT_OK` instruction, or every tick is
    delivered) in ``session`` (so the agent sees earlier ticks) with memory bound to
    ``memory_scope``. Ticks are read-only: the app policy combined with
    :meth:`ToolRules.read_only <agent_plugin.policy.ToolRules.read_only>`, unless
    :meth:`allow_actions`. One tick runs per schedule across every worker, unless
    :meth:`per_replica`. Immutable: the builder methods return a new heartbeat. Everything is
    checked when a heartbeat is built; a mistake raises an :class:`AgentError` of kind
    ``config``.
    """

    schedule: EverySchedule | CronSchedule
    prompt: str = DEFAULT_PROMPT
    session: str | None = None
    memory_scope: str | None = None
    read_only: bool = True
    """False once :meth:`allow_actions` lifted the read-only rule."""
    fleet: bool = True
    """True: one tick per schedule across all workers; False (:meth:`per_replica`): one each."""
    check: Precheck | None = None
    """The :meth:`precheck`, if any."""

    TASK_NAME: ClassVar[str] = HEARTBEAT_TASK

    def __post_init__(self) -> None:
        self.validate()

    @classmethod
    def every(
        cls,
        interval: timedelta | float,
        *,
        prompt: str = DEFAULT_PROMPT,
        session: str | None = None,
        memory_scope: str | None = None,
    ) -> Heartbeat:
        """Tick every ``interval`` (a timedelta, or seconds), on the clock (see
        :class:`EverySchedule`). At least one second."""
        if isinstance(interval, timedelta):
            period = interval
        elif isinstance(interval, int | float) and not isinstance(interval, bool):
            if not math.isfinite(interval):
                raise AgentError.config(f"the heartbeat interval must be finite, got {interval}")
            period = timedelta(seconds=interval)
        else:
            raise AgentError.config(
                f"the heartbeat interval must be a timedelta or seconds, got {interval!r}"
            )
        return cls(EverySchedule(period), prompt=prompt, session=session, memory_scope=memory_scope)

    @classmethod
    def cron(
        cls,
        expression: str,
        *,
        timezone: str = "UTC",
        prompt: str = DEFAULT_PROMPT,
        session: str | None = None,
        memory_scope: str | None = None,
    ) -> Heartbeat:
        """Tick on a 5- or 6-field cron expression (see :class:`CronSpec`) in an IANA
        ``timezone``."""
        return cls(
            CronSchedule(expression, timezone),
            prompt=prompt,
            session=session,
            memory_scope=memory_scope,
        )

    # --- builders ------------------------------------------------------------------------

    def allow_actions(self) -> Heartbeat:
        """Let ticks use every tool the app policy allows, not only read-only and internal
        ones."""
        return replace(self, read_only=False)

    def per_replica(self) -> Heartbeat:
        """Tick on every worker instead of once per schedule across the fleet."""
        return replace(self, fleet=False)

    def precheck(self, check: Precheck) -> Heartbeat:
        """Skip a tick, before any model call, when ``check(app_state)`` answers False.

        ``check`` may be sync (it then runs in a worker thread) or async. Keep it cheap: it
        runs on every tick.
        """
        return replace(self, check=check)

    # --- checks and descriptions ---------------------------------------------------------

    def validate(self) -> None:
        """Raise an :class:`AgentError` of kind ``config`` if anything is wrong."""
        if not isinstance(self.schedule, EverySchedule | CronSchedule):
            raise AgentError.config(
                "a heartbeat needs a schedule: use Heartbeat.every(...) or Heartbeat.cron(...)"
            )
        if not isinstance(self.prompt, str) or not self.prompt.strip():
            raise AgentError.config("the heartbeat prompt must not be blank")
        _check_name(self.session, "session")
        _check_name(self.memory_scope, "memory scope")
        if self.check is not None and not callable(self.check):
            raise AgentError.config(f"the heartbeat precheck must be callable, got {self.check!r}")

    @property
    def allows_actions(self) -> bool:
        """Whether :meth:`allow_actions` lifted the read-only rule."""
        return not self.read_only

    @property
    def coordination(self) -> Literal["fleet", "per_replica"]:
        """``"fleet"`` (one tick per schedule across workers) or ``"per_replica"``."""
        return "fleet" if self.fleet else "per_replica"

    @property
    def schedule_text(self) -> str:
        """``"every 1800s"`` or ``"cron 0 */30 * * * *"``."""
        return self.schedule.description()

    @property
    def timezone(self) -> str:
        """The IANA zone the schedule is evaluated in (always UTC for ``every``)."""
        return self.schedule.timezone

    def tzinfo(self) -> ZoneInfo:
        """:attr:`timezone` as a tzinfo: the ``timezone`` of the arq worker that schedules
        the heartbeat (arq evaluates cron fields in its worker's timezone)."""
        return _UTC if self.timezone == "UTC" else ZoneInfo(self.timezone)

    def description(self) -> str:
        """For logs and health: ``"every 1800s, fleet"`` or ``"cron 0 */30 * * * *
        (Europe/Oslo), per replica"``."""
        where = ""
        if isinstance(self.schedule, CronSchedule) and self.timezone != "UTC":
            where = f" ({self.timezone})"
        spread = "fleet" if self.fleet else "per replica"
        return f"{self.schedule_text}{where}, {spread}"

    def cron_fields(self) -> CronFields:
        """Keywords for :func:`arq.cron.cron` that fire on this schedule.

        Register the job as ``cron(handler, name=HEARTBEAT_TASK, unique=heartbeat.fleet,
        **heartbeat.cron_fields())`` on a worker whose ``timezone`` is :meth:`tzinfo`.
        """
        return self.schedule.cron_fields()

    def fires_at(self, instant: datetime) -> bool:
        """Whether arq's tick for ``instant`` is one of the schedule's: ``False`` only for a
        cron expression with both a day and a weekday, on a date that matches neither."""
        return self.schedule.fires_at(instant)

    async def passes_precheck(self, state: Any) -> bool:
        """Run the precheck on ``state``; True when there is none.

        A precheck that raises fails the tick with an :class:`AgentError` of kind
        ``internal`` (and no model call).
        """
        check = self.check
        if check is None:
            return True
        try:
            if _is_async_callable(check):
                result = await _resolve(check(state))
            else:
                result = await _resolve(await asyncio.to_thread(check, state))
        except AgentError:
            raise
        except Exception as error:
            raise AgentError(
                ErrorKind.INTERNAL, f"the heartbeat precheck failed: {describe(error)}"
            ) from error
        return bool(result)

    def __repr__(self) -> str:
        return (
            f"Heartbeat(schedule={self.schedule_text!r}, timezone={self.timezone!r}, "
            f"session={self.session!r}, memory_scope={self.memory_scope!r}, "
            f"read_only={self.read_only}, coordination={self.coordination!r}, "
            f"precheck={self.check is not None})"
        )


class TickStatus(StrEnum):
    """What one heartbeat tick did."""

    STARTED = "started"
    """The check-in run was started."""
    SKIPPED_BUSY = "skipped_busy"
    """A run for the heartbeat's session was active, so the tick did nothing."""
    SKIPPED_PRECHECK = "skipped_precheck"
    """The precheck answered False: no model call."""


@dataclass(frozen=True, slots=True)
class TickResult:
    """The result of :func:`heartbeat_tick`; ``run`` is what ``start_run`` returned."""

    status: TickStatus
    run: Any = None

    @property
    def started(self) -> bool:
        return self.status is TickStatus.STARTED


async def heartbeat_tick(
    heartbeat: Heartbeat,
    state: Any,
    start_run: StartRun,
    *,
    is_busy: IsBusy | None = None,
) -> TickResult:
    """Run one tick of ``heartbeat``.

    1. ``is_busy(heartbeat.session)`` (sync or async) answers True → skipped, nothing else
       is asked: a tick never queues behind a run in its own session.
    2. The precheck, given ``state``, answers False → skipped with no model call.
    3. Otherwise ``start_run(prompt, session, memory_scope, read_only)`` starts the check-in
       run (read-only unless :meth:`Heartbeat.allow_actions`); the jobs layer runs it as a
       background run with delivery on and origin ``heartbeat``.

    Skips are logged and returned, not raised; errors of ``start_run`` propagate.
    """
    if is_busy is not None and await _resolve(is_busy(heartbeat.session)):
        logger.info(
            "heartbeat tick skipped: a run for session %r is still active", heartbeat.session
        )
        return TickResult(TickStatus.SKIPPED_BUSY)
    if not await heartbeat.passes_precheck(state):
        logger.debug("heartbeat precheck found nothing to do; skipping the tick")
        return TickResult(TickStatus.SKIPPED_PRECHECK)
    run = await start_run(
        heartbeat.prompt, heartbeat.session, heartbeat.memory_scope, heartbeat.read_only
    )
    return TickResult(TickStatus.STARTED, run)

"""Reports: what a background run with delivery on tells a person, and how it gets there.

:func:`is_silent` recognises a ``HEARTBEAT_OK`` answer (never delivered); :func:`report_text`
and :func:`report_for` turn an outcome into a :class:`Report`; a :class:`Delivery` carries it
(:class:`LogDelivery` by default); :func:`deliver_outcome` is the one call a job makes, and
never raises.
"""

from __future__ import annotations

import asyncio
import logging
import math
from datetime import UTC, datetime
from enum import StrEnum
from typing import Final, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, computed_field

from agent_plugin.errors import AgentError, describe
from agent_plugin.events import OutcomeSummary
from agent_plugin.outcomes import AgentOutcome
from agent_plugin.redaction import redact_text
from agent_plugin.tools import canonical_json

delivery_logger = logging.getLogger("agent_plugin.delivery")


# --- silence ---------------------------------------------------------------------------------

HEARTBEAT_OK: Final = "HEARTBEAT_OK"
"""The answer that means "nothing needs attention"."""

SILENT_ACK_MAX_CHARS: Final = 300
"""The longest remark an answer may add to :data:`HEARTBEAT_OK` and still be silent."""


def is_silent(text: str) -> bool:
    """Whether a background answer says "nothing needs attention" and must not be delivered.

    The text, trimmed, starts with :data:`HEARTBEAT_OK` (else ends with it) and what remains,
    trimmed, has at most :data:`SILENT_ACK_MAX_CHARS` characters. Case-sensitive:
    ``"heartbeat_ok"`` is not silent.
    """
    text = text.strip()
    if text.startswith(HEARTBEAT_OK):
        rest = text[len(HEARTBEAT_OK) :]
    elif text.endswith(HEARTBEAT_OK):
        rest = text[: -len(HEARTBEAT_OK)]
    else:
        return False
    return len(rest.strip()) <= SILENT_ACK_MAX_CHARS


# --- reports ---------------------------------------------------------------------------------


class ReportSource(StrEnum):
    """What started the background run a report comes from."""

    HEARTBEAT = "heartbeat"
    """A heartbeat tick."""
    FOLLOWUP = "followup"
    """A follow-up the agent booked with ``schedule_followup``."""
    JOB = "job"
    """A run the app enqueued with delivery on."""
    RESUME = "resume"
    """A run resumed after approval."""

    @classmethod
    def for_origin(cls, origin: str) -> ReportSource:
        """The source for a run's origin: ``request`` → job, ``followup`` → followup,
        ``heartbeat`` → heartbeat."""
        sources = {"request": cls.JOB, "followup": cls.FOLLOWUP, "heartbeat": cls.HEARTBEAT}
        try:
            return sources[origin]
        except KeyError:
            raise AgentError.config(
                f"unknown run origin {origin!r}; expected one of {', '.join(sources)}"
            ) from None


class Report(BaseModel):
    """A message from a background run to a person, as a :class:`Delivery` receives it.

    ``outcome`` is the public summary of how the run ended (tool arguments redacted, no
    transcript); a paused run's state stays on the server, where a reviewer's decisions resume
    it. ``session_id`` routes the report back to its conversation. ``key`` is
    ``"<run_id>:<source>:<status>:<steps_used>"``: the same report sent twice (a retried job)
    has the same key, so a receiver can drop the duplicate, while the reports of a run that
    pauses and is resumed more than once stay distinct.
    """

    model_config = ConfigDict(frozen=True)

    source: ReportSource
    run_id: str
    session_id: str | None = None
    text: str
    outcome: OutcomeSummary
    created_at: datetime = Field(default_factory=lambda: datetime.now(UTC))

    @computed_field  # type: ignore[prop-decorator]
    @property
    def key(self) -> str:
        """``"<run_id>:<source>:<status>:<steps_used>"``, the receiver's deduplication key."""
        outcome = self.outcome
        return f"{self.run_id}:{self.source.value}:{outcome.status}:{outcome.steps_used}"


APPROVAL_HEADER: Final = "The agent wants to run these calls and needs approval:"
"""The first line of the report of a run paused for approval."""


def report_text(outcome: AgentOutcome | OutcomeSummary) -> str | None:
    """The text a person should see for how a background run ended, or None to stay quiet.

    * completed with an answer that is not :func:`is_silent` (and not blank): the answer;
    * awaiting approval: :data:`APPROVAL_HEADER` and one line ``- <name> <arguments JSON>``
      per call that waits, with secrets in the arguments redacted;
    * anything else (budget, loop, cancelled, paused by a hook): None; those are only logged.

    It applies to every background delivery, not only heartbeats.
    """
    summary = outcome if isinstance(outcome, OutcomeSummary) else OutcomeSummary.of(outcome)
    if summary.status == "completed":
        text = summary.text or ""
        return None if not text.strip() or is_silent(text) else text
    if summary.status == "awaiting_approval":
        lines = [f"- {call.name} {canonical_json(call.arguments)}" for call in summary.awaiting]
        return "\n".join([APPROVAL_HEADER, *lines])
    return None


def report_for(
    outcome: AgentOutcome | OutcomeSummary,
    *,
    source: ReportSource,
    run_id: str,
    session_id: str | None = None,
) -> Report | None:
    """The :class:`Report` of a background run's outcome, or None when it has nothing to say."""
    text = report_text(outcome)
    if text is None:
        return None
    summary = outcome if isinstance(outcome, OutcomeSummary) else OutcomeSummary.of(outcome)
    return Report(
        source=ReportSource(source),
        run_id=run_id,
        session_id=session_id,
        text=text,
        outcome=summary,
    )


# --- delivery --------------------------------------------------------------------------------


@runtime_checkable
class Delivery(Protocol):
    """Where background reports go: mail, chat, push, an inbox table.

    ``deliver`` may raise to say the report did not arrive; callers go through
    :func:`deliver_safely`, which logs the failure and carries on.
    """

    async def deliver(self, report: Report) -> None:
        """Hand ``report`` to a person (or to whatever reaches one)."""
        ...


class LogDelivery:
    """The default :class:`Delivery`: logs each report at INFO on ``agent_plugin.delivery``."""

    __slots__ = ()

    async def deliver(self, report: Report) -> None:
        """Log ``report`` (credential-looking text in it is redacted)."""
        delivery_logger.info(
            "agent report %s from %s run %s (session %s): %s",
            report.key,
            report.source.value,
            report.run_id,
            report.session_id or "-",
            redact_text(report.text),
        )

    def __repr__(self) -> str:
        return "LogDelivery()"


DEFAULT_DELIVERY_TIMEOUT: Final = 30.0
"""How long :func:`deliver_safely` waits for a delivery that has no ``timeout`` of its own."""

_GRACE: Final = 1.0
"""Extra seconds over a delivery's own ``timeout``, so its own (clearer) error wins the race."""


def _bound(delivery: object, limit: float | None) -> float:
    if limit is not None:
        return limit
    own = getattr(delivery, "timeout", None)
    if isinstance(own, int | float) and not isinstance(own, bool) and 0 < own < math.inf:
        return float(own) + _GRACE
    return DEFAULT_DELIVERY_TIMEOUT


async def deliver_safely(delivery: Delivery, report: Report, *, limit: float | None = None) -> bool:
    """Deliver ``report``; True when it arrived. Never raises (cancellation aside).

    A delivery that raises, or does not finish within ``limit`` seconds (default: the
    delivery's own ``timeout`` attribute plus a second, else :data:`DEFAULT_DELIVERY_TIMEOUT`),
    is logged at ERROR on ``agent_plugin.delivery`` (credential-looking text redacted) and
    answers False: failing the job would re-run the whole agent.
    """
    bound = _bound(delivery, limit)
    try:
        async with asyncio.timeout(bound) as scope:
            await delivery.deliver(report)
    except TimeoutError as error:
        detail = f"no answer within {bound:g} s" if scope.expired() else describe(error)
        delivery_logger.error(
            "cannot deliver report %s (%s run %s): %s",
            report.key,
            report.source.value,
            report.run_id,
            detail,
        )
        return False
    except Exception as error:
        delivery_logger.error(
            "cannot deliver report %s (%s run %s): %s",
            report.key,
            report.source.value,
            report.run_id,
            describe(error),
        )
        return False
    delivery_logger.debug("delivered report %s", report.key)
    return True


async def deliver_outcome(
    delivery: Delivery,
    outcome: AgentOutcome | OutcomeSummary,
    *,
    source: ReportSource,
    run_id: str,
    session_id: str | None = None,
    limit: float | None = None,
) -> bool:
    """Report a background run's outcome if it has something to say; True when delivered.

    The one call a job makes after a run with delivery on: silent answers are dropped, budget
    and loop stops are only logged, and a failing delivery is logged (see
    :func:`deliver_safely`). Never raises.
    """
    report = report_for(outcome, source=source, run_id=run_id, session_id=session_id)
    if report is None:
        status = outcome.status
        level = logging.DEBUG if status == "completed" else logging.INFO
        origin = ReportSource(source).value
        delivery_logger.log(level, "%s run %s ended %s; nothing to deliver", origin, run_id, status)
        return False
    return await deliver_safely(delivery, report, limit=limit)

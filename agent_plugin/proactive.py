"""Always-on agents: silent acknowledgements, reports and their delivery, heartbeats and
agent-booked follow-ups [SPEC §7, reference §1.18].

An always-on agent wakes up by itself, looks around, acts within limits and tells a person
only when something needs attention. This module holds the parts of that which need no job
queue; :mod:`agent_plugin.jobs` runs them on arq.

**Silence** [AP-42]. A heartbeat prompt asks the model to answer exactly :data:`HEARTBEAT_OK`
when nothing needs attention; :func:`is_silent` recognises such an answer (also with a short
remark before or after it), and a silent answer is never delivered.

**Reports** [AP-43]. :func:`report_text` turns the outcome of a background run into text for a
person: a final answer that is not silent, or the list of calls a paused run waits to have
approved. Budget and loop stops have nothing to tell (they are only logged). :func:`report_for`
wraps the text in a :class:`Report`, which carries the public
:class:`~agent_plugin.events.OutcomeSummary` (never the transcript) and a :attr:`Report.key`
(``"<run id>:<source>"``) a receiver deduplicates on.

**Delivery.** A :class:`Delivery` is the app's bridge to mail, chat or an inbox.
:class:`LogDelivery` (the default) logs reports; :class:`WebhookDelivery` POSTs them as signed
JSON. :func:`deliver_safely` (and :func:`deliver_outcome`, which builds the report first) never
raises and is bounded in time: a failed delivery is logged and must never fail, or re-run, the
background job that produced it.

**Heartbeat** [AP-44, AP-45]. :class:`Heartbeat` describes when to wake up (``every`` or
``cron``), what to ask, in which session and memory scope, whether ticks may act, whether one
tick runs per schedule across the fleet or one per replica, and an optional cheap precheck.
:func:`heartbeat_tick` runs one tick with a ``start_run`` callback the jobs layer supplies.

**Follow-ups** [AP-46]. :class:`FollowupTool` is the ``schedule_followup`` tool: the agent books
its own next wake-up, which the jobs layer enqueues as a delayed run from a :class:`FollowupPlan`.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import inspect
import logging
import math
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, ClassVar, Final, Literal, Protocol, TypeAlias, TypedDict, runtime_checkable
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import httpx
from pydantic import BaseModel, ConfigDict, Field, JsonValue, computed_field

from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.events import OutcomeSummary
from agent_plugin.outcomes import AgentOutcome
from agent_plugin.policy import Strictest, ToolPolicy, ToolRules
from agent_plugin.redaction import redact_text, scrub
from agent_plugin.tools import ToolContext, ToolEffect, canonical_json

__all__ = [
    "APPROVAL_HEADER",
    "DEFAULT_DELIVERY_TIMEOUT",
    "DEFAULT_PROMPT",
    "DEFAULT_SECRET_ENV",
    "HEARTBEAT_OK",
    "HEARTBEAT_TASK",
    "KEY_HEADER",
    "MAX_CHAIN",
    "MAX_FOLLOWUP_PROMPT_CHARS",
    "SIGNATURE_HEADER",
    "SILENT_ACK_MAX_CHARS",
    "TIMESTAMP_HEADER",
    "CronFields",
    "CronSchedule",
    "CronSpec",
    "Delivery",
    "Enqueue",
    "EverySchedule",
    "FollowupPlan",
    "FollowupTool",
    "Heartbeat",
    "IsBusy",
    "LogDelivery",
    "Precheck",
    "Report",
    "ReportSource",
    "StartRun",
    "TickResult",
    "TickStatus",
    "WebhookDelivery",
    "deliver_outcome",
    "deliver_safely",
    "heartbeat_tick",
    "is_silent",
    "report_for",
    "report_text",
    "verify_webhook",
    "webhook_signature",
]

logger = logging.getLogger("agent_plugin.proactive")
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
    ``"heartbeat_ok"`` is not silent [AP-42].
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

    It applies to every background delivery, not only heartbeats [AP-43].
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


SIGNATURE_HEADER: Final = "X-Agent-Signature"
"""``sha256=<hex HMAC-SHA256 of "<timestamp>.<body>">`` (see :func:`webhook_signature`)."""
TIMESTAMP_HEADER: Final = "X-Agent-Timestamp"
"""Unix seconds at sending; part of the signed payload, so a receiver can refuse replays."""
KEY_HEADER: Final = "X-Agent-Report-Key"
"""The report's :attr:`Report.key`, for deduplication without parsing the body."""

DEFAULT_SECRET_ENV: Final = "AGENT_WEBHOOK_SECRET"


def webhook_signature(secret: str, timestamp: str, body: bytes) -> str:
    """The :data:`SIGNATURE_HEADER` value: ``"sha256=" + hex(HMAC-SHA256(secret,
    timestamp + "." + body))``, over the exact body bytes."""
    payload = timestamp.encode("ascii") + b"." + body
    digest = hmac.new(secret.encode("utf-8"), payload, hashlib.sha256).hexdigest()
    return f"sha256={digest}"


def verify_webhook(
    secret: str,
    body: bytes,
    *,
    timestamp: str,
    signature: str,
    tolerance: float = 300.0,
    now: float | None = None,
) -> bool:
    """Whether a webhook request is authentic and fresh: what a receiver checks.

    ``body`` must be the raw request body (before any JSON parsing), ``timestamp`` and
    ``signature`` the :data:`TIMESTAMP_HEADER` and :data:`SIGNATURE_HEADER` values. A
    timestamp more than ``tolerance`` seconds away from ``now`` (default: the clock) fails,
    which stops a captured request from being replayed later; the comparison of signatures
    takes constant time.
    """
    try:
        sent = int(timestamp)
        stale = abs((time.time() if now is None else now) - sent) > tolerance
    except (ValueError, OverflowError):  # not a number, or one too large for the clock
        return False
    if stale or not signature.isascii():  # compare_digest raises on a non-ASCII str
        return False
    try:
        expected = webhook_signature(secret, timestamp, body)
    except UnicodeEncodeError:
        return False
    return hmac.compare_digest(expected, signature)


class WebhookDelivery:
    """POSTs each report as JSON to ``url``, signed with a shared secret.

    Headers: ``Content-Type: application/json``, :data:`SIGNATURE_HEADER`,
    :data:`TIMESTAMP_HEADER` and :data:`KEY_HEADER`. The secret is ``secret`` or else the
    environment variable ``secret_env`` (``AGENT_WEBHOOK_SECRET``), read when the delivery is
    built; without one the delivery refuses to be built, so reports are never sent unsigned.

    A receiver verifies a request like this (or with :func:`verify_webhook`)::

        body = await request.body()                        # the raw bytes, not re-encoded JSON
        timestamp = request.headers["X-Agent-Timestamp"]
        expected = "sha256=" + hmac.new(secret.encode(), timestamp.encode() + b"." + body,
                                        hashlib.sha256).hexdigest()
        ok = hmac.compare_digest(expected, request.headers["X-Agent-Signature"]) \\
             and abs(time.time() - int(timestamp)) <= 300
        # then drop the report if X-Agent-Report-Key was seen before

    A 2xx answer is success; any other status, a connection failure or no answer within
    ``timeout`` seconds (for the whole request) raises :class:`AgentError`. Error messages name
    only the scheme, host and port of ``url``: webhook URLs often carry a token in their path.
    One pooled HTTP client serves every delivery; :meth:`aclose` closes it (a later delivery
    opens a new one). ``transport`` replaces httpx's network transport (tests, proxies).
    """

    __slots__ = ("_client", "_secret", "_transport", "_url", "target", "timeout")

    def __init__(
        self,
        url: str,
        *,
        secret: str | None = None,
        secret_env: str = DEFAULT_SECRET_ENV,
        timeout: float = 5.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        try:
            parsed = httpx.URL(url)
        except (httpx.InvalidURL, TypeError) as exc:
            raise AgentError.config(f"WebhookDelivery: invalid url: {exc}") from None
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise AgentError.config(
                "WebhookDelivery: the url must be an absolute http:// or https:// URL"
            )
        if isinstance(timeout, bool) or not isinstance(timeout, int | float):
            raise AgentError.config(f"WebhookDelivery: timeout must be a number, got {timeout!r}")
        if not math.isfinite(timeout) or timeout <= 0:
            raise AgentError.config(f"WebhookDelivery: timeout must be positive, got {timeout}")
        if secret is None:
            secret = os.environ.get(secret_env)
        if not secret or not secret.strip():
            raise AgentError.config(
                f"WebhookDelivery needs a signing secret: set the {secret_env} environment "
                "variable or pass secret=..."
            )
        self._url = parsed
        self._secret = secret
        self._transport = transport
        self._client: httpx.AsyncClient | None = None
        self.timeout = float(timeout)
        port = f":{parsed.port}" if parsed.port is not None else ""
        self.target = f"{parsed.scheme}://{parsed.host}{port}"
        """Scheme, host and port of the url: what logs and errors show of it."""

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(
                transport=self._transport,
                timeout=httpx.Timeout(self.timeout),
                follow_redirects=False,
                headers={"user-agent": "fastapi-agent-plugin webhook"},
            )
        return self._client

    async def deliver(self, report: Report) -> None:
        """POST ``report``; raise :class:`AgentError` unless the receiver answers 2xx."""
        body = report.model_dump_json().encode("utf-8")
        timestamp = str(int(time.time()))
        headers = {
            "content-type": "application/json",
            SIGNATURE_HEADER: webhook_signature(self._secret, timestamp, body),
            TIMESTAMP_HEADER: timestamp,
            KEY_HEADER: report.key,
        }
        client = self._http()
        try:
            async with asyncio.timeout(self.timeout):
                response = await client.post(self._url, content=body, headers=headers)
        except (TimeoutError, httpx.TimeoutException):
            raise AgentError(
                ErrorKind.TRANSPORT,
                f"the webhook at {self.target} did not answer within {self.timeout:g} s",
            ) from None
        except httpx.HTTPError as exc:
            detail = scrub(scrub(str(exc), str(self._url)), self._secret)
            raise AgentError(
                ErrorKind.TRANSPORT,
                f"cannot reach the webhook at {self.target}: {type(exc).__name__}: "
                f"{redact_text(detail)}",
            ) from None
        if not response.is_success:
            raise AgentError(
                ErrorKind.from_http_status(response.status_code),
                f"the webhook at {self.target} answered {response.status_code}",
                status=response.status_code,
            )

    async def aclose(self) -> None:
        """Close the pooled HTTP client."""
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    async def __aenter__(self) -> WebhookDelivery:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"WebhookDelivery(target={self.target!r}, timeout={self.timeout:g})"


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


def _describe(error: BaseException) -> str:
    if isinstance(error, AgentError):
        return redact_text(error.message)
    text = redact_text(str(error))
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


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
        detail = f"no answer within {bound:g} s" if scope.expired() else _describe(error)
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
            _describe(error),
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


# --- cron ------------------------------------------------------------------------------------


class CronFields(TypedDict):
    """Keyword arguments for :func:`arq.cron.cron`: the values at which a job fires.

    ``None`` means any value; ``weekday`` counts from 0 = Monday, as arq (and
    :meth:`datetime.weekday`) do.
    """

    month: set[int] | None
    day: set[int] | None
    weekday: set[int] | None
    hour: set[int] | None
    minute: set[int] | None
    second: set[int] | None


_MONTHS: Final = (
    "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
)  # fmt: skip
_MONTH_NAMES: Final = {name: number for number, name in enumerate(_MONTHS, 1)}
_WEEKDAYS: Final = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]
_WEEKDAY_NAMES: Final = {name: number for number, name in enumerate(_WEEKDAYS)}
_DAYS_IN_MONTH: Final = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


@dataclass(frozen=True, slots=True)
class _Field:
    name: str
    low: int
    high: int
    names: Mapping[str, int]


_SECOND: Final = _Field("second", 0, 59, {})
_MINUTE: Final = _Field("minute", 0, 59, {})
_HOUR: Final = _Field("hour", 0, 23, {})
_DAY: Final = _Field("day", 1, 31, {})
_MONTH: Final = _Field("month", 1, 12, _MONTH_NAMES)
_WEEKDAY: Final = _Field("weekday", 0, 7, _WEEKDAY_NAMES)


class _CronError(Exception):
    pass


@dataclass(frozen=True, slots=True)
class CronSpec:
    """A parsed cron expression: the values each field matches, ``None`` for any value.

    Grammar of a field: a comma-separated list of items, each ``*``, ``N``, ``A-B``, ``*/S``,
    ``A-B/S`` or ``N/S`` (N to the field's end in steps of S). Months may be named (``JAN``)
    and weekdays too (``MON``); names are case-insensitive. Weekdays count from 0 = Sunday,
    and 7 is Sunday too (``FRI-SUN`` works). ``?`` means any day or weekday.

    Five fields (``minute hour day month weekday``) fire at second 0; six put the second
    first (``second minute hour day month weekday``), as the seed's ``"0 */30 * * * *"``.
    When both day and weekday are restricted, a time must match both (as arq, and the seed's
    scheduler, evaluate them; classic Unix cron matches either).
    """

    second: frozenset[int] | None
    minute: frozenset[int] | None
    hour: frozenset[int] | None
    day: frozenset[int] | None
    month: frozenset[int] | None
    weekday: frozenset[int] | None
    """Cron numbering: 0 = Sunday ... 6 = Saturday."""

    @classmethod
    def parse(cls, expression: str) -> CronSpec:
        """Parse ``expression``; raise an :class:`AgentError` of kind ``config`` naming the
        field at fault when it is invalid or can never fire."""
        if not isinstance(expression, str) or not expression.strip():
            raise AgentError.config("the heartbeat cron expression must not be blank")
        parts = expression.split()
        if len(parts) == 5:
            second: frozenset[int] | None = frozenset({0})
            texts = parts
        elif len(parts) == 6:
            second = None
            texts = parts[1:]
        else:
            raise AgentError.config(
                f"invalid cron expression {expression!r}: expected 5 fields (minute hour day "
                f"month weekday) or 6 (second minute hour day month weekday), got {len(parts)}"
            )
        fields = (_MINUTE, _HOUR, _DAY, _MONTH, _WEEKDAY)
        try:
            if len(parts) == 6:
                second = _parse_field(parts[0], _SECOND)
            minute, hour, day, month, weekday = (
                _parse_field(text, spec) for text, spec in zip(texts, fields, strict=True)
            )
        except _CronError as error:
            raise AgentError.config(f"invalid cron expression {expression!r}: {error}") from None
        spec = cls(second, minute, hour, day, month, weekday)
        if not spec._has_a_date():
            raise AgentError.config(
                f"invalid cron expression {expression!r}: it never fires (no month it allows "
                "has the days it asks for)"
            )
        return spec

    def _has_a_date(self) -> bool:
        if self.day is None:
            return True
        months = self.month if self.month is not None else range(1, 13)
        return any(day <= _DAYS_IN_MONTH[month - 1] for month in months for day in self.day)

    def arq_fields(self) -> CronFields:
        """The same schedule as :func:`arq.cron.cron` keywords (weekday 0 = Monday)."""
        weekday = None if self.weekday is None else {(day - 1) % 7 for day in self.weekday}
        return CronFields(
            month=_mutable(self.month),
            day=_mutable(self.day),
            weekday=weekday,
            hour=_mutable(self.hour),
            minute=_mutable(self.minute),
            second=_mutable(self.second),
        )


def _mutable(values: frozenset[int] | None) -> set[int] | None:
    return None if values is None else set(values)


def _parse_field(text: str, spec: _Field) -> frozenset[int] | None:
    """The values ``text`` matches, or None when it matches every value of the field."""
    wildcard = ("*", "?") if spec in (_DAY, _WEEKDAY) else ("*",)
    if text in wildcard:
        return None
    values: set[int] = set()
    for item in text.split(","):
        values.update(_parse_item(item, spec, text))
    if spec is _WEEKDAY:
        values = {0 if value == 7 else value for value in values}
        full = set(range(7))
    else:
        full = set(range(spec.low, spec.high + 1))
    return None if values == full else frozenset(values)


def _parse_item(item: str, spec: _Field, text: str) -> range:
    where = f"the {spec.name} field {text!r}"
    if not item:
        raise _CronError(f"{where} has an empty list item")
    base, slash, step_text = item.partition("/")
    step = 1
    if slash:
        step = _number(step_text, spec, where, what="step")
        if step < 1:
            raise _CronError(f"{where}: a step must be at least 1")
    if base == "*":
        start, end = spec.low, (6 if spec is _WEEKDAY else spec.high)
    elif "-" in base:
        first, _, last = base.partition("-")
        start = _value(first, spec, where)
        end = _value(last, spec, where, range_end=True)
        if start > end:
            raise _CronError(f"{where}: the range {base} runs backwards")
    else:
        start = _value(base, spec, where)
        end = spec.high if slash else start
    return range(start, end + 1, step)


def _value(text: str, spec: _Field, where: str, *, range_end: bool = False) -> int:
    named = spec.names.get(text.lower())
    if named is not None:
        # SUN ends a weekday range as 7, so FRI-SUN is Friday to Sunday
        return 7 if range_end and spec is _WEEKDAY and named == 0 else named
    value = _number(text, spec, where, what="value")
    if not spec.low <= value <= spec.high:
        raise _CronError(f"{where}: {value} is out of range {spec.low}-{spec.high}")
    return value


def _number(text: str, spec: _Field, where: str, *, what: str) -> int:
    if not (text.isascii() and text.isdigit()):
        hint = ""
        if spec.names and what == "value":
            hint = f" or a name ({', '.join(name.upper() for name in spec.names)})"
        raise _CronError(f"{where}: {text!r} is not a whole number{hint}")
    return int(text)


# --- schedules -------------------------------------------------------------------------------

_UTC: Final = ZoneInfo("UTC")


@dataclass(frozen=True, slots=True)
class EverySchedule:
    """Tick every ``interval``, on the clock: at the times of day that are whole multiples of
    the interval (every 15 minutes = at :00, :15, :30 and :45).

    arq's scheduler fires on clock times, so the interval must divide a minute, an hour or a
    day evenly (1-60 s, 2-60 minutes, 2-24 hours, whole seconds only); other intervals are
    refused with a hint to use :meth:`Heartbeat.cron`. Ticks missed while no worker ran are
    not replayed (a running worker that stalled catches up, one tick per poll).
    """

    interval: timedelta

    def __post_init__(self) -> None:
        if not isinstance(self.interval, timedelta):
            raise AgentError.config(
                f"the heartbeat interval must be a timedelta, got {type(self.interval).__name__}"
            )
        seconds = self.interval.total_seconds()
        if seconds < 1:
            raise AgentError.config(
                f"the heartbeat interval must be at least one second, got {seconds:g} s"
            )
        self.cron_fields()  # refuse intervals arq cannot fire on

    @property
    def seconds(self) -> int:
        """The interval in whole seconds."""
        return int(self.interval.total_seconds())

    @property
    def timezone(self) -> str:
        """Always ``"UTC"``: the clock the ticks are aligned to."""
        return "UTC"

    def description(self) -> str:
        """``"every <seconds>s"``."""
        return f"every {self.seconds}s"

    def cron_fields(self) -> CronFields:
        """The arq cron keywords that fire every ``interval`` (evaluated in UTC)."""
        total = self.interval.total_seconds()
        seconds = int(total)
        fields = CronFields(month=None, day=None, weekday=None, hour=None, minute=None, second=None)
        if seconds == total:
            if seconds <= 60 and 60 % seconds == 0:
                fields["second"] = None if seconds == 1 else set(range(0, 60, seconds))
                return fields
            minutes, hours = seconds // 60, seconds // 3600
            if seconds <= 3600 and seconds % 60 == 0 and 60 % minutes == 0:
                fields["second"] = {0}
                fields["minute"] = None if minutes == 1 else set(range(0, 60, minutes))
                return fields
            if seconds <= 86400 and seconds % 3600 == 0 and 24 % hours == 0:
                fields["second"], fields["minute"] = {0}, {0}
                fields["hour"] = set(range(0, 24, hours))
                return fields
        raise AgentError.config(
            f"Heartbeat.every({total:g} s): arq's scheduler fires on clock times, so the "
            "interval must divide a minute, an hour or a day evenly (1, 2, 5, 10, 15, 30 s; "
            "1, 2, 5, 10, 15, 30 min; 1, 2, 3, 4, 6, 8, 12, 24 h ...); for any other schedule "
            'use Heartbeat.cron("<cron expression>")'
        )


@dataclass(frozen=True, slots=True)
class CronSchedule:
    """Tick on a cron expression (see :class:`CronSpec`) evaluated in an IANA ``timezone``."""

    expression: str
    timezone: str = "UTC"
    spec: CronSpec = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        spec = CronSpec.parse(self.expression)
        if not isinstance(self.timezone, str) or not self.timezone.strip():
            raise AgentError.config("the heartbeat timezone must be an IANA name such as 'UTC'")
        try:
            ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise AgentError.config(
                f"unknown heartbeat timezone {self.timezone!r}: use an IANA name such as "
                "'UTC' or 'Europe/Oslo'"
            ) from None
        object.__setattr__(self, "spec", spec)

    def description(self) -> str:
        """``"cron <expression>"``."""
        return f"cron {' '.join(self.expression.split())}"

    def cron_fields(self) -> CronFields:
        """The arq cron keywords of the expression (evaluate them in :attr:`timezone`)."""
        return self.spec.arq_fields()


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

StartRun: TypeAlias = Callable[[str, "str | None", "str | None", ToolPolicy], Awaitable[Any]]
"""How a tick starts its run: ``start_run(prompt, session, memory_scope, policy)``."""

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
    """A periodic check-in for an always-on agent [AP-44, AP-45].

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

    def run_args_policy(self, app_policy: ToolPolicy) -> ToolPolicy:
        """The policy of a tick's run: ``Strictest([app_policy, ToolRules.read_only()])``, or
        ``app_policy`` itself after :meth:`allow_actions`."""
        if not self.read_only:
            return app_policy
        return Strictest([app_policy, ToolRules.read_only()])

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
                ErrorKind.INTERNAL, f"the heartbeat precheck failed: {_describe(error)}"
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
    app_policy: ToolPolicy,
    is_busy: IsBusy | None = None,
) -> TickResult:
    """Run one tick of ``heartbeat`` [AP-45].

    1. ``is_busy(heartbeat.session)`` (sync or async) answers True → skipped, nothing else
       is asked: a tick never queues behind a run in its own session.
    2. The precheck, given ``state``, answers False → skipped with no model call.
    3. Otherwise ``start_run(prompt, session, memory_scope, policy)`` starts the check-in run
       with :meth:`Heartbeat.run_args_policy` of ``app_policy``; the jobs layer runs it as an
       ``agent_run`` with delivery on and origin ``heartbeat``.

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
    policy = heartbeat.run_args_policy(app_policy)
    run = await start_run(heartbeat.prompt, heartbeat.session, heartbeat.memory_scope, policy)
    return TickResult(TickStatus.STARTED, run)


# --- follow-ups ------------------------------------------------------------------------------

MAX_CHAIN: Final = 10
"""The longest chain of follow-ups (a follow-up that books a follow-up that ...)."""

MAX_FOLLOWUP_PROMPT_CHARS: Final = 2000
"""The longest prompt a follow-up may carry, in characters."""

_FOLLOWUP_DESCRIPTION: Final = (
    "Wake yourself up later: after delay_minutes, a new run starts with `prompt` in this "
    "conversation, and its answer is sent to the user. Use it to check back on something that "
    "is not ready yet."
)


class FollowupPlan(BaseModel):
    """A follow-up the agent booked: what the jobs layer enqueues as a delayed ``agent_run``
    with ``deliver=True``, ``origin="followup"`` and ``followup_depth=depth``.

    ``parent_run_id``, ``step`` and ``call_id`` name the tool call that booked it;
    :meth:`derived_run_id` turns them into a run id that is the same when a retried job makes
    the same call again, so enqueueing under it books the follow-up only once.
    """

    model_config = ConfigDict(frozen=True)

    delay_seconds: int = Field(ge=60)
    prompt: str = Field(min_length=1, max_length=MAX_FOLLOWUP_PROMPT_CHARS)
    depth: int = Field(ge=1, le=MAX_CHAIN)
    session: str | None = None
    memory_scope: str | None = None
    parent_run_id: str = "detached"
    step: int = 0
    call_id: str = ""

    @property
    def delay(self) -> timedelta:
        """How long from now the follow-up runs."""
        return timedelta(seconds=self.delay_seconds)

    def derived_run_id(self) -> str:
        """``run_<32 hex digits>`` derived from the booking call; stable across retries."""
        seed = f"followup:{self.parent_run_id}:{self.step}:{self.call_id}"
        return f"run_{hashlib.sha256(seed.encode('utf-8')).hexdigest()[:32]}"


Enqueue: TypeAlias = Callable[[FollowupPlan], Awaitable[str]]
"""Enqueues a follow-up's delayed run and returns its run id."""


def _whole_number(value: object) -> int | None:
    """``value`` as an int when JSON Schema would call it an integer (``5`` or ``5.0``)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


class FollowupTool:
    """The ``schedule_followup`` tool: the agent books its own next wake-up [AP-46].

    Input ``{delay_minutes: integer 1..max, prompt: string}``, both required, where max is
    ``max_delay`` in whole minutes (the schema's ``maximum``). Checked in this order, each
    failure reaching the model as the tool's error:

    1. the chain: a run already ``depth`` follow-ups deep may book one only while
       ``depth + 1 <= MAX_CHAIN``;
    2. ``delay_minutes`` is a whole number in range (a string such as ``"5"`` is refused);
    3. ``prompt``, trimmed, is not empty and has at most 2000 characters.

    Then ``enqueue(plan)`` books the run (same session: the calling run's, else ``session``;
    same ``memory_scope``; depth + 1) and the tool answers ``{"scheduled": true,
    "in_minutes": n, "run_id": <what enqueue returned>}``. An enqueue that fails (no job
    runtime, Redis down) is reported as ``"cannot schedule the follow-up: ..."``.
    Its effect is ``internal``, so read-only heartbeats may book follow-ups too.
    """

    __slots__ = ("_enqueue", "depth", "description", "effect", "input_schema", "max_delay",
                 "max_minutes", "memory_scope", "name", "sequential", "session")  # fmt: skip

    MAX_CHAIN: ClassVar[int] = MAX_CHAIN
    MAX_PROMPT_CHARS: ClassVar[int] = MAX_FOLLOWUP_PROMPT_CHARS

    name: str
    description: str
    input_schema: dict[str, JsonValue]
    effect: ToolEffect
    sequential: bool

    def __init__(
        self,
        enqueue: Enqueue,
        *,
        max_delay: timedelta,
        depth: int = 0,
        session: str | None = None,
        memory_scope: str | None = None,
    ) -> None:
        if not callable(enqueue):
            raise AgentError.config(f"FollowupTool: enqueue must be callable, got {enqueue!r}")
        if not isinstance(max_delay, timedelta) or max_delay < timedelta(minutes=1):
            raise AgentError.config(
                f"FollowupTool: max_delay must be a timedelta of at least one minute, got "
                f"{max_delay!r}"
            )
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
            raise AgentError.config(f"FollowupTool: depth must be an int >= 0, got {depth!r}")
        self._enqueue = enqueue
        self.max_delay = max_delay
        self.max_minutes = int(max_delay.total_seconds()) // 60
        self.depth = depth
        self.session = session
        self.memory_scope = memory_scope
        self.name = "schedule_followup"
        self.description = _FOLLOWUP_DESCRIPTION
        self.effect = ToolEffect.INTERNAL
        self.sequential = False
        self.input_schema = {
            "type": "object",
            "properties": {
                "delay_minutes": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": self.max_minutes,
                    "description": "Minutes from now until the follow-up run starts.",
                },
                "prompt": {
                    "type": "string",
                    "maxLength": MAX_FOLLOWUP_PROMPT_CHARS,
                    "description": "What your future self should do, with every detail it needs.",
                },
            },
            "required": ["delay_minutes", "prompt"],
        }

    def validate(self, arguments: JsonValue) -> str | None:
        """Always None: :meth:`execute` checks the arguments, so the model gets the exact
        texts of the reference, in its order."""
        return None

    def plan(self, arguments: JsonValue, ctx: ToolContext) -> FollowupPlan:
        """Check ``arguments`` and build the follow-up; raise an :class:`AgentError` of kind
        ``tool`` with the text for the model when they are not acceptable."""
        if self.depth + 1 > MAX_CHAIN:
            raise AgentError.tool(
                f"this run is already {self.depth} follow-ups deep; finish now and report "
                "instead of scheduling another"
            )
        given: Mapping[str, JsonValue] = arguments if isinstance(arguments, dict) else {}
        minutes = _whole_number(given.get("delay_minutes"))
        if minutes is None or not 1 <= minutes <= self.max_minutes:
            raise AgentError.tool(
                f"delay_minutes must be a whole number from 1 to {self.max_minutes}"
            )
        prompt = given.get("prompt")
        prompt = prompt.strip() if isinstance(prompt, str) else ""
        if not prompt:
            raise AgentError.tool("give a `prompt` for the follow-up run")
        if len(prompt) > MAX_FOLLOWUP_PROMPT_CHARS:
            raise AgentError.tool(
                f"the follow-up prompt must be at most {MAX_FOLLOWUP_PROMPT_CHARS} characters"
            )
        return FollowupPlan(
            delay_seconds=minutes * 60,
            prompt=prompt,
            depth=self.depth + 1,
            session=ctx.session_id if ctx.session_id is not None else self.session,
            memory_scope=self.memory_scope,
            parent_run_id=ctx.run_id,
            step=ctx.step,
            call_id=ctx.call_id,
        )

    async def execute(self, arguments: JsonValue, ctx: ToolContext) -> dict[str, JsonValue]:
        """Book the follow-up; see the class docstring for the answer and the errors."""
        plan = self.plan(arguments, ctx)
        try:
            run_id = await self._enqueue(plan)
        except AgentError as error:
            raise AgentError.tool(f"cannot schedule the follow-up: {error.message}") from None
        except Exception as error:
            raise AgentError.tool(f"cannot schedule the follow-up: {_describe(error)}") from None
        return {"scheduled": True, "in_minutes": plan.delay_seconds // 60, "run_id": run_id}

    def __repr__(self) -> str:
        return (
            f"FollowupTool(max_delay={self.max_delay!r}, depth={self.depth}, "
            f"session={self.session!r}, memory_scope={self.memory_scope!r})"
        )

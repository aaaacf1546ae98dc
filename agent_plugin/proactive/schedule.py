"""Schedules of a heartbeat: fixed intervals (:class:`EverySchedule`) and cron expressions
(:class:`CronSpec`, :class:`CronSchedule`) evaluated in an IANA timezone, as arq cron fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import Final, TypedDict
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from agent_plugin.errors import AgentError

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
    When both day and weekday are restricted, a date matches when either does, as in Unix
    cron (``0 9 1 * MON``: the 1st of every month, and every Monday). arq matches every field,
    so it is given neither then, and the tick checks the date (:meth:`fires_on`).
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

    @property
    def day_or_weekday(self) -> bool:
        """Both day and weekday are restricted: a date matches when either does."""
        return self.day is not None and self.weekday is not None

    def fires_on(self, when: date) -> bool:
        """Whether the schedule fires on the date ``when`` as far as arq cannot tell: the day
        and weekday rule of Unix cron (every other field is arq's to match)."""
        day, weekday = self.day, self.weekday
        if day is None or weekday is None:
            return True
        return when.day in day or (when.weekday() + 1) % 7 in weekday

    def _has_a_date(self) -> bool:
        if self.day is None or self.weekday is not None:
            return True
        months = self.month if self.month is not None else range(1, 13)
        return any(day <= _DAYS_IN_MONTH[month - 1] for month in months for day in self.day)

    def arq_fields(self) -> CronFields:
        """The same schedule as :func:`arq.cron.cron` keywords (weekday 0 = Monday); with
        both day and weekday restricted, neither (:meth:`fires_on` checks the date)."""
        if self.day_or_weekday:
            day, weekday = None, None
        else:
            day = _mutable(self.day)
            weekday = None if self.weekday is None else {(d - 1) % 7 for d in self.weekday}
        return CronFields(
            month=_mutable(self.month),
            day=day,
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

    def fires_at(self, instant: datetime) -> bool:
        """Always: arq's fields say everything about an interval."""
        return True

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

    def fires_at(self, instant: datetime) -> bool:
        """Whether a tick arq scheduled for ``instant`` is one of the schedule's (see
        :meth:`CronSpec.fires_on`), judged on the date in :attr:`timezone`."""
        return self.spec.fires_on(instant.astimezone(ZoneInfo(self.timezone)).date())

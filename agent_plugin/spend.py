"""Spending windows shared by runs: per session, per memory scope and per UTC day.

:class:`BudgetWindows` are the limits; a :class:`SpendLedger` keeps what each window has
spent and holds (:class:`LocalLedger` in one process, ``agent_plugin.live.spend.RedisLedger``
across workers); :class:`RunSpend` is what one run's model calls go through: a hold of the
call's most expensive outcome before it (every window must have room), settled from the
reported cost after it. A refused hold ends the run, or first allows one wrap-up call.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Final, Literal, Protocol, TypeAlias

from agent_plugin.budget import estimate_messages, estimate_tokens
from agent_plugin.errors import AgentError
from agent_plugin.events import BudgetSpent, BudgetWarning
from agent_plugin.messages import ChatMessage, TokenUsage
from agent_plugin.options import EventSink
from agent_plugin.providers.base import ChatRequest, ChatResponse

if TYPE_CHECKING:
    from agent_plugin.telemetry import RunTelemetry

__all__ = [
    "WRAP_UP_NOTE",
    "BudgetWindows",
    "ExhaustedAction",
    "Hold",
    "LocalLedger",
    "Refused",
    "RunSpend",
    "SpendLedger",
    "Spending",
    "Window",
    "WindowExhausted",
    "WindowName",
    "parent_spend",
    "spend_of_run",
]

logger = logging.getLogger("agent_plugin")

WindowName: TypeAlias = Literal["session", "scope", "day"]
ExhaustedAction: TypeAlias = Literal["wrap_up", "stop"]
Price: TypeAlias = Callable[[TokenUsage, str | None], float | None]
"""What a usage would cost on a model (``None``: the run's), ``None`` when it has no price."""

DAY_TTL: Final = 2 * 86_400
"""How long a day window's totals are kept (seconds): a day, and a day's grace."""

_FIRST_PAUSE: Final = 0.02
_LONGEST_PAUSE: Final = 0.5

WRAP_UP_NOTE: Final = (
    "The spending budget of this conversation is used up. Do no more work with tools: give "
    "your final answer now, as well as you can with what you already have, and say that the "
    "budget ran out."
)


@dataclass(frozen=True, slots=True)
class BudgetWindows:
    """Spending limits in US dollars shared by every run they cover, on every worker.

    ``session_usd`` bounds what the runs of one session spend, ``scope_usd`` what the runs of
    one memory scope (a user, a tenant) spend, ``day_usd`` what all runs spend in a UTC day.
    ``warn_fraction``: a ``budget_warning`` event when a window has spent that share of its
    limit (``None``: never). ``on_exhausted``: ``wrap_up`` (one last call, tools offered but
    ``tool_choice`` none, told to answer now) or ``stop`` (``budget_exhausted`` at once).
    """

    session_usd: float | None = None
    scope_usd: float | None = None
    day_usd: float | None = None
    warn_fraction: float | None = 0.8
    on_exhausted: ExhaustedAction = "wrap_up"

    def __post_init__(self) -> None:
        for name in ("session_usd", "scope_usd", "day_usd"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise AgentError.config(f"budget {name} must be positive, got {value}")
        fraction = self.warn_fraction
        if fraction is not None and not 0 < fraction < 1:
            raise AgentError.config(f"budget warn_fraction must be in (0, 1), got {fraction}")
        if self.on_exhausted not in ("wrap_up", "stop"):
            raise AgentError.config(
                f"budget on_exhausted must be wrap_up or stop, got {self.on_exhausted!r}"
            )

    @property
    def any(self) -> bool:
        return any(v is not None for v in (self.session_usd, self.scope_usd, self.day_usd))

    def of_run(
        self, session_id: str | None, scope: str, now: datetime | None = None
    ) -> tuple[Window, ...]:
        """The windows a run of ``session_id`` in ``scope`` spends from."""
        windows: list[Window] = []
        if self.session_usd is not None and session_id is not None:
            windows.append(Window("session", f"session:{session_id}", self.session_usd))
        if self.scope_usd is not None:
            windows.append(Window("scope", f"scope:{scope}", self.scope_usd))
        if self.day_usd is not None:
            day = (now or datetime.now(UTC)).date().isoformat()
            windows.append(Window("day", f"day:{day}", self.day_usd, ttl=DAY_TTL))
        return tuple(windows)


@dataclass(frozen=True, slots=True)
class Window:
    """One window a call spends from: its ``key`` in the ledger, its limit, how long its
    totals live (``None``: for good)."""

    name: WindowName
    key: str
    limit: float
    ttl: int | None = None


@dataclass(frozen=True, slots=True)
class Hold:
    """Money held in ``windows`` for one call (``amount`` 0: a call made without a hold)."""

    windows: tuple[Window, ...]
    amount: float
    id: str = field(default_factory=lambda: uuid.uuid4().hex)


@dataclass(frozen=True, slots=True)
class Refused:
    """No hold: ``window`` has no room for it (``used``: spent and held there, ``spent``:
    settled alone). ``busy``: there would be room once other calls' holds are settled (the
    caller may wait)."""

    window: Window
    used: float
    spent: float
    busy: bool = False


class SpendLedger(Protocol):
    """Where windows' totals live; both operations are atomic over all the windows given."""

    async def reserve(self, windows: Sequence[Window], amount: float) -> Hold | Refused:
        """Hold ``amount`` in every window if each has room (spent + held + amount <= limit),
        else hold nothing and name a window without room: one whose spent total alone leaves
        none first, else a busy one."""
        ...

    async def settle(self, hold: Hold, cost: float) -> tuple[float, ...]:
        """Replace ``hold`` by what the call cost; each window's spent total after it."""
        ...


class LocalLedger:
    """A :class:`SpendLedger` in this process's memory (runs of one process, tests)."""

    def __init__(self) -> None:
        self.spent_by: dict[str, float] = {}
        self.held: dict[str, float] = {}

    async def reserve(self, windows: Sequence[Window], amount: float) -> Hold | Refused:
        busy: Refused | None = None
        for window in windows:
            spent = self.spent_by.get(window.key, 0.0)
            used = spent + self.held.get(window.key, 0.0)
            if spent + amount > window.limit:
                return Refused(window, used, spent)
            if used + amount > window.limit and busy is None:
                busy = Refused(window, used, spent, busy=True)
        if busy is not None:
            return busy
        for window in windows:
            self.held[window.key] = self.held.get(window.key, 0.0) + amount
        return Hold(tuple(windows), amount)

    async def spent(self, window: Window) -> float:
        """What ``window`` has settled so far."""
        return self.spent_by.get(window.key, 0.0)

    async def settle(self, hold: Hold, cost: float) -> tuple[float, ...]:
        totals: list[float] = []
        for window in hold.windows:
            self.held[window.key] = max(self.held.get(window.key, 0.0) - hold.amount, 0.0)
            self.spent_by[window.key] = self.spent_by.get(window.key, 0.0) + cost
            totals.append(self.spent_by[window.key])
        return tuple(totals)


class WindowExhausted(Exception):
    """A window has no room for the run's next call (and its wrap-up, if any, was made)."""

    def __init__(self, window: WindowName) -> None:
        super().__init__(window)
        self.window: WindowName = window


Ask = Callable[[ChatRequest, ChatMessage | None], Awaitable[ChatResponse]]
"""Make the model call; the message is a note every retried form of the request ends with."""
Pause = Callable[[float], Awaitable[None]]
"""Wait so many seconds (a run's own wait is bounded by its deadline and cancel token)."""


class RunSpend:
    """One run's spending from its windows (see the module's docstring)."""

    def __init__(
        self,
        windows: BudgetWindows,
        ledger: SpendLedger,
        *,
        run_id: str,
        session_id: str | None,
        scope: str,
        price: Price,
        emit: EventSink | None,
        can_wrap_up: bool = True,
        model: str | None = None,
        final_tools: frozenset[str] = frozenset(),
    ) -> None:
        self.windows = windows
        self.ledger = ledger
        self.run_id = run_id
        self.session_id = session_id
        self.scope = scope
        self.price = price
        self.emit = emit
        self.can_wrap_up = can_wrap_up
        self.model = model
        self.final_tools = final_tools
        """The typed output's final-result tools: a wrap-up call must call the one offered."""
        self.wrapped_up = False
        self.warned: set[WindowName] = set()

    def estimate(self, request: ChatRequest) -> float:
        """The most the call can cost: the prompt's estimated tokens (tools included) and
        the whole output cap, at the model's prices (the prompt at the cache-write price
        where that is dearer: the call may write it all to the cache)."""
        prompt = estimate_messages(request.messages)
        if request.tools:
            schemas = [t.model_dump(mode="json") for t in request.tools]
            prompt += estimate_tokens(json.dumps(schemas, separators=(",", ":")))
        output = request.max_tokens or 0
        most = TokenUsage(input_tokens=prompt, output_tokens=output)
        cost = self.price(most, request.model)
        written = TokenUsage(input_tokens=prompt, output_tokens=output, cache_write_tokens=prompt)
        dearer = self.price(written, request.model)
        if cost is not None and dearer is not None:
            cost = max(cost, dearer)
        if cost is None:
            model = request.model or self.model
            raise AgentError.config(
                f"budget windows need the price of every call, and model {model!r} "
                'has none: install the cost extra (genai-prices) or set [agent.prices."<model>"]'
            )
        return cost

    async def call(
        self, request: ChatRequest, ask: Ask, pause: Pause = asyncio.sleep
    ) -> ChatResponse:
        """``ask(request)`` within the run's windows: held (waiting with ``pause`` while other
        calls' holds leave no room), then settled (released on an error). Raises
        :class:`WindowExhausted` when a window has no room and no wrap-up is left; a wrap-up
        call is made unheld, with a note and ``tool_choice`` none (a typed output's
        final-result tool, where one is offered)."""
        windows = self.windows.of_run(self.session_id, self.scope)
        amount = self.estimate(request)
        held = await self.ledger.reserve(windows, amount)
        wait = _FIRST_PAUSE
        while isinstance(held, Refused) and held.busy:  # others' holds may settle below it
            await pause(wait)
            wait = min(wait * 2, _LONGEST_PAUSE)
            held = await self.ledger.reserve(windows, amount)
        note: ChatMessage | None = None
        if isinstance(held, Refused):
            if not self.may_wrap_up(held):
                raise WindowExhausted(held.window.name)
            self.wrapped_up = True
            note = ChatMessage.user(WRAP_UP_NOTE)
            request.tool_choice = self.wrap_up_choice(request)
            request.messages = [*request.messages, note]
            held = Hold(windows, 0.0)
        try:
            response = await ask(request, note)
        except BaseException as stop:
            # a failed call costs nothing; one stopped midway (cancelled, interrupted, out of
            # time) may have been billed, so it counts at its hold, the most it could cost
            billed = 0.0 if isinstance(stop, AgentError) else held.amount
            with contextlib.suppress(AgentError):  # the call's own end is what to tell
                await asyncio.shield(self.ledger.settle(held, billed))
            raise
        cost = response.usage.cost_usd
        try:
            totals = await asyncio.shield(
                self.ledger.settle(held, held.amount if cost is None else cost)
            )
        except AgentError as error:  # the reply stands; the hold lapses in its own time
            logger.warning("run %s: a model call's cost was not settled: %s", self.run_id, error)
            return response
        self.told(held.windows, totals, cost)
        return response

    def may_wrap_up(self, refused: Refused) -> bool:
        """Whether the run makes its one wrap-up call: only while the window has not reached
        its limit, so an exhausted session or scope does not pay one more call per new run."""
        return (
            self.windows.on_exhausted == "wrap_up"
            and self.can_wrap_up
            and not self.wrapped_up
            and refused.spent < refused.window.limit
        )

    def wrap_up_choice(self, request: ChatRequest) -> str | None:
        """``none``, or the typed output's one final-result tool (``None``: no tools)."""
        finals = [t.name for t in request.tools if t.name in self.final_tools]
        if len(finals) == 1:
            return finals[0]
        return "none" if request.tools else request.tool_choice

    def told(self, windows: Sequence[Window], totals: Sequence[float], cost: float | None) -> None:
        if self.emit is None:
            return
        spent = {w.name: total for w, total in zip(windows, totals, strict=True)}
        self.emit(BudgetSpent(run_id=self.run_id, cost_usd=cost, windows=spent))
        fraction = self.windows.warn_fraction
        if fraction is None:
            return
        for window, total in zip(windows, totals, strict=True):
            if window.name not in self.warned and total >= fraction * window.limit:
                self.warned.add(window.name)
                self.emit(
                    BudgetWarning(
                        run_id=self.run_id,
                        window=window.name,
                        spent_usd=total,
                        limit_usd=window.limit,
                    )
                )


@dataclass(frozen=True, slots=True)
class Spending:
    """An agent's windows, the ledger that keeps them and the memory scope its runs are of."""

    windows: BudgetWindows
    ledger: SpendLedger
    scope: str

    def run(
        self,
        *,
        run_id: str,
        telemetry: RunTelemetry,
        emit: EventSink | None,
        final_tools: frozenset[str] = frozenset(),
        session_id: str | None = None,
    ) -> RunSpend:
        """The spending of one run (``final_tools``: its typed output's final-result tools);
        a model whose endpoint cannot take ``tool_choice`` gets no wrap-up call (the run
        stops ``budget_exhausted`` instead)."""
        profile = getattr(telemetry.client, "profile", None)  # an EndpointProfile, if any
        return RunSpend(
            self.windows,
            self.ledger,
            run_id=run_id,
            session_id=session_id if session_id is not None else telemetry.session_id,
            scope=self.scope,
            price=telemetry.cost_of,
            emit=emit,
            can_wrap_up=getattr(profile, "tool_choice", True) is not False,
            model=telemetry.model,
            final_tools=final_tools,
        )


parent_spend: ContextVar[RunSpend | None] = ContextVar("parent_spend", default=None)
"""The spending of the run whose tools are running (set around each round of tool calls)."""


def spend_of_run(
    own: Spending | None,
    *,
    run_id: str,
    telemetry: RunTelemetry,
    emit: EventSink | None,
    final_tools: frozenset[str] = frozenset(),
) -> RunSpend | None:
    """The spending of a run: from its agent's own windows, else (a sub-agent run inside a
    parent's tool call) from the parent run's windows, session and scope; else none."""
    if own is None:
        parent = parent_spend.get()
        if parent is None:
            return None
        own = Spending(parent.windows, parent.ledger, parent.scope)
        session_id = parent.session_id
    else:
        session_id = None
    return own.run(
        run_id=run_id,
        telemetry=telemetry,
        emit=emit,
        final_tools=final_tools,
        session_id=session_id,
    )

"""Asking the model, as a run does: bounded, interruptible, its retries closed, overflow met.

A run's model call is the client's own call (or its stream, read to the end), bounded by the
run's deadline and cancel token when it has them, abandoned when an ``interrupt`` message
comes first, and answered by one fold of the history when the provider says the context is
too long. Every ``retry_scheduled`` event the call caused gets its end event here. With a
pacer, the call first waits its turn under the pacing limits (a ``pacing_wait`` event); with
spending windows, it goes through the run's :class:`~agent_plugin.spend.RunSpend`.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from agent_plugin.cancellation import CancelToken, RunCancelled, until_cancelled
from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.events import ModelFallback, PacingWait
from agent_plugin.messages import ChatMessage
from agent_plugin.model_stream import read_stream
from agent_plugin.options import EventSink
from agent_plugin.pacing import LimitName, Pacer, heard_headers
from agent_plugin.providers.base import ChatRequest, ChatResponse, LlmClient
from agent_plugin.providers.retry import RetryNotice
from agent_plugin.retrying import CallRetries
from agent_plugin.spend import spend_of_run
from agent_plugin.steering import Steering

if TYPE_CHECKING:
    from agent_plugin.output import Output
    from agent_plugin.providers.base import FallbackNotice
    from agent_plugin.spend import RunSpend, Spending
    from agent_plugin.telemetry import RunTelemetry

__all__ = ["DeadlinePassed", "Interrupted", "ModelCaller"]


class DeadlinePassed(Exception):
    """The run's deadline passed during the model call."""


class Interrupted(Exception):
    """An ``interrupt`` message came while the model was asked: ask again with it."""


Refold = Callable[[], Awaitable[list[ChatMessage] | None]]
"""Fold the run's history and return the messages to send instead (``None``: it cannot): a
bound method of the run (see :attr:`ModelCaller.refold`)."""


class ModelCaller:
    """How one run asks its model (see the module's docstring)."""

    __slots__ = (
        "cancel",
        "deadline",
        "emit",
        "model",
        "output",
        "pacer",
        "refold",
        "retries",
        "run_id",
        "spend",
        "steering",
        "streaming",
        "telemetry",
    )

    def __init__(
        self,
        model: LlmClient,
        *,
        run_id: str,
        telemetry: RunTelemetry,
        output: Output[Any] | None,
        streaming: bool,
        emit: EventSink | None,
        deadline: float | None,
        cancel: CancelToken | None,
        steering: Steering | None,
        refold: Refold,
        pacer: Pacer | None = None,
        spending: Spending | None = None,
    ) -> None:
        self.model = model
        self.run_id = run_id
        self.telemetry = telemetry
        self.output = output
        self.streaming = streaming
        self.emit = emit
        self.deadline = deadline
        self.cancel = cancel
        self.steering = steering
        self.refold = weakref.WeakMethod(refold)
        """The run's way to fold its history after an overflow, held weakly: the run holds its
        caller, and a caller holding the run back would make every run a reference cycle,
        which only the cyclic garbage collector frees (in a busy worker, by full collections
        of the whole heap) instead of reference counting, as the run ends."""
        self.pacer = pacer
        finals = output.tool_names() if output is not None else frozenset()
        self.spend: RunSpend | None = spend_of_run(
            spending, run_id=run_id, telemetry=telemetry, emit=emit, final_tools=finals
        )
        self.retries = CallRetries(run_id, emit) if emit is not None else None

    @property
    def observes_retries(self) -> bool:
        """Whether a retry is told to anyone (else the request carries no callback)."""
        return self.emit is not None or self.telemetry.active

    async def answer(self, request: ChatRequest) -> ChatResponse:
        """The model's reply to ``request``: its retries closed by their end event, and a
        context overflow met by folding the history once and asking again.

        Raises :class:`DeadlinePassed`, :class:`Interrupted` or
        :class:`~agent_plugin.cancellation.RunCancelled` when the call was stopped, and
        :class:`~agent_plugin.spend.WindowExhausted` when a spending window has no room.
        """
        if self.spend is None:
            return await self.ask(request, None)
        return await self.spend.call(request, self.ask, self.pause)

    async def pause(self, seconds: float) -> None:
        """Wait ``seconds`` (for a spending window's room), within the deadline and the
        cancel token."""
        deadline = self.deadline
        if deadline is not None and asyncio.get_running_loop().time() + seconds >= deadline:
            raise DeadlinePassed
        await until_cancelled(asyncio.sleep(seconds), self.cancel)

    async def ask(self, request: ChatRequest, note: ChatMessage | None) -> ChatResponse:
        """:meth:`answer` without the spending windows; ``note`` (a wrap-up's instruction)
        stays the last message of a folded history too."""
        retries = self.retries
        steering = self.steering
        folded = False
        while True:
            try:
                call = self.call(request)
                if steering is None:
                    response = await call
                else:
                    response = await self.interruptible(call, steering)
            except (DeadlinePassed, RunCancelled, Interrupted) as stop:
                if retries is not None:
                    retries.failed(
                        None, "deadline" if isinstance(stop, DeadlinePassed) else "cancelled"
                    )
                raise
            except AgentError as error:
                if retries is not None:
                    retries.failed(error)
                if folded or error.kind is not ErrorKind.CONTEXT_TOO_LONG:
                    raise
                refold = self.refold()
                messages = None if refold is None else await refold()
                if messages is None:
                    raise
                folded = True
                # the same request with the folded history (a hook's edits to it are not kept)
                request.messages = messages if note is None else [*messages, note]
                continue
            if retries is not None:
                retries.succeeded()
            return response

    def call(self, request: ChatRequest) -> Awaitable[ChatResponse]:
        """The model call, bounded by the deadline and the cancel token when the run has them
        (without them, the client's own call: a coroutine fewer alive across the call)."""
        call = self.send(request) if self.pacer is None else self.paced(self.pacer, request)
        if self.deadline is None and self.cancel is None:
            return call
        return self.bounded(call)

    def send(self, request: ChatRequest) -> Awaitable[ChatResponse]:
        """The client's call (or stream, read to the end) inside its span."""
        return self.telemetry.chat(
            read_stream(self.model, request, run_id=self.run_id, emit=self.emit, output=self.output)
            if self.streaming
            else self.model.chat(request),
            request,
        )

    async def paced(self, pacer: Pacer, request: ChatRequest) -> ChatResponse:
        """The call once the pacer lets it go (a wait past the deadline is the deadline); then
        the pacer hears the provider's rate-limit headers and gets back the tokens of the
        estimate the call did not use (all of them when it failed)."""
        from agent_plugin.budget import estimate_messages

        provider = self.telemetry.provider
        model = request.model or self.telemetry.model or "default"
        tokens = estimate_messages(request.messages) + (request.max_tokens or 0)
        deadline = self.deadline
        left = None if deadline is None else deadline - asyncio.get_running_loop().time()
        wait = await pacer.acquire(provider, model, tokens, max_wait=left)
        if not wait.granted:
            raise DeadlinePassed
        heard: list[Mapping[str, str]] = []
        listening = heard_headers.set(heard.append)
        try:
            if wait.limit is not None and wait.seconds > 0:
                await self.pacing_wait(wait.seconds, wait.limit, model)
            response = await self.send(request)
        except BaseException:  # failed or stopped, waiting or asking: the estimate comes back
            given_back = pacer.observe(
                provider, model, heard[-1] if heard else None, unused_tokens=tokens
            )
            await asyncio.shield(given_back)
            raise
        finally:
            heard_headers.reset(listening)
        used = response.usage.total()
        unused = tokens - used if used else 0  # no usage reported: keep the estimate
        await pacer.observe(provider, model, heard[-1] if heard else None, unused_tokens=unused)
        return response

    async def pacing_wait(self, seconds: float, limit: LimitName, model: str) -> None:
        """Wait ``seconds`` for the pacing ``limit``, told as an event and a span."""
        if self.emit is not None:
            self.emit(
                PacingWait(
                    run_id=self.run_id,
                    wait_seconds=round(seconds, 3),
                    limit=limit,
                    provider=self.telemetry.provider,
                    model=model,
                )
            )
        with self.telemetry.paced(seconds, limit, model):
            await asyncio.sleep(seconds)

    async def bounded(self, call: Awaitable[ChatResponse]) -> ChatResponse:
        try:
            async with asyncio.timeout_at(self.deadline):
                return await until_cancelled(call, self.cancel)
        except TimeoutError:
            if self.deadline is not None and asyncio.get_running_loop().time() >= self.deadline:
                raise DeadlinePassed from None
            raise

    async def interruptible(
        self, call: Awaitable[ChatResponse], steering: Steering
    ) -> ChatResponse:
        """``call``, abandoned when an ``interrupt`` message comes first."""
        try:
            return await until_cancelled(call, steering.interrupt)
        except RunCancelled:
            if self.cancel is not None and self.cancel.cancelled:
                raise
            raise Interrupted from None

    def on_retry(self, notice: RetryNotice) -> None:
        self.telemetry.retried(notice)
        if self.retries is not None:
            self.retries.scheduled(notice)

    def on_fallback(self, notice: FallbackNotice) -> None:
        self.telemetry.fell_back(notice)
        if self.emit is not None:
            self.emit(
                ModelFallback(
                    run_id=self.run_id,
                    from_model=notice.from_model,
                    to_model=notice.to_model,
                    error=notice.error.info(),
                )
            )

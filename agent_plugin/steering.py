"""Messages for a run that is going on, and when each joins the conversation (its mode).

* ``steer``: before the next model call (a run about to finish with an answer goes on);
* ``followup``: when the run would end with an answer: it goes on with the message instead
  of ending, one follow-up at a time;
* ``collect``: like ``followup``, but every message collected meanwhile joins as one;
* ``interrupt``: at once: a model call in flight is abandoned (its reply is never recorded)
  and asked again with the message; a tool round still finishes first.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, Literal, TypeAlias, get_args

from agent_plugin.cancellation import CancelToken
from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.messages import ChatMessage, Role

__all__ = ["DEFAULT_MAX_QUEUED", "MESSAGE_MODES", "MessageMode", "Steering", "queue_full"]

MessageMode: TypeAlias = Literal["steer", "followup", "collect", "interrupt"]
MESSAGE_MODES: Final[tuple[MessageMode, ...]] = get_args(MessageMode)

DEFAULT_MAX_QUEUED: Final = 32
"""Messages a run holds at most before they join it; one more is refused."""


def queue_full(limit: int) -> AgentError:
    """The error for a message beyond a run's bound of queued messages."""
    return AgentError(
        ErrorKind.CONFLICT,
        f"the run already holds {limit} messages that have not joined it yet: wait until it "
        "takes them",
    )


class Steering:
    """The messages sent to a run that is going on, by mode (see the module).

    ``send`` may be called at any time, from any task. ``default_mode`` is the mode of a
    message sent without one; at most ``max_queued`` messages wait at once (``None``: no
    bound), one more is a ``conflict`` error. ``on_taken`` hears how many messages joined the
    run each time some did.
    """

    def __init__(
        self,
        *,
        default_mode: MessageMode = "steer",
        max_queued: int | None = DEFAULT_MAX_QUEUED,
        on_taken: Callable[[int], None] | None = None,
    ) -> None:
        if default_mode not in MESSAGE_MODES:
            raise AgentError.config(f"unknown message mode {default_mode!r}")
        if max_queued is not None and max_queued < 1:
            raise AgentError.config(f"max_queued must be at least 1, got {max_queued}")
        self.default_mode: MessageMode = default_mode
        self.max_queued = max_queued
        self.on_taken = on_taken
        self._queue: list[ChatMessage] = []
        self._followups: list[ChatMessage] = []
        self._collected: list[ChatMessage] = []
        self.interrupt = CancelToken()
        """Fired by an ``interrupt`` message: the model call in flight is abandoned."""

    def __repr__(self) -> str:
        return f"Steering(queued={self.queued})"

    @property
    def queued(self) -> int:
        return len(self._queue) + len(self._followups) + len(self._collected)

    def send(self, message: str | ChatMessage, mode: MessageMode | None = None) -> None:
        message = ChatMessage.user(message) if isinstance(message, str) else message
        if message.role is not Role.USER:
            raise AgentError.config(
                f"steering messages are user messages, got {message.role.value}"
            )
        mode = self.default_mode if mode is None else mode
        if mode not in MESSAGE_MODES:
            raise AgentError.config(f"unknown message mode {mode!r}")
        if self.max_queued is not None and self.queued >= self.max_queued:
            raise queue_full(self.max_queued)
        if mode == "followup":
            self._followups.append(message)
        elif mode == "collect":
            self._collected.append(message)
        else:
            self._queue.append(message)
            if mode == "interrupt":
                self.interrupt.cancel("interrupted by a message")

    @property
    def pending(self) -> bool:
        """Messages wait to join before the next model call."""
        return bool(self._queue)

    @property
    def following(self) -> bool:
        """Messages wait for the run to end with an answer."""
        return bool(self._followups or self._collected)

    def drain(self) -> list[ChatMessage]:
        """Every message that joins before the next model call, oldest first (an interrupt
        that was heard is over)."""
        taken, self._queue = self._queue, []
        if self.interrupt.cancelled:
            self.interrupt = CancelToken()
        self._taken(len(taken))
        return taken

    def take_followup(self) -> list[ChatMessage]:
        """What joins when the run would end: the oldest ``followup`` message, else every
        collected one as one message (empty: none waits)."""
        if self._followups:
            self._taken(1)
            return [self._followups.pop(0)]
        if not self._collected:
            return []
        collected, self._collected = self._collected, []
        self._taken(len(collected))
        if len(collected) == 1:
            return collected
        return [ChatMessage.user("\n\n".join(m.text for m in collected))]

    def _taken(self, count: int) -> None:
        if count and self.on_taken is not None:
            self.on_taken(count)

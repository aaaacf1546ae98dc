"""Steering a running run: messages that join the conversation before its next model call."""

from __future__ import annotations

from agent_plugin.errors import AgentError
from agent_plugin.messages import ChatMessage, Role

__all__ = ["Steering"]


class Steering:
    """A queue of user messages for a run that is going on.

    ``send`` may be called at any time, from any task; the run takes every queued message
    before its next model request, in order. A run about to finish with an answer takes a
    message that arrived meanwhile and goes on instead: steering always wins.
    """

    def __init__(self) -> None:
        self._queue: list[ChatMessage] = []

    def __repr__(self) -> str:
        return f"Steering(queued={len(self._queue)})"

    def send(self, message: str | ChatMessage) -> None:
        message = ChatMessage.user(message) if isinstance(message, str) else message
        if message.role is not Role.USER:
            raise AgentError.config(
                f"steering messages are user messages, got {message.role.value}"
            )
        self._queue.append(message)

    @property
    def pending(self) -> bool:
        return bool(self._queue)

    def drain(self) -> list[ChatMessage]:
        """Every queued message, oldest first; the queue is empty afterwards."""
        taken, self._queue = self._queue, []
        return taken

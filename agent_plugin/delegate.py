"""Subagents: a whole child :class:`~agent_plugin.agent.Agent` used as one tool.

The parent model hands a task to a helper with its own prompt, tools and budgets; the helper runs
fresh (it sees only its system prompt and the task, never the parent's conversation), and only
its answer comes back. Its transcript never enters the parent's.

The child's token usage belongs to the parent run: :class:`AgentTool` reports it to
:data:`child_usage_sink`, which the parent loop sets around tool execution to add the usage to
the run's usage and budget. Cancelling the parent cancels the child: the child runs inside the
tool call, so the cancellation of the call reaches the child's model and tool calls.
"""

from __future__ import annotations

from typing import Final

from pydantic import JsonValue

from agent_plugin.agent import Agent
from agent_plugin.errors import AgentError
from agent_plugin.events import AgentEvent, ModelResponded
from agent_plugin.messages import TokenUsage
from agent_plugin.options import RunOptions
from agent_plugin.outcomes import AwaitingApproval, Completed
from agent_plugin.rounds import child_usage_sink
from agent_plugin.tools import ToolContext, ToolEffect
from agent_plugin.tools.base import check_name, coerce_effect

__all__ = ["APPROVAL_NEEDED", "STOPPED_EARLY", "AgentTool", "child_usage_sink"]

APPROVAL_NEEDED: Final = "the helper needs a person to approve an action; do it another way"
STOPPED_EARLY: Final = "the helper stopped before it finished"

_SCHEMA: Final[dict[str, JsonValue]] = {
    "type": "object",
    "properties": {
        "task": {
            "type": "string",
            "description": (
                "The task, with every detail the helper needs: it cannot see this conversation."
            ),
        }
    },
    "required": ["task"],
}


class _Meter:
    """Adds up the usage of a child's model responses, from its events."""

    __slots__ = ("usage",)

    def __init__(self) -> None:
        self.usage = TokenUsage()

    def __call__(self, event: AgentEvent) -> None:
        if isinstance(event, ModelResponded):
            self.usage = self.usage + event.usage


class AgentTool:
    """Wraps a child :class:`Agent` as a tool taking ``{"task": string}``.

    The child runs on the trimmed task with no history. A completed child returns
    ``{"answer": <text>, "tokens": <child usage total>}``; a child waiting for approval returns
    ``{"error": APPROVAL_NEEDED}``; any other outcome returns ``{"error": STOPPED_EARLY,
    "outcome": <outcome JSON>}`` (without a paused child's run state, which holds its
    transcript). A child that raises fails the call with its error's message. A missing or blank
    task is the tool error ``give the `task` to delegate``.

    ``effect`` should be the strongest effect among the child's tools; the default ``write``
    assumes the helper may change the application's data.
    """

    __slots__ = ("_agent", "_description", "_effect", "_name")

    def __init__(
        self,
        agent: Agent,
        *,
        name: str,
        description: str,
        effect: ToolEffect = ToolEffect.WRITE,
    ) -> None:
        check_name(name, f"AgentTool {name!r}")
        self._agent = agent
        self._name = name
        self._description = str(description)
        self._effect = coerce_effect(effect, f"AgentTool {name!r}")

    @property
    def name(self) -> str:
        return self._name

    @property
    def description(self) -> str:
        return self._description

    @property
    def input_schema(self) -> dict[str, JsonValue]:
        return _SCHEMA

    @property
    def effect(self) -> ToolEffect:
        return self._effect

    @property
    def sequential(self) -> bool:
        return False

    @property
    def agent(self) -> Agent:
        """The child agent."""
        return self._agent

    def validate(self, arguments: JsonValue) -> str | None:
        """Always None: :meth:`execute` checks the input and explains what is wrong."""
        return None

    async def execute(self, arguments: JsonValue, ctx: ToolContext) -> dict[str, JsonValue]:
        task = arguments.get("task") if isinstance(arguments, dict) else None
        if not isinstance(task, str) or not task.strip():
            raise AgentError.tool("give the `task` to delegate")
        sink = child_usage_sink.get()
        meter = _Meter()
        usage: TokenUsage | None = None
        unset = child_usage_sink.set(None)
        try:
            outcome = (
                await self._agent.run(task.strip(), options=RunOptions(on_event=meter))
            ).outcome
            usage = outcome.usage
        finally:
            child_usage_sink.reset(unset)
            if sink is not None:
                sink(usage if usage is not None else meter.usage)
        if isinstance(outcome, Completed):
            return {"answer": outcome.text, "tokens": usage.total()}
        if isinstance(outcome, AwaitingApproval):
            return {"error": APPROVAL_NEEDED}
        return {
            "error": STOPPED_EARLY,
            "outcome": outcome.model_dump(mode="json", exclude={"state"}),
        }

    def __repr__(self) -> str:
        return f"AgentTool(name={self._name!r}, effect={self._effect.value!r})"

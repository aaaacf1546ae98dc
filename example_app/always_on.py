"""An always-on agent in one process, on a scripted model: no network, no Redis, no API key.

Run it from the repository root::

    python -m example_app.always_on

It walks through the always-on story in three acts:

1. **Memory.** Mark tells the agent who he is and what he cares about; the agent writes it to
   its ``user`` memory block, which every later run (heartbeat ticks included) sees.
2. **An approval.** Mark asks for a restart; the agent pauses before the external-effect tool,
   the paused run goes through JSON (as it would through a database), a person approves, and
   the run finishes.
3. **Two heartbeat ticks** in the ``ops`` session. The first finds nothing and answers
   ``HEARTBEAT_OK``: nothing is delivered. The second finds a failed backup; its attempt to
   restart something is denied (ticks are read-only), and its report is delivered.

Here the ticks are started by hand with :func:`~agent_plugin.proactive.heartbeat_tick`; in an
app, ``AgentPlugin(heartbeat=...)`` makes every arq worker run them on schedule, each as a
tracked background run whose report goes to the plugin's ``delivery`` (see the README's
"Always-on agents").
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Annotated, Final

from agent_plugin import (
    ApprovalDecision,
    AwaitingApproval,
    RunState,
    ScriptedModel,
    ToolEffect,
    ToolRules,
    sessions,
    tool,
)
from agent_plugin.config import AgentSettings
from agent_plugin.memory import InMemoryMemoryStore
from agent_plugin.messages import ToolResultPart
from agent_plugin.options import AgentOverrides, RunOptions
from agent_plugin.outcomes import AgentOutcome
from agent_plugin.proactive import (
    Heartbeat,
    Report,
    ReportSource,
    deliver_outcome,
    heartbeat_tick,
)
from agent_plugin.providers.scripted import tool_call
from agent_plugin.runtime import AgentRuntime
from agent_plugin.sessions import InMemorySessionStore
from agent_plugin.web import AgentPlugin

__all__ = ["PrintDelivery", "main"]

SESSION: Final = "ops"


@tool(effect=ToolEffect.READ_ONLY)
def check_backups() -> dict[str, str]:
    """The state of last night's backup (demo data)."""
    return {"nightly": "failed at 02:00: disk full on backup-01"}


@tool(effect=ToolEffect.EXTERNAL)
def restart_service(service: Annotated[str, "The service to restart, for example web"]) -> str:
    """Restart a service. Acts on the world, so it needs approval."""
    return f"{service} restarted"


class PrintDelivery:
    """A :class:`~agent_plugin.proactive.Delivery` that prints reports (a real app mails them,
    posts them to chat, or uses :class:`~agent_plugin.proactive.WebhookDelivery`)."""

    def __init__(self) -> None:
        self.reports: list[Report] = []

    async def deliver(self, report: Report) -> None:
        self.reports.append(report)
        print(f"   >> report to {report.session_id or '-'} ({report.source.value}): {report.text}")


def scripted_model() -> ScriptedModel:
    """The model's replies, in order: the story's script."""
    return ScriptedModel(
        [
            # act 1: remember who Mark is
            tool_call(
                "memory",
                {
                    "action": "add",
                    "block": "user",
                    "text": "Mark; wants to hear at once when the nightly backup fails",
                },
            ),
            "Noted, Mark: I will tell you when the nightly backup fails.",
            # act 2: a restart, which waits for approval
            tool_call("restart_service", {"service": "web"}),
            "The web server was restarted.",
            # act 3, first tick: nothing to report
            "HEARTBEAT_OK",
            # act 3, second tick: a failed backup; the restart attempt is denied
            [tool_call("check_backups"), tool_call("restart_service", {"service": "backup"})],
            "Mark, the nightly backup failed at 02:00 (disk full on backup-01). I could not "
            "restart the backup service from a check-in: please free some space and restart it.",
        ]
    )


async def tick(heartbeat: Heartbeat, runtime: AgentRuntime, number: int) -> None:
    """One heartbeat tick, run in this process: what a worker's ``agent_heartbeat`` job and the
    ``agent_run`` job it enqueues do together."""
    run_id = f"run_tick_{number}"

    async def start_run(
        prompt: str, session: str | None, scope: str | None, read_only: bool
    ) -> AgentOutcome:
        overrides = AgentOverrides(memory_scope=scope, session=session, read_only=read_only)
        agent = runtime.agent_for(overrides)
        assert session is not None
        turn = await sessions.run(
            agent,
            prompt,
            session=session,
            store=runtime.session_store,
            options=RunOptions(run_id=run_id),
        )
        names = {c.id: c.name for m in turn.new_messages for c in m.tool_calls}
        for message in turn.new_messages:
            for part in message.content:
                if isinstance(part, ToolResultPart):
                    result = part.tool_result
                    print(f"   tick {number}: {names[result.tool_call_id]} -> {result.content}")
        await deliver_outcome(
            runtime.delivery,
            turn.outcome,
            source=ReportSource.HEARTBEAT,
            run_id=run_id,
            session_id=session,
        )
        return turn.outcome

    result = await heartbeat_tick(heartbeat, runtime, start_run)
    outcome = result.run
    assert outcome is not None
    answer = getattr(outcome, "text", outcome.status)
    print(f"   tick {number}: the agent answered {answer!r}")


async def main() -> None:
    delivery = PrintDelivery()
    plugin = AgentPlugin(
        tools=[check_backups, restart_service],
        policy=ToolRules.ask_before_acting(),
        model=scripted_model(),
        session_store=InMemorySessionStore(),
        memory_store=InMemoryMemoryStore(),
        delivery=delivery,
        settings=AgentSettings(provider="scripted", max_steps=5),
    )
    heartbeat = Heartbeat.every(timedelta(minutes=30), session=SESSION)
    async with plugin.open() as agent:
        runtime = agent.runtime
        print("1. Memory: the agent remembers who it works for")
        turn = await agent.chat(SESSION, "I'm Mark. Tell me at once if the nightly backup fails.")
        print(f"   agent: {getattr(turn.outcome, 'text', turn.outcome.status)}")
        assert runtime.memory_store is not None
        [user] = [b for b in await runtime.memory_store.load("agent") if b.label == "user"]
        print(f"   user memory: {user.entries}")

        print("\n2. An approval: the restart waits for a person")
        outcome = (await agent.run("Restart the web server, please.")).outcome
        assert isinstance(outcome, AwaitingApproval)
        [waiting] = outcome.state.awaiting()
        print(f"   paused: {waiting.call.name} {waiting.call.arguments} needs approval")
        state = RunState.model_validate_json(outcome.state.model_dump_json())  # via storage
        turn = await agent.resume(state, [ApprovalDecision.approve(waiting.call.id)])
        print(f"   approved; agent: {getattr(turn.outcome, 'text', turn.outcome.status)}")

        print(f"\n3. Heartbeat ({heartbeat.description()}), read-only ticks in {SESSION!r}")
        await tick(heartbeat, runtime, 1)
        await tick(heartbeat, runtime, 2)
        print(f"   reports delivered: {len(delivery.reports)} (the silent tick sent none)")


if __name__ == "__main__":
    asyncio.run(main())

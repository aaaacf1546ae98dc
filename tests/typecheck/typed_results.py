"""Checked by ``mypy --strict`` (``tests/test_output_types.py``), never run: the output type of
an agent flows through the generics, so a type checker knows what ``outcome.output`` is."""

from __future__ import annotations

from dataclasses import dataclass
from typing import assert_type

from pydantic import BaseModel
from typing_extensions import TypedDict

from agent_plugin import (
    Agent,
    AgentTurn,
    AwaitingApproval,
    Completed,
    Output,
    OutputContext,
    sessions,
)
from agent_plugin.testing import ScriptedModel
from agent_plugin.web import AppAgent


class Ticket(BaseModel):
    title: str


class Refund(BaseModel):
    amount: float


@dataclass
class Point:
    x: int


class Span(TypedDict):
    start: int


model = ScriptedModel()


def check_ticket(ctx: OutputContext, ticket: Ticket) -> Ticket:
    return ticket


def title_of(ctx: OutputContext, ticket: Ticket) -> str:
    """Not a validator of tickets: it does not give a Ticket back."""
    return ticket.title


async def agents() -> None:
    assert_type(Agent(model), Agent[str])
    assert_type(Agent(model, output_type=Ticket), Agent[Ticket])
    assert_type(Agent(model, output_type=list[int]), Agent[list[int]])
    assert_type(Agent(model, output_type=int), Agent[int])
    assert_type(Agent(model, output_type=Point), Agent[Point])
    assert_type(Agent(model, output_type=Span), Agent[Span])
    assert_type(Agent(model, output_type=Output(Ticket, mode="native")), Agent[Ticket])
    assert_type(Agent(model, output_type=Ticket, output_validators=[check_ticket]), Agent[Ticket])
    union: Agent[Ticket | Refund] = Agent(model, output_type=Ticket | Refund)
    assert_type(union, Agent[Ticket | Refund])
    listed: Agent[Ticket | Refund] = Agent(model, output_type=[Ticket, Refund])
    assert_type(listed, Agent[Ticket | Refund])
    Agent(model, output_type=Ticket, output_validators=[title_of])  # type: ignore[list-item]


async def outcomes() -> None:
    turn = await Agent(model, output_type=Ticket).run("file a ticket")
    assert_type(turn, AgentTurn[Ticket])
    if isinstance(turn.outcome, Completed):
        assert_type(turn.outcome, Completed[Ticket])
        assert_type(turn.outcome.output, Ticket)
        assert_type(turn.outcome.output.title, str)
        _ = turn.outcome.output.amount  # type: ignore[attr-defined]

    text = await Agent(model).run("hello")
    if isinstance(text.outcome, Completed):
        assert_type(text.outcome.output, str)

    union: Agent[Ticket | Refund] = Agent(model, output_type=Ticket | Refund)
    either = await union.run("go")
    if isinstance(either.outcome, Completed):
        assert_type(either.outcome.output, Ticket | Refund)

    if isinstance(turn.outcome, AwaitingApproval):
        resumed = await Agent(model, output_type=Ticket).resume(turn.outcome.state)
        assert_type(resumed, AgentTurn[Ticket])

    saved = await sessions.run(Agent(model, output_type=Point), "go", session="s")
    assert_type(saved, AgentTurn[Point])


async def handle(agent: AppAgent) -> None:
    assert_type(await agent.run("go"), AgentTurn[str])
    assert_type(await agent.run("go", output_type=Ticket), AgentTurn[Ticket])
    assert_type(await agent.chat("s", "go", output_type=list[Ticket]), AgentTurn[list[Ticket]])
    assert_type(agent.agent(output_type=Refund), Agent[Refund])

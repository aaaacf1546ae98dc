"""fastapi-agent-plugin: a provider-agnostic LLM agent for FastAPI apps.

The names a user imports live here; wire clients are in :mod:`agent_plugin.providers`. The
FastAPI, arq and settings names (``AgentPlugin``, ``AgentHandle``, ``RunHandle``,
``JobOptions``, ...) load on first use, so the agent core imports without FastAPI,
pydantic-settings, arq or a database driver; so do the typed-output names (``Output``,
``ModelRetry``, ``OutputContext``).
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

from agent_plugin.agent import Agent
from agent_plugin.cancellation import CancelToken
from agent_plugin.errors import AgentError, ErrorKind, PrefixLocked, SessionLocked
from agent_plugin.events import AgentEvent, OutcomeSummary
from agent_plugin.hooks import (
    AgentHooks,
    Block,
    CancelRun,
    Continue,
    Modify,
    NextTurn,
    PauseRun,
    ToolOutput,
    TurnInfo,
)
from agent_plugin.ids import RunId, SessionId, new_run_id
from agent_plugin.loop_guard import LoopGuard
from agent_plugin.messages import ChatMessage, Role, TokenUsage, ToolCall, ToolDefinition
from agent_plugin.options import AgentOverrides, EventSink, RunOptions
from agent_plugin.outcomes import (
    AgentOutcome,
    AgentTurn,
    ApprovalDecision,
    AwaitingApproval,
    BudgetExhausted,
    Cancelled,
    Completed,
    LoopDetected,
    OutputInvalid,
    Paused,
    RunInfo,
    RunState,
)
from agent_plugin.policy import ALLOW, ASK, AllowAll, Strictest, ToolPolicy, ToolRules, deny
from agent_plugin.providers.base import ChatRequest, ChatResponse, LlmClient
from agent_plugin.providers.retry import RetryPolicy
from agent_plugin.providers.scripted import ScriptedModel
from agent_plugin.tools import FnTool, Tool, ToolContext, ToolEffect, ToolRegistry, ToolReturn, tool

if TYPE_CHECKING:
    from agent_plugin.config import AgentSettings
    from agent_plugin.jobs import JobOptions, RunHandle
    from agent_plugin.output import ModelRetry, Output, OutputContext, OutputMode
    from agent_plugin.records import RunRecord, RunStatus
    from agent_plugin.runtime import AgentRuntime
    from agent_plugin.web import AgentHandle, AgentPlugin, AppAgent

__version__ = "0.1.0"

_LAZY = {
    "AgentHandle": "agent_plugin.web",
    "AgentPlugin": "agent_plugin.web",
    "AgentRuntime": "agent_plugin.runtime",
    "AgentSettings": "agent_plugin.config",
    "AppAgent": "agent_plugin.web",
    "JobOptions": "agent_plugin.jobs",
    "ModelRetry": "agent_plugin.output",
    "Output": "agent_plugin.output",
    "OutputContext": "agent_plugin.output",
    "OutputMode": "agent_plugin.output",
    "RunHandle": "agent_plugin.jobs",
    "RunRecord": "agent_plugin.records",
    "RunStatus": "agent_plugin.records",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'agent_plugin' has no attribute {name!r}")
    return getattr(import_module(module), name)


__all__ = [
    "ALLOW",
    "ASK",
    "Agent",
    "AgentError",
    "AgentEvent",
    "AgentHandle",
    "AgentHooks",
    "AgentOutcome",
    "AgentOverrides",
    "AgentPlugin",
    "AgentRuntime",
    "AgentSettings",
    "AgentTurn",
    "AllowAll",
    "AppAgent",
    "ApprovalDecision",
    "AwaitingApproval",
    "Block",
    "BudgetExhausted",
    "CancelRun",
    "CancelToken",
    "Cancelled",
    "ChatMessage",
    "ChatRequest",
    "ChatResponse",
    "Completed",
    "Continue",
    "ErrorKind",
    "EventSink",
    "FnTool",
    "JobOptions",
    "LlmClient",
    "LoopDetected",
    "LoopGuard",
    "ModelRetry",
    "Modify",
    "NextTurn",
    "OutcomeSummary",
    "Output",
    "OutputContext",
    "OutputInvalid",
    "OutputMode",
    "PauseRun",
    "Paused",
    "PrefixLocked",
    "RetryPolicy",
    "Role",
    "RunHandle",
    "RunId",
    "RunInfo",
    "RunOptions",
    "RunRecord",
    "RunState",
    "RunStatus",
    "ScriptedModel",
    "SessionId",
    "SessionLocked",
    "Strictest",
    "TokenUsage",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolDefinition",
    "ToolEffect",
    "ToolOutput",
    "ToolPolicy",
    "ToolRegistry",
    "ToolReturn",
    "ToolRules",
    "TurnInfo",
    "__version__",
    "deny",
    "new_run_id",
    "tool",
]

"""fastapi-agent-plugin: a provider-agnostic LLM agent for FastAPI apps.

The names a user imports live here; wire clients are in :mod:`agent_plugin.providers`.
``AgentPlugin``, ``AgentHandle`` and ``AgentSettings`` load on first use, so the agent core
imports without FastAPI, pydantic-settings or a database driver.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

from agent_plugin.agent import Agent, EventSink
from agent_plugin.cancellation import CancelToken
from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.events import AgentEvent
from agent_plugin.hooks import (
    AgentHooks,
    Block,
    CancelRun,
    Continue,
    Modify,
    PauseRun,
    ToolOutput,
)
from agent_plugin.ids import RunId, SessionId, new_run_id
from agent_plugin.loop_guard import LoopGuard
from agent_plugin.messages import ChatMessage, Role, TokenUsage, ToolCall, ToolDefinition
from agent_plugin.outcomes import (
    AgentOutcome,
    AgentTurn,
    ApprovalDecision,
    AwaitingApproval,
    BudgetExhausted,
    Cancelled,
    Completed,
    LoopDetected,
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
    from agent_plugin.plugin import AgentHandle, AgentPlugin

__version__ = "0.1.0"

_LAZY = {
    "AgentHandle": "agent_plugin.plugin",
    "AgentPlugin": "agent_plugin.plugin",
    "AgentSettings": "agent_plugin.config",
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
    "AgentPlugin",
    "AgentSettings",
    "AgentTurn",
    "AllowAll",
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
    "LlmClient",
    "LoopDetected",
    "LoopGuard",
    "Modify",
    "PauseRun",
    "Paused",
    "RetryPolicy",
    "Role",
    "RunId",
    "RunInfo",
    "RunState",
    "ScriptedModel",
    "SessionId",
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
    "__version__",
    "deny",
    "new_run_id",
    "tool",
]

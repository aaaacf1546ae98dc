"""The FastAPI side: :mod:`~agent_plugin.web.plugin` (:class:`AgentPlugin`),
:mod:`~agent_plugin.web.handle` (the :data:`AgentHandle` dependency), thin
:mod:`~agent_plugin.web.routes`, the one SSE encoder (:mod:`~agent_plugin.web.sse`),
problem details, health and the run console."""

from agent_plugin.web.handle import AgentHandle, AppAgent, DisconnectPolicy, get_app_agent
from agent_plugin.web.health import AgentHealth, ComponentHealth, HealthReport, health_router
from agent_plugin.web.plugin import AgentPlugin
from agent_plugin.web.problems import PROBLEM_TYPE_PREFIX, agent_error_handler, problem_response
from agent_plugin.web.routes import ToolInfo

__all__ = [
    "PROBLEM_TYPE_PREFIX",
    "AgentHandle",
    "AgentHealth",
    "AgentPlugin",
    "AppAgent",
    "ComponentHealth",
    "DisconnectPolicy",
    "HealthReport",
    "ToolInfo",
    "agent_error_handler",
    "get_app_agent",
    "health_router",
    "problem_response",
]

"""Tools: what a model may call, how a call reaches the code, and how its output comes back.

A tool is anything that fits the small :class:`Tool` protocol (:mod:`.base`). :func:`tool`
turns a plain function into one, its schema from the signature and docstring
(:mod:`.functions`); :class:`FnTool` wraps a function of the raw JSON arguments with a
hand-written schema. :class:`ToolRegistry` (:mod:`.registry`) holds a run's tools and hands out
their definitions sorted by name, so a prompt's tool block is the same bytes from call to call.
Everything expensive happens once, when a tool is built; a call only validates and runs."""

from agent_plugin.tools.base import (
    MAX_PROGRESS_MESSAGE,
    TRUNCATION_MARKER,
    FnTool,
    ProgressSink,
    Tool,
    ToolContext,
    ToolEffect,
    ToolReturn,
    canonical_json,
    definition_of,
    error_payload,
    truncate_chars,
)
from agent_plugin.tools.functions import FunctionTool, tool
from agent_plugin.tools.registry import ToolRegistry

__all__ = [
    "MAX_PROGRESS_MESSAGE",
    "TRUNCATION_MARKER",
    "FnTool",
    "FunctionTool",
    "ProgressSink",
    "Tool",
    "ToolContext",
    "ToolEffect",
    "ToolRegistry",
    "ToolReturn",
    "canonical_json",
    "definition_of",
    "error_payload",
    "tool",
    "truncate_chars",
]

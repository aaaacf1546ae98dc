"""Tools: what a model may call, how a call reaches the code, and how its output comes back.

A tool is anything that fits the small :class:`Tool` protocol. Two ready-made kinds cover most
needs:

* :func:`tool` turns a plain (async or sync) function into a tool. Its name, description and
  JSON Schema come from the signature and the docstring; a :class:`ToolContext` parameter is
  injected rather than shown to the model; mistakes in the declaration fail at decoration time.
* :class:`FnTool` wraps a function that takes the raw JSON arguments, with a hand-written schema.

:class:`ToolRegistry` holds a run's tools and hands out their definitions sorted by name, so the
tool block of a prompt is byte-for-byte the same from call to call and provider caches keep
hitting. :func:`canonical_json`, :func:`truncate_chars` and :func:`error_payload` produce the text
a tool result carries back to the model.

Everything expensive (signature inspection, docstring parsing, schema generation and compiling
the validators) happens once, when a tool is built; a call only validates and runs.
"""

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

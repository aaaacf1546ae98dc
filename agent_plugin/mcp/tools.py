"""An MCP server's tools as :class:`~agent_plugin.tools.Tool` s: :class:`MCPTool`, and the
mapping of a ``tools/call`` result to the value the model is shown (:func:`result_value`).

The schema is the server's, unchanged; arguments are checked against it (JSON Schema 2020-12
unless the schema names its dialect) before a call leaves the process. A result becomes:
its structured content when it has some; else its content blocks (one text block is its
text; images, audio and binary resources are described, since a tool result is text); an
``isError`` result is a tool error whose message the model reads. The agent's output limit
then applies as to any tool.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from typing import Any, Final

from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import SchemaError, best_match
from jsonschema.protocols import Validator
from mcp import types
from pydantic import JsonValue

from agent_plugin.errors import AgentError
from agent_plugin.tools import ToolContext, ToolEffect

__all__ = ["Caller", "MCPTool", "exposed_name", "result_value"]

Caller = Callable[[str, dict[str, Any]], Awaitable[types.CallToolResult]]
"""Calls the server's tool (its own name) with arguments: the connection's ``call``."""

_UNSAFE: Final = re.compile(r"[^A-Za-z0-9_-]")
_MAX_NAME: Final = 64


def exposed_name(prefix: str, remote: str) -> str | None:
    """The name the model sees for the server's tool ``remote``: ``prefix`` and the name with
    every character a provider refuses written as ``_``; ``None`` when that is empty or longer
    than 64 characters."""
    name = prefix + _UNSAFE.sub("_", remote)
    return name if 0 < len(name) <= _MAX_NAME else None


class MCPTool:
    """One tool of an MCP server, offered to the model under :attr:`name`.

    ``remote_name`` is the server's own name for it; :meth:`execute` calls it through the
    server's shared connection.
    """

    __slots__ = ("_call", "_validator", "description", "effect", "input_schema", "name",
                 "remote_name", "sequential")  # fmt: skip

    name: str
    description: str
    input_schema: dict[str, JsonValue]
    effect: ToolEffect
    sequential: bool
    remote_name: str

    def __init__(self, spec: types.Tool, *, name: str, effect: ToolEffect, call: Caller) -> None:
        self.name = name
        self.remote_name = spec.name
        self.description = spec.description or spec.title or ""
        try:
            self.input_schema = json.loads(json.dumps(spec.input_schema, allow_nan=False))
        except ValueError as error:
            raise AgentError.config(f"the input schema is not JSON: {error}") from None
        self.effect = effect
        self.sequential = False
        self._validator = _validator_for(self.input_schema)
        self._call = call

    def validate(self, arguments: JsonValue) -> str | None:
        """``"<json path>: <message>"`` of the most relevant schema violation, or None."""
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            return "$: the arguments must be a JSON object"
        error = best_match(self._validator.iter_errors(arguments))
        return None if error is None else f"{error.json_path}: {error.message}"

    async def execute(self, arguments: JsonValue, ctx: ToolContext) -> JsonValue:
        given = arguments if isinstance(arguments, dict) else {}
        return result_value(await self._call(self.remote_name, given))

    def fingerprint(self) -> tuple[str, str, str, str]:
        """What the model and the policy see of the tool: equal fingerprints, same tool."""
        schema = json.dumps(self.input_schema, sort_keys=True)
        return self.name, self.description, schema, self.effect.value

    def __repr__(self) -> str:
        return f"MCPTool(name={self.name!r}, effect={self.effect.value!r})"


def _validator_for(schema: dict[str, JsonValue]) -> Validator:
    cls = validators.validator_for(schema, default=Draft202012Validator)
    try:
        cls.check_schema(schema)
    except SchemaError as error:
        raise AgentError.config(f"the input schema is invalid: {error.message}") from None
    return cls(schema)


def result_value(result: types.CallToolResult) -> JsonValue:
    """What the model is shown of a ``tools/call`` result; an error result raises a ``tool``
    :class:`AgentError` with the server's text."""
    if result.is_error:
        texts = [block.text for block in result.content if isinstance(block, types.TextContent)]
        raise AgentError.tool(" ".join(texts).strip() or "the MCP tool reported an error")
    if result.structured_content is not None:
        structured: JsonValue = result.structured_content
        return structured
    values = [_block_value(block) for block in result.content]
    if len(values) == 1 and isinstance(values[0], str):
        return values[0]
    return values


def _block_value(block: types.ContentBlock) -> JsonValue:
    if isinstance(block, types.TextContent):
        return block.text
    if isinstance(block, types.ImageContent | types.AudioContent):
        kind = "image" if isinstance(block, types.ImageContent) else "audio"
        return {"type": kind, "mime_type": block.mime_type, "bytes": _size(block.data)}
    if isinstance(block, types.ResourceLink):
        link: dict[str, JsonValue] = {"type": "resource_link", "uri": block.uri}
        for key, value in (("name", block.name), ("description", block.description),
                           ("mime_type", block.mime_type)):  # fmt: skip
            if value is not None:
                link[key] = value
        return link
    resource = block.resource
    shown: dict[str, JsonValue] = {"type": "resource", "uri": resource.uri}
    if resource.mime_type is not None:
        shown["mime_type"] = resource.mime_type
    if isinstance(resource, types.TextResourceContents):
        shown["text"] = resource.text
    else:
        shown["bytes"] = _size(resource.blob)
    return shown


def _size(base64_text: str) -> int:
    """The number of bytes ``base64_text`` encodes, without decoding it."""
    text = base64_text.strip()
    return max(len(text) * 3 // 4 - text[-2:].count("="), 0)

"""Bounded memory the agent curates itself: labelled :class:`MemoryBlock` s (``memory``,
``user``), each with a character limit that makes the agent consolidate instead of hoarding.

The blocks are rendered into the system prompt once per run (:func:`render_snapshot`), so the
prompt prefix stays stable; every edit of the :class:`MemoryTool` carries an edit key, applied
once per scope, so a retried job never adds an entry twice. A :class:`MemoryStore` keeps blocks
per scope (``"agent"``, or one per user or tenant): :class:`InMemoryMemoryStore` here, the SQL
store in :mod:`agent_plugin.storage`; both apply the edit rules of :func:`apply_op` and
:func:`edit_blocks`. ``docs/guide/conversations.md`` has the whole story.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Final, Literal, Protocol, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, JsonValue, TypeAdapter, ValidationError

from agent_plugin.errors import AgentError
from agent_plugin.ids import DEFAULT_SCOPE
from agent_plugin.tools import ToolContext, ToolEffect

__all__ = [
    "DEFAULT_BLOCKS",
    "DEFAULT_SCOPE",
    "AddOp",
    "InMemoryMemoryStore",
    "MemoryBlock",
    "MemoryOp",
    "MemoryStore",
    "MemoryTool",
    "RemoveOp",
    "ReplaceOp",
    "apply_op",
    "edit_blocks",
    "edit_key",
    "find_block",
    "fresh_blocks",
    "parse_op",
    "render_snapshot",
]

logger = logging.getLogger("agent_plugin")


# --- blocks ---------------------------------------------------------------------------------


class MemoryBlock(BaseModel):
    """One labelled, size-limited list of entries, oldest first.

    ``limit`` bounds the total number of characters of all entries (:attr:`used`). Blocks are
    immutable values: :func:`apply_op` returns a new block.
    """

    model_config = ConfigDict(frozen=True)

    label: str = Field(min_length=1)
    """The name the model uses to address the block (``memory``, ``user``, ...)."""
    description: str
    """What the block is for; shown to the model under the block's header."""
    entries: list[str] = Field(default_factory=list)
    limit: int = Field(ge=1)
    """The most characters all entries together may use."""

    @property
    def used(self) -> int:
        """Characters used by all entries together."""
        return sum(len(entry) for entry in self.entries)


DEFAULT_BLOCKS: Final[tuple[MemoryBlock, ...]] = (
    MemoryBlock(
        label="memory",
        description="facts, decisions, lessons to remember across runs",
        limit=2200,
    ),
    MemoryBlock(
        label="user",
        description="who you work for: preferences, style, standing instructions",
        limit=1375,
    ),
)
"""The blocks a new scope starts with: ``memory`` (2200 characters) and ``user`` (1375)."""


def fresh_blocks(template: Iterable[MemoryBlock]) -> list[MemoryBlock]:
    """Copies of ``template`` that share no list with it: what a new scope starts from.

    Raises a config error when two blocks share a label.
    """
    blocks = [block.model_copy(update={"entries": list(block.entries)}) for block in template]
    labels = [block.label for block in blocks]
    duplicates = sorted({label for label in labels if labels.count(label) > 1})
    if duplicates:
        raise AgentError.config(f"memory blocks must have distinct labels; repeated: {duplicates}")
    return blocks


# --- edits ----------------------------------------------------------------------------------


class _Op(BaseModel):
    model_config = ConfigDict(frozen=True)

    block: str
    """The label of the block to edit."""


class AddOp(_Op):
    """Append ``text`` as a new entry."""

    action: Literal["add"] = "add"
    text: str


class ReplaceOp(_Op):
    """Overwrite the one entry that contains ``old`` with ``text``."""

    action: Literal["replace"] = "replace"
    old: str
    text: str


class RemoveOp(_Op):
    """Delete the one entry that contains ``old``."""

    action: Literal["remove"] = "remove"
    old: str


MemoryOp: TypeAlias = Annotated[AddOp | ReplaceOp | RemoveOp, Field(discriminator="action")]
"""One edit of a memory block, tagged by ``action`` in JSON."""

_OP_ADAPTER: Final[TypeAdapter[MemoryOp]] = TypeAdapter(MemoryOp)
_ACTIONS: Final = ("add", "replace", "remove")


def parse_op(arguments: Any) -> MemoryOp:
    """The edit described by ``arguments`` (the memory tool's JSON input).

    Raises a tool error ``invalid memory edit: ...`` that says what is wrong.
    """
    try:
        return _OP_ADAPTER.validate_python(arguments)
    except ValidationError as exc:
        raise AgentError.tool(f"invalid memory edit: {_describe(exc)}") from None


def _describe(exc: ValidationError) -> str:
    problems: list[str] = []
    for error in exc.errors(include_url=False):
        kind = error["type"]
        if kind in ("union_tag_not_found", "union_tag_invalid"):
            problems.append(f"`action` must be one of {', '.join(_ACTIONS)}")
            continue
        if kind == "model_attributes_type":
            problems.append("the edit must be a JSON object")
            continue
        loc = [str(part) for part in error["loc"]]
        if loc and loc[0] in _ACTIONS:
            loc = loc[1:]  # the union's tag, not a field
        where = ".".join(loc)
        problems.append(f"`{where}`: {error['msg'].lower()}" if where else error["msg"].lower())
    return "; ".join(problems)


def apply_op(block: MemoryBlock, op: MemoryOp) -> MemoryBlock:
    """``block`` after ``op``: a new block; ``block`` itself is unchanged.

    ``text`` and ``old`` are trimmed. ``old`` must be a substring of exactly one entry. An edit
    that would take the block over its limit is refused (a remove never is). Every failure is a
    tool error written for the model.
    """
    entries = list(block.entries)
    if isinstance(op, AddOp):
        text = _non_empty(op.text)
        _check_fits(block, None, text)
        entries.append(text)
    elif isinstance(op, ReplaceOp):
        text = _non_empty(op.text)
        index = _find_unique(block, op.old)
        _check_fits(block, index, text)
        entries[index] = text
    else:
        del entries[_find_unique(block, op.old)]
    return block.model_copy(update={"entries": entries})


def _non_empty(text: str) -> str:
    text = text.strip()
    if not text:
        raise AgentError.tool("memory entries must not be empty")
    return text


def _check_fits(block: MemoryBlock, replacing: int | None, text: str) -> None:
    freed = len(block.entries[replacing]) if replacing is not None else 0
    after = block.used - freed + len(text)
    if after > block.limit:
        raise AgentError.tool(
            f"memory block {_quoted(block.label)} is full: this edit needs {after} of "
            f"{block.limit} characters. Remove or merge entries first, then retry."
        )


def _find_unique(block: MemoryBlock, old: str) -> int:
    old = old.strip()
    if not old:
        raise AgentError.tool("give `old`: a substring of the entry to change")
    matches = [index for index, entry in enumerate(block.entries) if old in entry]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise AgentError.tool(f"no entry in {_quoted(block.label)} contains {_quoted(old)}")
    raise AgentError.tool(
        f"{len(matches)} entries in {_quoted(block.label)} contain {_quoted(old)}: "
        "give a longer substring"
    )


def find_block(blocks: Sequence[MemoryBlock], label: str) -> MemoryBlock:
    """The block called ``label``; a tool error listing the labels if there is none."""
    for block in blocks:
        if block.label == label:
            return block
    known = ", ".join(_quoted(block.label) for block in blocks)
    raise AgentError.tool(f"no memory block {_quoted(label)}; blocks: [{known}]")


def edit_blocks(
    blocks: Sequence[MemoryBlock], op: MemoryOp, *, already_applied: bool = False
) -> MemoryBlock:
    """The block ``op`` addresses, after the edit: the one step every store shares.

    ``already_applied=True`` (the store has seen the edit's key in this scope before) returns
    the block as it is, without applying ``op`` again. An unknown label is a tool error either
    way. The caller stores the result in place of the old block and, for a keyed edit, records
    the key in the same write, so a key is recorded only for an edit that succeeded.
    """
    block = find_block(blocks, op.block)
    return block if already_applied else apply_op(block, op)


_DETACHED_RUN_ID: Final = ToolContext.detached("").run_id


def edit_key(ctx: ToolContext) -> str | None:
    """The key under which a tool call's edit is applied at most once.

    ``"<run id>:<step>:<call id>"``; None for a call made outside any run
    (:meth:`ToolContext.detached`), whose ids say nothing about which call it is.
    """
    if ctx.run_id == _DETACHED_RUN_ID:
        return None
    return f"{ctx.run_id}:{ctx.step}:{ctx.call_id}"


def _quoted(text: str) -> str:
    """``text`` in double quotes, escaped like a JSON string."""
    return json.dumps(text, ensure_ascii=False)


# --- the snapshot ---------------------------------------------------------------------------

_SNAPSHOT_HEADER: Final = (
    "## Memory\nYour persistent memory, as it was when this run started. Edit it with the "
    "`memory` tool; edits show here from the next run.\n"
)


# "<" of anything a reader could take for a memory tag: "</memory>", "< / MEMORY", "<memory ...".
_TAG_OPENER: Final = re.compile(r"<(?=\s*/?\s*memory)", re.IGNORECASE)


def render_snapshot(blocks: Iterable[MemoryBlock]) -> str:
    """The ``## Memory`` section of the system prompt.

    Rendered once per run: edits made during the run appear from the next run on. The model
    writes the entries, so none may leave its block: the ``<`` of anything like a memory tag in
    an entry (or a description) is written ``&lt;``, and the lines after an entry's first are
    indented, so they cannot pass for entries or headings of their own.
    """
    parts = [_SNAPSHOT_HEADER]
    for block in blocks:
        parts.append(
            f'\n<memory block="{block.label}" used="{block.used}/{block.limit}">\n'
            f"{_inert(block.description)}\n"
        )
        parts.extend(f"- {_inert(entry)}\n" for entry in block.entries)
        parts.append("</memory>\n")
    return "".join(parts)


def _inert(text: str) -> str:
    """``text`` fit to stand inside a block: no memory tags, later lines indented."""
    return "\n  ".join(_TAG_OPENER.sub("&lt;", text).splitlines())


# --- stores ---------------------------------------------------------------------------------


class MemoryStore(Protocol):
    """Where memory blocks live, per scope.

    * :meth:`load` returns every block of ``scope``; a scope never written to returns a fresh
      copy of the store's template (see :func:`fresh_blocks`).
    * :meth:`apply` applies one edit (via :func:`edit_blocks`, so the rules match everywhere),
      stores it and returns the edited block. An unknown label is a tool error
      ``no memory block "<x>"; blocks: [...]``. When ``edit_key`` is given and an edit with that
      key has already been applied in ``scope``, nothing changes and the block is returned as
      it is now. Two concurrent edits of one scope must both land.
    """

    async def load(self, scope: str) -> list[MemoryBlock]: ...

    async def apply(
        self, scope: str, op: MemoryOp, *, edit_key: str | None = None
    ) -> MemoryBlock: ...


@dataclass(slots=True)
class _Scope:
    blocks: list[MemoryBlock]
    applied: OrderedDict[str, None] = field(default_factory=OrderedDict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class InMemoryMemoryStore:
    """A process-local :class:`MemoryStore`: contents vanish on restart.

    Scopes are isolated and start from copies of ``template``. Edits of one scope are serialised
    by a per-scope lock. The most recent ``remembered_edits`` edit keys of each scope are kept,
    which covers any retry of a job that is still in flight. At most ``max_scopes`` scopes are
    kept (``None``: no bound): past that, the scope used least recently is forgotten, with a
    log line.
    """

    def __init__(
        self,
        template: Iterable[MemoryBlock] = DEFAULT_BLOCKS,
        *,
        remembered_edits: int = 1024,
        max_scopes: int | None = 10_000,
    ) -> None:
        if remembered_edits < 1:
            raise AgentError.config(f"remembered_edits must be at least 1, got {remembered_edits}")
        if max_scopes is not None and max_scopes < 1:
            raise AgentError.config(f"max_scopes must be at least 1, got {max_scopes}")
        self._template = fresh_blocks(template)
        self._remembered = remembered_edits
        self.max_scopes = max_scopes
        self._scopes: OrderedDict[str, _Scope] = OrderedDict()

    def __repr__(self) -> str:
        return f"InMemoryMemoryStore(scopes={len(self._scopes)})"

    async def load(self, scope: str) -> list[MemoryBlock]:
        state = self._scopes.get(scope)
        if state is not None:
            self._scopes.move_to_end(scope)
        return fresh_blocks(state.blocks if state is not None else self._template)

    async def apply(self, scope: str, op: MemoryOp, *, edit_key: str | None = None) -> MemoryBlock:
        state = self._scopes.get(scope)
        if state is None:
            state = self._scopes[scope] = _Scope(fresh_blocks(self._template))
            while self.max_scopes is not None and len(self._scopes) > self.max_scopes:
                forgotten, _ = self._scopes.popitem(last=False)
                logger.info(
                    "in-memory memory store: forgot scope %r, the least recently used of more "
                    "than %d (use the SQL store to keep every scope)",
                    forgotten,
                    self.max_scopes,
                )
        else:
            self._scopes.move_to_end(scope)
        async with state.lock:
            replay = edit_key is not None and edit_key in state.applied
            block = edit_blocks(state.blocks, op, already_applied=replay)
            if replay:
                return block
            state.blocks = [block if b.label == block.label else b for b in state.blocks]
            if edit_key is not None:
                state.applied[edit_key] = None
                while len(state.applied) > self._remembered:
                    state.applied.popitem(last=False)
            return block


# --- the tool -------------------------------------------------------------------------------

_DESCRIPTION: Final = (
    "Edit your persistent memory. action=add appends `text` to `block`; action=replace swaps "
    "the entry containing `old` for `text`; action=remove deletes the entry containing `old`. "
    "Save durable facts and lessons, not logs."
)

_SCHEMA: Final[dict[str, JsonValue]] = {
    "type": "object",
    "properties": {
        "action": {"type": "string", "enum": list(_ACTIONS)},
        "block": {"type": "string", "description": "Block label, e.g. memory or user."},
        "text": {"type": "string", "description": "New entry text (add, replace)."},
        "old": {
            "type": "string",
            "description": "Substring of the entry to change (replace, remove).",
        },
    },
    "required": ["action", "block"],
}


class MemoryTool:
    """The built-in ``memory`` tool, bound to one store and scope.

    Effect ``internal``. Its calls in one round run one after another, in the order the model
    gave them (``replace`` after the ``add`` it refers to). The input is checked by the tool
    itself, so a bad edit reaches the model as ``invalid memory edit: ...`` rather than a
    generic schema message. Success returns ``{"ok": true, "block", "used", "limit"}``.
    """

    __slots__ = ("_scope", "_store")

    def __init__(self, store: MemoryStore, scope: str = DEFAULT_SCOPE) -> None:
        self._store = store
        self._scope = scope

    @property
    def name(self) -> str:
        return "memory"

    @property
    def description(self) -> str:
        return _DESCRIPTION

    @property
    def input_schema(self) -> dict[str, JsonValue]:
        return _SCHEMA

    @property
    def effect(self) -> ToolEffect:
        return ToolEffect.INTERNAL

    @property
    def sequential(self) -> bool:
        return True

    @property
    def store(self) -> MemoryStore:
        return self._store

    @property
    def scope(self) -> str:
        return self._scope

    def validate(self, arguments: JsonValue) -> str | None:
        """Always None: :meth:`execute` checks the input and explains what is wrong."""
        return None

    async def execute(self, arguments: JsonValue, ctx: ToolContext) -> dict[str, JsonValue]:
        op = parse_op(arguments)
        block = await self._store.apply(self._scope, op, edit_key=edit_key(ctx))
        return {"ok": True, "block": block.label, "used": block.used, "limit": block.limit}

    def __repr__(self) -> str:
        return f"MemoryTool(scope={self._scope!r})"

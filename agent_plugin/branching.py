"""Session branches: a session's entries form a tree through their ``parent_seq`` links.

Every entry names the entry it follows (``None``: a root); a session's *head* is the leaf its
next run continues, and :meth:`SessionStore.fork` moves it to an earlier entry so that run
starts a new branch. :class:`SessionTree` is the read-only model a store builds from
``(seq, parent_seq)`` pairs: the path from a leaf to the root, the leaves, and
:class:`Branch` rows. :class:`SessionLock` is what a locked session keeps fixed: the
fingerprint of the system prompt and tool definitions, and the entry its history ends at.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence

from pydantic import BaseModel, ConfigDict, Field

from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.messages import ToolDefinition

__all__ = ["Branch", "SessionLock", "SessionTree", "prefix_fingerprint", "unknown_entry_error"]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Branch(_Model):
    """One branch of a session: the path from the root to ``leaf``.

    ``length`` is the number of entries on the path; ``fork_point`` is the deepest entry the
    branch shares with another branch (``None`` while the session has one branch); ``active``
    says it is the session's head, the branch a run continues by default.
    """

    leaf: int = Field(ge=1)
    length: int = Field(ge=1)
    fork_point: int | None = None
    active: bool = False


class SessionLock(_Model):
    """A locked session: runs must bring the same system prompt and tools (``fingerprint``),
    and every branch they continue must hold the history up to entry ``seq`` (0: none)."""

    fingerprint: str
    seq: int = Field(ge=0)


def prefix_fingerprint(system_prompt: str | None, tools: Sequence[ToolDefinition]) -> str:
    """A digest of what a locked prefix starts with: the system prompt and tool definitions."""
    body = {
        "system": system_prompt,
        "tools": [tool.model_dump(mode="json") for tool in tools],
    }
    encoded = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(encoded).hexdigest()


def unknown_entry_error(session_id: str, seq: int) -> AgentError:
    """The error for a leaf or fork point that names no entry of the session."""
    return AgentError(ErrorKind.NOT_FOUND, f"session {session_id!r} has no entry {seq}")


class SessionTree:
    """The tree of a session's entries, from ``(seq, parent_seq)`` pairs and the head.

    A store gives a new entry a parent it already holds, so walking up a path ends at a root;
    links that loop (a hand-made file) end the walk where it would repeat itself. An empty
    session has no branches.
    """

    def __init__(self, links: Iterable[tuple[int, int | None]], head: int) -> None:
        self.parents: dict[int, int | None] = dict(links)
        self.head = head
        self.children: dict[int, list[int]] = {}
        for seq, parent in sorted(self.parents.items()):
            if parent is not None:
                self.children.setdefault(parent, []).append(seq)

    def __contains__(self, seq: object) -> bool:
        return seq in self.parents

    def path(self, leaf: int) -> list[int]:
        """The seqs from the root to ``leaf``, in order (empty for an unknown seq)."""
        seqs: list[int] = []
        seen: set[int] = set()
        node: int | None = leaf if leaf in self.parents else None
        while node is not None and node not in seen:
            seen.add(node)
            seqs.append(node)
            node = self.parents.get(node)
        seqs.reverse()
        return seqs

    def leaves(self) -> list[int]:
        """Entries without children, and the head if a fork left it with some, in seq order."""
        tips = {seq for seq in self.parents if seq not in self.children}
        if self.head in self.parents:
            tips.add(self.head)
        return sorted(tips)

    def branches(self) -> list[Branch]:
        """One :class:`Branch` per leaf, in leaf order."""
        leaves = self.leaves()
        below: dict[int, int] = {}  # how many leaves each entry leads to
        for leaf in leaves:
            for seq in self.path(leaf):
                below[seq] = below.get(seq, 0) + 1
        branches: list[Branch] = []
        for leaf in leaves:
            path = self.path(leaf)
            shared = [seq for seq in path if below[seq] > 1]
            branches.append(
                Branch(
                    leaf=leaf,
                    length=len(path),
                    fork_point=shared[-1] if shared else None,
                    active=leaf == self.head,
                )
            )
        return branches

"""Session files: a session as append-only JSON lines, safe to write through a crash.

Line 1 is a :class:`SessionHeader` (``{"type": "session", "version": 1, ...}``); every later
line is one entry tagged by ``type`` with ``id``, ``parent_id`` and ``timestamp``: content
(``message``, ``compaction``), the ``leaf`` pointer that picks the active branch,
``extension_state``, and metadata (``session_info``, ``model_change``,
``thinking_level_change``, ``label``, ``branch_summary``) that never becomes the content tip.
:class:`SessionFileWriter` fsyncs every line and cuts a torn last line off before appending;
:func:`read_session_file` skips what a crash or a newer writer left and says so in a
:class:`Recovery` with count-only :class:`Diagnostic` warnings. Blocking file I/O: call it in
a thread (``asyncio.to_thread``) from async code.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Final, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, JsonValue, TypeAdapter, ValidationError

from agent_plugin.compaction import summary_message
from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.messages import ChatMessage

__all__ = [
    "BRANCH_SUMMARY_PREFIX",
    "FORMAT_VERSION",
    "BranchSummaryLine",
    "CompactionLine",
    "Diagnostic",
    "ExtensionStateLine",
    "FileEntry",
    "LabelLine",
    "LeafLine",
    "MessageLine",
    "ModelChangeLine",
    "Recovery",
    "RecoveryStatus",
    "SessionContext",
    "SessionFile",
    "SessionFileWriter",
    "SessionHeader",
    "SessionInfoLine",
    "ThinkingLevelChangeLine",
    "read_session_file",
    "write_entries",
]

FORMAT_VERSION: Final = 1

BRANCH_SUMMARY_PREFIX: Final = "[Summary of another branch of this conversation]\n"


def _now() -> str:
    return datetime.now(UTC).isoformat()


def _new_id() -> str:
    return uuid.uuid4().hex[:16]


class _Line(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SessionHeader(_Line):
    """The first line of a session file."""

    type: Literal["session"] = "session"
    version: Literal[1] = FORMAT_VERSION
    id: str = Field(default_factory=_new_id)
    timestamp: str = Field(default_factory=_now)
    cwd: str = ""
    parent_session: str | None = None


class _Entry(_Line):
    id: str = Field(default_factory=_new_id)
    parent_id: str | None = None
    timestamp: str = Field(default_factory=_now)


class MessageLine(_Entry):
    type: Literal["message"] = "message"
    message: ChatMessage


class CompactionLine(_Entry):
    type: Literal["compaction"] = "compaction"
    summary: str
    first_kept_entry_id: str
    tokens_before: int = Field(ge=0)
    tokens_after: int = Field(ge=0)


class LeafLine(_Entry):
    """Moves the active-branch pointer to ``entry_id``."""

    type: Literal["leaf"] = "leaf"
    entry_id: str


class ExtensionStateLine(_Entry):
    type: Literal["extension_state"] = "extension_state"
    state: JsonValue


class SessionInfoLine(_Entry):
    type: Literal["session_info"] = "session_info"
    name: str


class ModelChangeLine(_Entry):
    type: Literal["model_change"] = "model_change"
    model: str = Field(pattern=r"^[^:]+:.+$", description="provider:model")


class ThinkingLevelChangeLine(_Entry):
    type: Literal["thinking_level_change"] = "thinking_level_change"
    level: Literal["none", "low", "medium", "high"]


class LabelLine(_Entry):
    type: Literal["label"] = "label"
    label: str
    action: Literal["add", "remove"]


class BranchSummaryLine(_Entry):
    """What another branch from ``parent_id`` did; it follows that entry in the model's context."""

    type: Literal["branch_summary"] = "branch_summary"
    summary: str

    def message(self) -> ChatMessage:
        return ChatMessage.user(BRANCH_SUMMARY_PREFIX + self.summary)


FileEntry: TypeAlias = Annotated[
    MessageLine
    | CompactionLine
    | LeafLine
    | ExtensionStateLine
    | SessionInfoLine
    | ModelChangeLine
    | ThinkingLevelChangeLine
    | LabelLine
    | BranchSummaryLine,
    Field(discriminator="type"),
]
"""One entry line of a session file, tagged by ``type``."""

_entry_adapter: TypeAdapter[FileEntry] = TypeAdapter(FileEntry)
_KNOWN: Final = frozenset(
    {
        "message",
        "compaction",
        "leaf",
        "extension_state",
        "session_info",
        "model_change",
        "thinking_level_change",
        "label",
        "branch_summary",
    }
)
_CONTENT: Final = (MessageLine, CompactionLine)


def _line(model: BaseModel) -> bytes:
    return model.model_dump_json().encode() + b"\n"


class SessionFileWriter:
    """Appends entries to a session file, one fsynced line each (use as a context manager)."""

    def __init__(self, fd: int, path: Path) -> None:
        self._fd = fd
        self.path = path

    @classmethod
    def create(cls, path: str | Path, header: SessionHeader) -> SessionFileWriter:
        """A new file holding ``header`` (an existing file is a ``config`` error)."""
        target = Path(path)
        try:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
        except FileExistsError:
            raise AgentError.config(f"session file {target} exists already") from None
        writer = cls(fd, target)
        writer._write(_line(header))
        return writer

    @classmethod
    def open(cls, path: str | Path) -> SessionFileWriter:
        """An existing file, its torn last line (no ``\\n``) cut off so appends start clean:
        back to the previous newline, or to empty when the file holds none."""
        target = Path(path)
        fd = os.open(target, os.O_RDWR | os.O_APPEND)
        try:
            size = os.fstat(fd).st_size
            data = os.pread(fd, size, 0) if size else b""
            if data and not data.endswith(b"\n"):
                os.ftruncate(fd, data.rfind(b"\n") + 1)
                os.fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        return cls(fd, target)

    def append(self, entry: FileEntry) -> None:
        """Write ``entry`` as one line and fsync it."""
        self._write(_line(entry))

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]
        os.fsync(self._fd)

    def close(self) -> None:
        os.close(self._fd)

    def __enter__(self) -> SessionFileWriter:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class Diagnostic(_Line):
    """A warning about a file that did not read cleanly; it carries counts, never content."""

    level: Literal["warning"] = "warning"
    code: Literal[
        "session_truncated_line",
        "session_corrupt_entries",
        "session_corrupt_with_truncation",
        "session_unknown_entries",
        "session_context_missing_parent",
    ]
    count: int = Field(ge=1)


RecoveryStatus: TypeAlias = Literal[
    "clean", "truncated_line", "corrupt_entries", "corrupt_entries_with_truncation"
]


class Recovery(_Line):
    """What reading skipped: a torn last line, corrupt lines, lines of unknown type."""

    truncated_line: bool = False
    corrupt_count: int = Field(default=0, ge=0)
    unknown_count: int = Field(default=0, ge=0)

    @property
    def status(self) -> RecoveryStatus:
        if self.corrupt_count:
            return "corrupt_entries_with_truncation" if self.truncated_line else "corrupt_entries"
        return "truncated_line" if self.truncated_line else "clean"

    def diagnostics(self) -> list[Diagnostic]:
        found: list[Diagnostic] = []
        status = self.status
        if status == "truncated_line":
            found.append(Diagnostic(code="session_truncated_line", count=1))
        elif status == "corrupt_entries":
            found.append(Diagnostic(code="session_corrupt_entries", count=self.corrupt_count))
        elif status == "corrupt_entries_with_truncation":
            code: Literal["session_corrupt_with_truncation"] = "session_corrupt_with_truncation"
            found.append(Diagnostic(code=code, count=self.corrupt_count))
        if self.unknown_count:
            found.append(Diagnostic(code="session_unknown_entries", count=self.unknown_count))
        return found


class SessionFile(_Line):
    """A session file as read: its header, the entries that parsed, and what was skipped."""

    header: SessionHeader
    entries: list[FileEntry]
    recovery: Recovery = Field(default_factory=Recovery)

    @property
    def diagnostics(self) -> list[Diagnostic]:
        return self.recovery.diagnostics()

    @property
    def content_tip(self) -> str | None:
        """The active tip: the last ``leaf`` entry's target if it names a content entry, else
        the trunk's tip (from the first root, by id, down single-child links to a fork point
        or an end; metadata never advances it); ``None`` without content."""
        content = {e.id: e for e in self.entries if isinstance(e, _CONTENT)}
        leaves = [e.entry_id for e in self.entries if isinstance(e, LeafLine)]
        if leaves and leaves[-1] in content:
            return leaves[-1]
        if not content:
            return None
        children: dict[str, list[str]] = {}
        for entry in content.values():
            if entry.parent_id in content:
                children.setdefault(entry.parent_id, []).append(entry.id)
        roots = sorted(i for i, e in content.items() if e.parent_id not in content)
        tip = roots[0] if roots else min(content)  # no root: links loop, any node is a branch
        seen = {tip}
        while len(below := children.get(tip, [])) == 1 and below[0] not in seen:
            tip = below[0]
            seen.add(tip)
        return tip

    def messages(self) -> list[ChatMessage]:
        """The active branch's messages, root first (:meth:`context`'s ``messages``)."""
        return self.context().messages

    def context(self) -> SessionContext:
        """What the active branch says, root first: its messages (a compaction drops those
        before its ``first_kept_entry_id`` and puts its summary first; a branch summary follows
        the entry it hangs from) and the metadata hung on its entries (the latest wins; labels
        added and removed in file order). Metadata of sibling branches is ignored."""
        by_id = {e.id: e for e in self.entries if isinstance(e, _CONTENT)}
        chain: list[MessageLine | CompactionLine] = []
        seen: set[str] = set()
        missing = 0
        node = by_id.get(self.content_tip or "")
        while node is not None and node.id not in seen:  # a cycle ends the walk
            seen.add(node.id)
            chain.append(node)
            parent = node.parent_id
            node = by_id.get(parent or "")
            missing += parent is not None and node is None
        chain.reverse()
        summaries: dict[str, list[ChatMessage]] = {}
        for entry in self.entries:
            if isinstance(entry, BranchSummaryLine) and entry.parent_id in seen:
                summaries.setdefault(entry.parent_id, []).append(entry.message())
        kept: list[tuple[str, ChatMessage]] = []
        summary: ChatMessage | None = None
        for entry in chain:
            if isinstance(entry, MessageLine):
                kept.append((entry.id, entry.message))
            else:
                ids = [entry_id for entry_id, _ in kept]
                if entry.first_kept_entry_id in ids:
                    kept = kept[ids.index(entry.first_kept_entry_id) :]
                summary = summary_message(entry.summary)
            kept += [(entry.id, message) for message in summaries.get(entry.id, ())]
        messages = [message for _, message in kept]
        context = SessionContext(
            messages=[summary, *messages] if summary is not None else messages,
            active_tip=chain[-1].id if chain else None,
            diagnostics=[
                *self.diagnostics,
                *(
                    [Diagnostic(code="session_context_missing_parent", count=missing)]
                    if missing
                    else []
                ),
            ],
        )
        return context.with_metadata([e for e in self.entries if e.parent_id in seen])


class SessionContext(_Line):
    """A session file's active branch as :meth:`SessionFile.context` reads it."""

    messages: list[ChatMessage]
    active_tip: str | None
    model: str | None = None
    thinking_level: Literal["none", "low", "medium", "high"] | None = None
    session_name: str | None = None
    labels: list[str] = Field(default_factory=list)
    extension_state: JsonValue = None
    diagnostics: list[Diagnostic] = Field(default_factory=list)

    def with_metadata(self, entries: Sequence[FileEntry]) -> SessionContext:
        """This context with the metadata of ``entries`` (those hung on its branch), in order."""
        found: dict[str, object] = {}
        labels: list[str] = []
        for entry in entries:
            if isinstance(entry, ModelChangeLine):
                found["model"] = entry.model
            elif isinstance(entry, ThinkingLevelChangeLine):
                found["thinking_level"] = entry.level
            elif isinstance(entry, SessionInfoLine):
                found["session_name"] = entry.name
            elif isinstance(entry, ExtensionStateLine):
                found["extension_state"] = entry.state
            elif isinstance(entry, LabelLine):
                if entry.action == "add" and entry.label not in labels:
                    labels.append(entry.label)
                elif entry.action == "remove" and entry.label in labels:
                    labels.remove(entry.label)
        return self.model_copy(update={**found, "labels": labels})


def read_session_file(path: str | Path) -> SessionFile:
    """Read a session file, skipping blank lines, a torn last line, corrupt lines and lines
    of an unknown ``type`` (counted in :attr:`SessionFile.recovery`). An empty file, a header
    that does not parse and a version other than 1 are ``decode`` errors."""
    target = Path(path)
    data = target.read_bytes()
    if not data:
        raise AgentError(ErrorKind.DECODE, f"session file {target} is empty")
    lines = data.split(b"\n")
    truncated = not data.endswith(b"\n")
    lines = lines[:-1]  # the part after the last newline: empty, or a torn write
    if not lines:
        raise AgentError(ErrorKind.DECODE, f"session file {target} has no complete header line")
    header = _header(target, lines[0])
    entries: list[FileEntry] = []
    corrupt = unknown = 0
    for raw in lines[1:]:
        if not raw.strip():
            continue
        entry, problem = _entry(raw)
        if entry is not None:
            entries.append(entry)
        elif problem == "unknown":
            unknown += 1
        else:
            corrupt += 1
    recovery = Recovery(truncated_line=truncated, corrupt_count=corrupt, unknown_count=unknown)
    return SessionFile(header=header, entries=entries, recovery=recovery)


def _header(path: Path, raw: bytes) -> SessionHeader:
    try:
        data = json.loads(raw)
    except ValueError:
        raise AgentError(ErrorKind.DECODE, f"session file {path}: the header is not JSON") from None
    if not isinstance(data, dict) or data.get("type") != "session":
        raise AgentError(ErrorKind.DECODE, f"session file {path}: the first line is no header")
    if data.get("version") != FORMAT_VERSION:
        raise AgentError(
            ErrorKind.DECODE,
            f"session file {path}: version {data.get('version')!r} is not {FORMAT_VERSION}",
        )
    try:
        return SessionHeader.model_validate(data)
    except ValidationError:
        raise AgentError(ErrorKind.DECODE, f"session file {path}: a malformed header") from None


def _entry(raw: bytes) -> tuple[FileEntry | None, Literal["corrupt", "unknown"] | None]:
    try:
        data = json.loads(raw)
    except ValueError:
        return None, "corrupt"
    if not isinstance(data, dict) or not isinstance(data.get("type"), str):
        return None, "corrupt"
    if data["type"] not in _KNOWN:
        return None, "unknown"
    try:
        return _entry_adapter.validate_python(data), None
    except ValidationError:
        return None, "corrupt"


def write_entries(path: str | Path, header: SessionHeader, entries: Sequence[FileEntry]) -> None:
    """A new session file holding ``header`` and ``entries``."""
    with SessionFileWriter.create(path, header) as writer:
        for entry in entries:
            writer.append(entry)

"""Session files: the JSONL format, the crash-safe writer, the recovering reader and entries a
newer writer added [OP-19..OP-22]; every file lives in the test's own temporary directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_plugin.compaction import SUMMARY_PREFIX
from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.messages import ChatMessage
from agent_plugin.session_files import (
    BRANCH_SUMMARY_PREFIX,
    BranchSummaryLine,
    CompactionLine,
    Diagnostic,
    ExtensionStateLine,
    FileEntry,
    LabelLine,
    LeafLine,
    MessageLine,
    ModelChangeLine,
    Recovery,
    SessionFileWriter,
    SessionHeader,
    SessionInfoLine,
    ThinkingLevelChangeLine,
    read_session_file,
    write_entries,
)

HEADER = SessionHeader(id="s1", timestamp="2026-12-02T04:00:00+00:00", cwd="/srv/app")


def message(entry_id: str, parent: str | None, text: str) -> MessageLine:
    return MessageLine(id=entry_id, parent_id=parent, message=ChatMessage.user(text))


def every_entry() -> list[FileEntry]:
    return [
        message("a", None, "q1"),
        MessageLine(id="b", parent_id="a", message=ChatMessage.assistant("a1")),
        CompactionLine(
            id="c",
            parent_id="b",
            summary="sum",
            first_kept_entry_id="b",
            tokens_before=9,
            tokens_after=3,
        ),
        LeafLine(id="d", parent_id="c", entry_id="b"),
        ExtensionStateLine(id="e", parent_id="b", state={"k": [1, None]}),
        SessionInfoLine(id="f", parent_id="b", name="triage"),
        ModelChangeLine(id="g", parent_id="b", model="openai:gpt-4o"),
        ThinkingLevelChangeLine(id="h", parent_id="b", level="high"),
        LabelLine(id="i", parent_id="b", label="keep", action="add"),
        BranchSummaryLine(id="j", parent_id="b", summary="tried x"),
    ]


def lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_op19_a_file_is_a_header_line_then_one_tagged_line_per_entry(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    written = every_entry()
    write_entries(path, HEADER, written)
    header, *entries = lines(path)
    assert header == {
        "type": "session",
        "version": 1,
        "id": "s1",
        "timestamp": "2026-12-02T04:00:00+00:00",
        "cwd": "/srv/app",
        "parent_session": None,
    }
    assert [e["type"] for e in entries] == [
        "message", "message", "compaction", "leaf", "extension_state", "session_info",
        "model_change", "thinking_level_change", "label", "branch_summary",
    ]  # fmt: skip
    assert all({"id", "parent_id", "timestamp"} <= e.keys() for e in entries)
    assert entries[0]["parent_id"] is None
    assert entries[3]["entry_id"] == "b"
    read = read_session_file(path)
    assert read.header == HEADER
    assert read.entries == written
    assert read.recovery == Recovery()
    assert (read.recovery.status, read.diagnostics) == ("clean", [])


def test_op20_appends_go_line_by_line_and_reopening_cuts_a_torn_line(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    with SessionFileWriter.create(path, HEADER) as writer:
        writer.append(message("a", None, "q1"))
    with pytest.raises(AgentError) as caught:
        SessionFileWriter.create(path, HEADER)
    assert caught.value.kind is ErrorKind.CONFIG
    with path.open("ab") as torn:
        torn.write(b'{"type": "message", "id": "b", "par')  # a crash mid-write
    with SessionFileWriter.open(path) as writer:
        assert path.read_bytes().endswith(b"\n")  # the torn line is gone, the newline kept
        writer.append(message("b", "a", "q2"))
    assert [e["id"] for e in lines(path)[1:]] == ["a", "b"]
    assert read_session_file(path).recovery == Recovery()

    # a file without any newline is cut to empty
    headless = tmp_path / "torn.jsonl"
    headless.write_bytes(b'{"type": "session", "vers')
    SessionFileWriter.open(headless).close()
    assert headless.read_bytes() == b""


def test_op21_the_reader_skips_what_a_crash_left_and_says_so(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    write_entries(path, HEADER, [message("a", None, "q1"), message("b", "a", "q2")])
    clean = path.read_bytes()

    path.write_bytes(clean + b'{"type": "message", "id": "c"')  # torn last line
    read = read_session_file(path)
    assert [e.id for e in read.entries] == ["a", "b"]
    assert read.recovery.status == "truncated_line"
    assert read.diagnostics == [Diagnostic(code="session_truncated_line", count=1)]

    head, rest = clean.split(b"\n", 1)
    path.write_bytes(head + b"\n\n   \nnot json\n" + rest + b'{"type": "message"}\n')
    read = read_session_file(path)  # blank lines skipped, two corrupt lines counted
    assert [e.id for e in read.entries] == ["a", "b"]
    assert read.recovery == Recovery(corrupt_count=2)
    assert read.diagnostics == [Diagnostic(code="session_corrupt_entries", count=2)]

    path.write_bytes(clean + b"[1]\n{ torn")
    read = read_session_file(path)
    assert read.recovery.status == "corrupt_entries_with_truncation"
    assert read.diagnostics == [Diagnostic(code="session_corrupt_with_truncation", count=1)]
    # diagnostics carry counts only, never what the lines held
    assert "torn" not in json.dumps([d.model_dump() for d in read.diagnostics])

    for content, problem in [
        (b"", "empty"),
        (b'{"type": "session", "version": 1', "no complete header"),
        (b"nope\n", "not JSON"),
        (b'{"type": "message"}\n', "no header"),
        (b'{"type": "session", "version": 2, "id": "s"}\n', "version 2"),
    ]:
        path.write_bytes(content)
        with pytest.raises(AgentError) as caught:
            read_session_file(path)
        assert caught.value.kind is ErrorKind.DECODE
        assert problem in str(caught.value)


def test_op22_unknown_entry_types_are_skipped_and_metadata_keeps_the_tip(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.jsonl"
    write_entries(
        path,
        HEADER,
        [
            message("a", None, "q1"),
            message("b", "a", "q2"),
            SessionInfoLine(id="m1", parent_id="b", name="triage"),
            LabelLine(id="m2", parent_id="b", label="keep", action="add"),
            BranchSummaryLine(id="m3", parent_id="b", summary="tried x"),
        ],
    )
    with path.open("ab") as more:
        more.write(b'{"type": "custom_note", "id": "x", "parent_id": "b", "timestamp": "t"}\n')
        more.write(b'{"type": "label", "id": "y", "label": "k", "action": "toggle"}\n')
    read = read_session_file(path)
    assert read.recovery == Recovery(corrupt_count=1, unknown_count=1)
    assert read.diagnostics == [
        Diagnostic(code="session_corrupt_entries", count=1),
        Diagnostic(code="session_unknown_entries", count=1),
    ]
    assert read.content_tip == "b"
    # of the metadata, only the branch summary enters the model's context
    assert [m.text for m in read.messages()] == ["q1", "q2", f"{BRANCH_SUMMARY_PREFIX}tried x"]


def test_a_leaf_entry_picks_the_branch_and_a_compaction_folds_its_head(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    entries: list[FileEntry] = [
        message("a", None, "q1"),
        message("b", "a", "q2"),
        message("c", "b", "q3"),
        message("d", "a", "other"),
    ]
    write_entries(path, HEADER, entries)
    assert read_session_file(path).content_tip == "a"  # no leaf: the trunk's tip (a forks)
    with SessionFileWriter.open(path) as writer:
        writer.append(LeafLine(id="l1", parent_id="d", entry_id="c"))
        writer.append(LeafLine(id="l2", parent_id="c", entry_id="missing"))
    read = read_session_file(path)
    assert read.content_tip == "a"  # the last leaf names nothing: back to the trunk's tip
    with SessionFileWriter.open(path) as writer:
        writer.append(LeafLine(id="l3", parent_id="d", entry_id="c"))
        writer.append(
            CompactionLine(
                id="k",
                parent_id="c",
                summary="S",
                first_kept_entry_id="b",
                tokens_before=9,
                tokens_after=3,
            )
        )
    read = read_session_file(path)
    assert read.content_tip == "c"  # the last leaf wins over the newer compaction
    assert [m.text for m in read.messages()] == ["q1", "q2", "q3"]
    with SessionFileWriter.open(path) as writer:
        writer.append(LeafLine(id="l4", parent_id="k", entry_id="k"))
    assert [m.text for m in read_session_file(path).messages()] == [
        f"{SUMMARY_PREFIX}S",
        "q2",
        "q3",
    ]


def test_op24_the_context_of_the_active_branch_and_its_metadata(tmp_path: Path) -> None:
    """Root to tip: a compaction keeps from its first kept entry with its summary first, a
    branch summary follows the entry it hangs from, metadata of the branch applies (the latest
    wins, labels add and remove in order) and a sibling branch's metadata is ignored."""
    path = tmp_path / "s.jsonl"
    write_entries(
        path,
        HEADER,
        [
            message("a", None, "q1"),
            message("b", "a", "q2"),
            BranchSummaryLine(id="bs", parent_id="b", summary="tried x"),
            ModelChangeLine(id="m1", parent_id="b", model="openai:gpt-4o"),
            LabelLine(id="l1", parent_id="b", label="keep", action="add"),
            LabelLine(id="l2", parent_id="b", label="urgent", action="add"),
            message("c", "b", "q3"),
            CompactionLine(
                id="k",
                parent_id="c",
                summary="S",
                first_kept_entry_id="b",
                tokens_before=9,
                tokens_after=3,
            ),
            message("d", "k", "q4"),
            ModelChangeLine(id="m2", parent_id="d", model="anthropic:claude-sonnet-4-5"),
            ThinkingLevelChangeLine(id="t1", parent_id="d", level="high"),
            LabelLine(id="l3", parent_id="d", label="keep", action="remove"),
            SessionInfoLine(id="n1", parent_id="d", name="triage"),
            ExtensionStateLine(id="e1", parent_id="d", state={"step": 2}),
            message("s", "a", "sibling"),  # another branch from a: its metadata is not ours
            ModelChangeLine(id="m3", parent_id="s", model="openai:gpt-4o-mini"),
            SessionInfoLine(id="n2", parent_id="s", name="other"),
            LeafLine(id="leaf", parent_id="s", entry_id="d"),
        ],
    )
    context = read_session_file(path).context()
    assert context.active_tip == "d"
    assert [m.text for m in context.messages] == [
        f"{SUMMARY_PREFIX}S",
        "q2",
        f"{BRANCH_SUMMARY_PREFIX}tried x",
        "q3",
        "q4",
    ]
    assert (context.model, context.thinking_level) == ("anthropic:claude-sonnet-4-5", "high")
    assert (context.session_name, context.extension_state) == ("triage", {"step": 2})
    assert context.labels == ["urgent"]
    assert context.diagnostics == []


def test_op24_a_missing_parent_is_a_diagnostic(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    write_entries(path, HEADER, [message("b", "gone", "q2"), message("c", "b", "q3")])
    context = read_session_file(path).context()
    assert [m.text for m in context.messages] == ["q2", "q3"]
    assert context.diagnostics == [Diagnostic(code="session_context_missing_parent", count=1)]

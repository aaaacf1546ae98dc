"""The transcript: token estimates kept beside the messages, the window a request sends, folds."""

from agent_plugin.budget import estimate_message, truncate_history
from agent_plugin.compaction import CompactionResult, summary_message
from agent_plugin.messages import ChatMessage
from agent_plugin.outcomes import CompactionReport
from agent_plugin.transcript import Transcript

SYSTEM = ChatMessage.system("You are terse.")


def _messages(count: int) -> list[ChatMessage]:
    return [
        ChatMessage.user(f"question {i} " + "word " * 20)
        if i % 2 == 0
        else ChatMessage.assistant(f"answer {i} " + "word " * 20)
        for i in range(count)
    ]


def _folded_head(messages: list[ChatMessage], split: int, summary: str) -> CompactionResult:
    return CompactionResult(
        summary=summary,
        messages=[summary_message(summary), *messages[split:]],
        report=CompactionReport(summarized_messages=split, tokens_before=900, tokens_after=200),
    )


def test_the_estimates_follow_every_append() -> None:
    messages = _messages(3)
    transcript = Transcript(messages, history_length=3, folded=None)
    added = ChatMessage.user("one more")
    transcript.append(added)
    assert transcript.messages is messages  # the run's own list, not a copy
    assert transcript.costs == [estimate_message(m) for m in messages]
    assert transcript.total_cost == sum(estimate_message(m) for m in messages)


def test_a_window_that_fits_sends_everything_with_its_sum() -> None:
    transcript = Transcript(_messages(4), history_length=4, folded=None)
    cost = estimate_message(SYSTEM)
    window, tokens = transcript.window(SYSTEM, cost, remaining=10_000)
    assert window == [SYSTEM, *transcript.messages]
    assert tokens == cost + transcript.total_cost


def test_a_window_too_large_is_truncated_like_the_history_is() -> None:
    messages = _messages(12)
    transcript = Transcript(list(messages), history_length=12, folded=None)
    cost = estimate_message(SYSTEM)
    remaining = cost + transcript.total_cost // 3
    window, tokens = transcript.window(SYSTEM, cost, remaining)
    assert window == truncate_history([SYSTEM, *messages], remaining)
    assert window[0] == SYSTEM
    assert len(window) < 13
    assert tokens == sum(estimate_message(m) for m in window) <= remaining


def test_a_fold_replaces_the_head_and_keeps_the_estimates_true() -> None:
    messages = _messages(8)
    transcript = Transcript(messages, history_length=6, folded=None)
    tail = messages[4:]
    transcript.fold(_folded_head(messages, 4, "They talked about words."))
    assert transcript.messages == [summary_message("They talked about words."), *tail]
    assert transcript.costs == [estimate_message(m) for m in transcript.messages]
    assert transcript.total_cost == sum(transcript.costs)
    assert transcript.history_length == 3  # 6 given, 4 folded into 1
    assert transcript.folded is not None
    assert transcript.folded.summary == "They talked about words."
    assert transcript.folded.report.summarized_messages == 4


def test_a_second_fold_counts_both_as_one() -> None:
    transcript = Transcript(_messages(10), history_length=8, folded=None)
    transcript.fold(_folded_head(transcript.messages, 4, "first"))  # 1 summary + 6 left
    transcript.fold(_folded_head(transcript.messages, 3, "second"))  # the summary + 2 more
    assert transcript.messages[0] == summary_message("second")
    assert len(transcript.messages) == 5
    assert transcript.folded is not None
    assert transcript.folded.report.summarized_messages == 6  # 4 first, then 2 more
    assert transcript.history_length == 3

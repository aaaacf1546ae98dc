"""The provider-neutral conversation model: JSON shape, round trips, usage and repair.

Seed cases: ``transcripts_round_trip_through_json`` and ``token_usage_saturates`` [reference
§1.3]; ``repair_transcript`` is what ``run_turn`` does to a caller's history.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import JsonValue, TypeAdapter, ValidationError

from agent_plugin.messages import (
    ChatMessage,
    ContentPart,
    Image,
    ImagePart,
    RedactedThinking,
    RedactedThinkingPart,
    Role,
    TextPart,
    Thinking,
    ThinkingPart,
    TokenUsage,
    ToolCall,
    ToolCallPart,
    ToolResult,
    ToolResultPart,
    repair_transcript,
    text_of,
    tool_calls_of,
)

TOKEN_MAX = 2**32 - 1

transcript_adapter: TypeAdapter[list[ChatMessage]] = TypeAdapter(list[ChatMessage])


def _every_part_transcript() -> list[ChatMessage]:
    weather = ToolCall(id="call_1", name="get_weather", arguments={"city": "Oslo", "days": 2})
    broken = ToolCall(id="call_2", name="get_weather", raw_arguments='{"city": "Oslo"')
    return [
        ChatMessage.system("You are terse."),
        ChatMessage(
            role=Role.USER,
            content=[
                TextPart(text="What is in these pictures? Ünïcödé 日本 🙂"),
                ImagePart(image=Image(url="https://example.com/cat.png")),
                ImagePart(image=Image(data="iVBORw0KGgo=", media_type="image/png")),
            ],
        ),
        ChatMessage(
            role=Role.ASSISTANT,
            content=[
                ThinkingPart(thinking=Thinking(text="The user wants weather.", signature="c2ln")),
                ThinkingPart(thinking=Thinking(text="unsigned")),
                RedactedThinkingPart(redacted_thinking=RedactedThinking(data="EmwKAhgB")),
                TextPart(text="Let me check."),
                ToolCallPart(tool_call=weather),
                ToolCallPart(tool_call=broken),
            ],
        ),
        ChatMessage.tool_results(
            [
                ToolResult(tool_call_id="call_1", content='{"temp":4}'),
                ToolResult(
                    tool_call_id="call_2",
                    content='{"error":"the arguments are not valid JSON"}',
                    is_error=True,
                ),
            ]
        ),
        ChatMessage.assistant("It is 4 degrees in Oslo."),
    ]


EVERY_PART_JSON: list[JsonValue] = [
    {"role": "system", "content": [{"text": "You are terse."}]},
    {
        "role": "user",
        "content": [
            {"text": "What is in these pictures? Ünïcödé 日本 🙂"},
            {"image": {"url": "https://example.com/cat.png"}},
            {"image": {"data": "iVBORw0KGgo=", "media_type": "image/png"}},
        ],
    },
    {
        "role": "assistant",
        "content": [
            {"thinking": {"text": "The user wants weather.", "signature": "c2ln"}},
            {"thinking": {"text": "unsigned"}},
            {"redacted_thinking": {"data": "EmwKAhgB"}},
            {"text": "Let me check."},
            {
                "tool_call": {
                    "id": "call_1",
                    "name": "get_weather",
                    "arguments": {"city": "Oslo", "days": 2},
                }
            },
            {
                "tool_call": {
                    "id": "call_2",
                    "name": "get_weather",
                    "arguments": {},
                    "raw_arguments": '{"city": "Oslo"',
                }
            },
        ],
    },
    {
        "role": "tool",
        "content": [
            {"tool_result": {"tool_call_id": "call_1", "content": '{"temp":4}'}},
            {
                "tool_result": {
                    "tool_call_id": "call_2",
                    "content": '{"error":"the arguments are not valid JSON"}',
                    "is_error": True,
                }
            },
        ],
    },
    {"role": "assistant", "content": [{"text": "It is 4 degrees in Oslo."}]},
]


# --- JSON shape and round trips -------------------------------------------------------------------


def test_transcripts_round_trip_through_json() -> None:
    transcript = _every_part_transcript()
    encoded = transcript_adapter.dump_json(transcript)
    decoded = transcript_adapter.validate_json(encoded)
    assert decoded == transcript
    assert transcript_adapter.dump_json(decoded) == encoded
    for message in transcript:
        assert ChatMessage.model_validate_json(message.model_dump_json()) == message


def test_parts_are_externally_tagged() -> None:
    dumped = json.loads(transcript_adapter.dump_json(_every_part_transcript()))
    assert dumped == EVERY_PART_JSON
    # and the documented shape parses into the same objects
    assert transcript_adapter.validate_python(EVERY_PART_JSON) == _every_part_transcript()


def test_seed_shaped_json_parses() -> None:
    """JSON written by the seed (no optional fields) is read with the defaults."""
    raw = (
        '[{"role":"user","content":[{"text":"hi"}]},'
        '{"role":"assistant","content":[{"tool_call":{"id":"c1","name":"f","arguments":{}}}]},'
        '{"role":"tool","content":[{"tool_result":{"tool_call_id":"c1","content":"\\"data\\""}}]}]'
    )
    messages = transcript_adapter.validate_json(raw)
    assert messages[1].tool_calls == [ToolCall(id="c1", name="f", arguments={})]
    assert messages[1].tool_calls[0].raw_arguments is None
    result = messages[2].content[0]
    assert isinstance(result, ToolResultPart)
    assert result.tool_result == ToolResult(tool_call_id="c1", content='"data"')
    assert result.tool_result.is_error is False
    assert transcript_adapter.dump_json(messages).decode() == raw


def test_defaults_are_left_out_of_the_json() -> None:
    call = ToolCall(id="c1", name="f")
    assert call.arguments == {}
    assert json.loads(call.model_dump_json()) == {"id": "c1", "name": "f", "arguments": {}}
    result = ToolResult(tool_call_id="c1", content="ok")
    assert json.loads(result.model_dump_json()) == {"tool_call_id": "c1", "content": "ok"}
    assert json.loads(Thinking(text="t").model_dump_json()) == {"text": "t"}
    # set values survive, even the falsy ones that are not the default
    assert json.loads(ToolCall(id="c", name="f", raw_arguments="").model_dump_json()) == {
        "id": "c",
        "name": "f",
        "arguments": {},
        "raw_arguments": "",
    }


@pytest.mark.parametrize(
    "part",
    [
        {"video": {"url": "https://example.com/v.mp4"}},
        {},
        {"Text": "capitalised tags are not tags"},
        "a bare string",
        None,
        42,
        ["text", "hi"],
    ],
)
def test_unknown_part_tags_are_rejected(part: object) -> None:
    raw = json.dumps({"role": "user", "content": [part]})
    with pytest.raises(ValidationError):
        ChatMessage.model_validate_json(raw)
    with pytest.raises(ValidationError):
        ChatMessage.model_validate({"role": "user", "content": [part]})


@pytest.mark.parametrize(
    "part",
    [
        {"text": "hi", "tool_call": {"id": "c", "name": "f"}},  # two tags in one part
        {"text": 5},
        {"tool_call": {"id": "c"}},
        {"tool_result": {"tool_call_id": "c", "content": {"not": "a string"}}},
        {"thinking": {"signature": "no text"}},
        {"redacted_thinking": {}},
    ],
)
def test_malformed_parts_are_rejected(part: object) -> None:
    with pytest.raises(ValidationError):
        ChatMessage.model_validate_json(json.dumps({"role": "assistant", "content": [part]}))


def test_unknown_roles_are_rejected() -> None:
    with pytest.raises(ValidationError):
        ChatMessage.model_validate_json('{"role":"robot","content":[]}')


def test_roles_serialize_as_lowercase_strings() -> None:
    assert [r.value for r in Role] == ["system", "user", "assistant", "tool"]
    assert (
        json.loads(ChatMessage.of_text("assistant", "x").model_dump_json())["role"] == "assistant"
    )
    assert ChatMessage.of_text(Role.TOOL, "x").role is Role.TOOL


def test_message_helpers() -> None:
    message = _every_part_transcript()[2]
    assert message.text == "Let me check."
    assert [c.id for c in message.tool_calls] == ["call_1", "call_2"]
    assert text_of(message.content) == "Let me check."
    assert tool_calls_of(message.content) == message.tool_calls
    assert ChatMessage.user("a").content == [TextPart(text="a")]
    assert ChatMessage.system("s").role is Role.SYSTEM
    assert ChatMessage.assistant("x").role is Role.ASSISTANT
    assert ChatMessage.tool_results([]).content == []


def test_messages_are_frozen() -> None:
    message = ChatMessage.user("hi")
    with pytest.raises(ValidationError):
        message.role = Role.ASSISTANT  # type: ignore[misc]


# --- generated round trips ------------------------------------------------------------------------

_json_values: st.SearchStrategy[JsonValue] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=6,
)
_short = st.text(max_size=12)
_maybe = st.none() | _short

_parts: st.SearchStrategy[ContentPart] = st.one_of(
    st.builds(TextPart, text=_short),
    st.builds(
        ToolCallPart,
        tool_call=st.builds(
            ToolCall, id=_short, name=_short, arguments=_json_values, raw_arguments=_maybe
        ),
    ),
    st.builds(
        ToolResultPart,
        tool_result=st.builds(
            ToolResult, tool_call_id=_short, content=_short, is_error=st.booleans()
        ),
    ),
    st.builds(ImagePart, image=st.builds(Image, url=_maybe, data=_maybe, media_type=_maybe)),
    st.builds(ThinkingPart, thinking=st.builds(Thinking, text=_short, signature=_maybe)),
    st.builds(RedactedThinkingPart, redacted_thinking=st.builds(RedactedThinking, data=_short)),
)
_messages = st.builds(
    ChatMessage, role=st.sampled_from(list(Role)), content=st.lists(_parts, max_size=4)
)


@given(st.lists(_messages, max_size=4))
@settings(max_examples=80, deadline=None)
def test_generated_transcripts_round_trip_through_json(transcript: list[ChatMessage]) -> None:
    encoded = transcript_adapter.dump_json(transcript)
    decoded = transcript_adapter.validate_json(encoded)
    assert decoded == transcript
    assert transcript_adapter.dump_json(decoded) == encoded
    # python-mode dumps (what a database JSON column gets) round-trip too
    assert (
        transcript_adapter.validate_python(transcript_adapter.dump_python(transcript, mode="json"))
        == transcript
    )


# --- TokenUsage ---------------------------------------------------------------------------------


def test_token_usage_total_is_input_plus_output() -> None:
    usage = TokenUsage(
        input_tokens=2000, output_tokens=17, cache_read_tokens=1536, cache_write_tokens=100
    )
    assert usage.total() == 2017
    assert TokenUsage().total() == 0


def test_token_usage_adds_field_by_field() -> None:
    a = TokenUsage(input_tokens=10, output_tokens=5, cache_read_tokens=3, cache_write_tokens=1)
    b = TokenUsage(input_tokens=20, output_tokens=7, cache_read_tokens=0, cache_write_tokens=2)
    assert a + b == TokenUsage(
        input_tokens=30, output_tokens=12, cache_read_tokens=3, cache_write_tokens=3
    )
    assert a + TokenUsage() == a


def test_token_usage_saturates() -> None:
    full = TokenUsage(
        input_tokens=TOKEN_MAX,
        output_tokens=TOKEN_MAX,
        cache_read_tokens=TOKEN_MAX,
        cache_write_tokens=TOKEN_MAX,
    )
    one = TokenUsage(input_tokens=1, output_tokens=1, cache_read_tokens=1, cache_write_tokens=1)
    assert full + one == full
    assert one + full == full
    assert full.total() == TOKEN_MAX
    assert (TokenUsage(input_tokens=TOKEN_MAX - 1) + TokenUsage(input_tokens=5)).input_tokens == (
        TOKEN_MAX
    )
    assert TokenUsage(input_tokens=TOKEN_MAX - 3, output_tokens=10).total() == TOKEN_MAX


@given(
    st.lists(
        st.builds(
            TokenUsage,
            input_tokens=st.integers(0, TOKEN_MAX),
            output_tokens=st.integers(0, TOKEN_MAX),
            cache_read_tokens=st.integers(0, TOKEN_MAX),
            cache_write_tokens=st.integers(0, TOKEN_MAX),
        ),
        max_size=5,
    )
)
@settings(max_examples=50)
def test_token_usage_sums_are_saturating_sums(usages: list[TokenUsage]) -> None:
    total = TokenUsage()
    for usage in usages:
        total = total + usage
    assert total.input_tokens == min(sum(u.input_tokens for u in usages), TOKEN_MAX)
    assert total.output_tokens == min(sum(u.output_tokens for u in usages), TOKEN_MAX)
    assert total.cache_read_tokens == min(sum(u.cache_read_tokens for u in usages), TOKEN_MAX)
    assert total.cache_write_tokens == min(sum(u.cache_write_tokens for u in usages), TOKEN_MAX)
    assert total.total() <= TOKEN_MAX


def test_token_usage_json() -> None:
    usage = TokenUsage(input_tokens=42, output_tokens=17)
    assert json.loads(usage.model_dump_json()) == {
        "input_tokens": 42,
        "output_tokens": 17,
        "cache_read_tokens": 0,
        "cache_write_tokens": 0,
    }
    # the cache counts default to 0 when absent
    assert TokenUsage.model_validate_json('{"input_tokens":42,"output_tokens":17}') == usage
    assert TokenUsage.model_validate_json("{}") == TokenUsage()


# --- repair_transcript --------------------------------------------------------------------------


def _calls(*ids: str, text: str | None = None) -> ChatMessage:
    content: list[ContentPart] = [TextPart(text=text)] if text is not None else []
    content.extend(
        ToolCallPart(tool_call=ToolCall(id=i, name="f", arguments={"i": i})) for i in ids
    )
    return ChatMessage(role=Role.ASSISTANT, content=content)


def _results(*ids: str) -> ChatMessage:
    return ChatMessage.tool_results([ToolResult(tool_call_id=i, content=f"r-{i}") for i in ids])


def _result_ids(message: ChatMessage) -> list[str]:
    return [p.tool_result.tool_call_id for p in message.content if isinstance(p, ToolResultPart)]


def _assert_valid(messages: list[ChatMessage]) -> None:
    """Every call is answered by the next message, and every result has its call just before."""
    for i, message in enumerate(messages):
        assert message.role is not Role.SYSTEM
        if message.role is Role.ASSISTANT and message.tool_calls:
            assert i + 1 < len(messages), "the last call is unanswered"
            answer = messages[i + 1]
            assert answer.role is Role.TOOL
            assert set(_result_ids(answer)) == {c.id for c in message.tool_calls}
        if message.role is Role.TOOL:
            assert message.content, "an empty tool message"
            assert all(isinstance(p, ToolResultPart) for p in message.content)
            assert i > 0
            previous = messages[i - 1]
            assert previous.role is Role.ASSISTANT
            assert set(_result_ids(message)) <= {c.id for c in previous.tool_calls}


def _is_unanswered_error(part: ContentPart, call_id: str) -> bool:
    return (
        isinstance(part, ToolResultPart)
        and part.tool_result.tool_call_id == call_id
        and part.tool_result.is_error
        and "error" in json.loads(part.tool_result.content)
    )


def test_repair_keeps_a_valid_transcript_as_the_same_objects() -> None:
    transcript = [
        ChatMessage.user("weather?"),
        _calls("a", "b", text="checking"),
        _results("b", "a"),
        ChatMessage.assistant("done"),
        ChatMessage.user("again"),
        _calls("c"),
        _results("c"),
    ]
    repaired = repair_transcript(transcript)
    assert len(repaired) == len(transcript)
    assert all(r is m for r, m in zip(repaired, transcript, strict=True))
    assert repair_transcript([]) == []


def test_repair_drops_system_messages() -> None:
    user, answer = ChatMessage.user("hi"), ChatMessage.assistant("hello")
    repaired = repair_transcript([ChatMessage.system("old prompt"), user, answer])
    assert repaired == [user, answer]
    assert repaired[0] is user


def test_repair_answers_unanswered_calls_right_after_them() -> None:
    call = _calls("a", "b")
    user = ChatMessage.user("never mind")
    repaired = repair_transcript([ChatMessage.user("go"), call, user])
    assert repaired[1] is call
    assert repaired[2].role is Role.TOOL
    assert _result_ids(repaired[2]) == ["a", "b"]
    assert all(_is_unanswered_error(p, i) for p, i in zip(repaired[2].content, "ab", strict=True))
    assert repaired[3] is user
    _assert_valid(repaired)


def test_repair_answers_a_trailing_call() -> None:
    repaired = repair_transcript([ChatMessage.user("go"), _calls("a")])
    assert len(repaired) == 3
    assert _is_unanswered_error(repaired[2].content[0], "a")


def test_repair_completes_a_partial_answer() -> None:
    repaired = repair_transcript([ChatMessage.user("go"), _calls("a", "b"), _results("b")])
    assert _result_ids(repaired[2]) == ["b", "a"]
    first = repaired[2].content[0]
    assert isinstance(first, ToolResultPart)
    assert first.tool_result.content == "r-b"
    assert _is_unanswered_error(repaired[2].content[1], "a")
    _assert_valid(repaired)


def test_repair_drops_stray_results() -> None:
    user, answer = ChatMessage.user("go"), ChatMessage.assistant("ok")
    # a leading result, a result after a plain answer, and a second answer to a call
    repaired = repair_transcript(
        [_results("x"), user, answer, _results("y"), _calls("a"), _results("a"), _results("a")]
    )
    assert repaired[:2] == [user, answer]
    assert [m.role for m in repaired] == [Role.USER, Role.ASSISTANT, Role.ASSISTANT, Role.TOOL]
    _assert_valid(repaired)


def test_repair_keeps_known_results_and_drops_unknown_ones_in_one_message() -> None:
    repaired = repair_transcript([ChatMessage.user("go"), _calls("a"), _results("a", "zzz")])
    assert _result_ids(repaired[2]) == ["a"]
    _assert_valid(repaired)


def test_repair_a_call_answered_after_another_message_is_unanswered() -> None:
    repaired = repair_transcript(
        [ChatMessage.user("go"), _calls("a"), ChatMessage.user("hurry"), _results("a")]
    )
    assert [m.role for m in repaired] == [Role.USER, Role.ASSISTANT, Role.TOOL, Role.USER]
    assert _is_unanswered_error(repaired[2].content[0], "a")
    _assert_valid(repaired)


@st.composite
def messy_transcripts(draw: st.DrawFn) -> list[ChatMessage]:
    """Any order of system, user, plain assistant, calling assistant and tool messages.

    Call ids come from a tiny pool so results often name a call, just not the right one.
    """
    ids = st.sampled_from(["a", "b", "c", "d"])
    kinds = st.sampled_from(["system", "user", "assistant", "calls", "results", "results"])
    messages: list[ChatMessage] = []
    for kind in draw(st.lists(kinds, max_size=10)):
        if kind == "system":
            messages.append(ChatMessage.system("s"))
        elif kind == "user":
            messages.append(ChatMessage.user("u"))
        elif kind == "assistant":
            messages.append(ChatMessage.assistant("x"))
        elif kind == "calls":
            messages.append(_calls(*draw(st.lists(ids, min_size=1, max_size=3, unique=True))))
        else:
            messages.append(_results(*draw(st.lists(ids, max_size=3))))
    return messages


@given(messy_transcripts())
@settings(max_examples=150, deadline=None)
def test_repair_always_gives_a_valid_transcript(messages: list[ChatMessage]) -> None:
    repaired = repair_transcript(messages)
    _assert_valid(repaired)
    # nothing but system messages and stray results is lost: every user and assistant survives
    kept = [m for m in messages if m.role in (Role.USER, Role.ASSISTANT)]
    assert [m for m in repaired if m.role in (Role.USER, Role.ASSISTANT)] == kept
    assert all(
        a is b for a, b in zip([m for m in repaired if m.role is not Role.TOOL], kept, strict=True)
    )
    # repairing again changes nothing, down to the objects
    again = repair_transcript(repaired)
    assert len(again) == len(repaired)
    assert all(a is b for a, b in zip(again, repaired, strict=True))


def test_results_split_over_several_tool_messages_are_merged() -> None:
    assistant = ChatMessage(
        role=Role.ASSISTANT,
        content=[
            ToolCallPart(tool_call=ToolCall(id="a", name="x")),
            ToolCallPart(tool_call=ToolCall(id="b", name="x")),
        ],
    )
    one = ChatMessage.tool_results([ToolResult(tool_call_id="a", content="A")])
    two = ChatMessage.tool_results([ToolResult(tool_call_id="b", content="B")])
    repaired = repair_transcript([ChatMessage.user("go"), assistant, one, two])
    assert [m.role for m in repaired] == [Role.USER, Role.ASSISTANT, Role.TOOL]
    contents = [p.tool_result.content for p in repaired[2].content]  # type: ignore[union-attr]
    assert contents == ["A", "B"]


def test_costs_add_up_as_prices_do() -> None:
    """Three calls of 0.000108 USD cost 0.000324 USD, not 0.00032399999999999996."""
    call = TokenUsage(input_tokens=1, output_tokens=1, cost_usd=0.000108)
    assert (call + call + call).cost_usd == 0.000324
    assert (call + TokenUsage(input_tokens=1, output_tokens=1)).cost_usd == 0.000108

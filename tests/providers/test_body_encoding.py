"""``encode_body``: the bytes both wire clients send, built from the encoded prefixes of the
conversations a client carries on, must always be the JSON of ``build_body`` (byte for byte: the
same compact encoding, keys in the same order), whatever the history, the options,
``extra_body`` and the store's state."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_plugin.errors import AgentError, ErrorKind
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
    ToolCall,
    ToolCallPart,
    ToolDefinition,
    ToolResult,
    ToolResultPart,
)
from agent_plugin.providers import anthropic as anthropic_module
from agent_plugin.providers import openai as openai_module
from agent_plugin.providers.anthropic import AnthropicClient
from agent_plugin.providers.base import ChatRequest, StreamDone
from agent_plugin.providers.encoding import (
    MESSAGE_COST,
    EncodedCache,
    EncodedPrefixes,
    RawJson,
    dumps,
    encode_json,
)
from agent_plugin.providers.openai import OpenAICompatibleClient
from tests.providers.test_anthropic_wire import REQUESTS, conversation
from tests.providers.test_openai_wire import request_for
from tests.wire import fixture_names, load

Client = OpenAICompatibleClient | AnthropicClient
KEY = "sk-test-0123456789abcdef"


def offline(_: httpx.Request) -> httpx.Response:
    raise AssertionError("encoding tests send nothing")


def openai_client() -> OpenAICompatibleClient:
    return OpenAICompatibleClient(api_key=KEY, transport=httpx.MockTransport(offline))


def anthropic_client(*, prompt_caching: bool = True) -> AnthropicClient:
    return AnthropicClient(
        api_key=KEY, prompt_caching=prompt_caching, transport=httpx.MockTransport(offline)
    )


def reference_bytes(body: dict[str, Any]) -> bytes:
    """How the clients encoded ``build_body`` before encode_body existed."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


def check(client: Client, request: ChatRequest) -> None:
    """encode_body equals build_body, twice (the second time from the cache), stream or not,
    and leaves the request alone."""
    before = copy.deepcopy(request)
    for stream in (False, True, False):
        body = client.build_body(request, stream=stream)
        data = client.encode_body(request, stream=stream)
        assert json.loads(data) == body
        assert data == reference_bytes(body)
    assert request == before


# --- the recorded conversations ---------------------------------------------------------------

OPENAI_NAMES = fixture_names("openai-compatible")


@pytest.mark.parametrize("name", OPENAI_NAMES)
def test_openai_fixture_conversations_encode_as_built(name: str) -> None:
    client = openai_client()
    request = request_for(load(name))
    check(client, request)
    request.extra_body = {**request.extra_body, "user": "ü", "max_tokens": None, "seed": 7}
    check(client, request)
    request.tools = tuple(request.tools)  # the agent's form: cached per tuple
    check(client, request)


@pytest.mark.parametrize("short", sorted(REQUESTS))
@pytest.mark.parametrize("caching", [True, False, None])
def test_anthropic_fixture_conversations_encode_as_built(short: str, caching: bool | None) -> None:
    client = anthropic_client(prompt_caching=caching is not False)
    recorded = load(f"anthropic__{short}")["request"]["body"]
    request = conversation(recorded, caching=bool(caching))
    request.prompt_caching = caching
    check(client, request)
    request.extra_body = {**request.extra_body, "metadata": {"user_id": "é"}, "tools": None}
    check(client, request)
    request.extra_body = {}
    request.tools = tuple(request.tools)
    check(client, request)
    # every prefix of the conversation, through the same client: mostly cache hits, and the
    # cache marker must sit on the last message of each
    messages = request.messages
    for end in range(len(messages) + 1):
        request.messages = messages[:end]
        check(client, request)


# --- generated conversations ------------------------------------------------------------------

TEXT = st.text(max_size=12)
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=6,
)
IMAGES = st.builds(Image, url=TEXT) | st.builds(
    Image, data=TEXT, media_type=st.sampled_from(["image/png", "image/jpeg"])
)
PARTS: st.SearchStrategy[ContentPart] = st.one_of(
    st.builds(TextPart, text=TEXT),
    st.builds(
        ToolCallPart,
        tool_call=st.builds(
            ToolCall,
            id=TEXT,
            name=TEXT,
            arguments=JSON_VALUES,
            raw_arguments=st.none() | TEXT,
        ),
    ),
    st.builds(
        ToolResultPart,
        tool_result=st.builds(ToolResult, tool_call_id=TEXT, content=TEXT, is_error=st.booleans()),
    ),
    st.builds(ImagePart, image=IMAGES),
    st.builds(ThinkingPart, thinking=st.builds(Thinking, text=TEXT, signature=st.none() | TEXT)),
    st.builds(RedactedThinkingPart, redacted_thinking=st.builds(RedactedThinking, data=TEXT)),
)
MESSAGES = st.builds(
    ChatMessage, role=st.sampled_from(list(Role)), content=st.lists(PARTS, max_size=4)
)
TOOL_DEFINITIONS = st.lists(
    st.builds(
        ToolDefinition,
        name=TEXT,
        description=TEXT,
        input_schema=st.dictionaries(TEXT, JSON_VALUES, max_size=3),
    ),
    max_size=3,
)
EXTRA_KEYS = st.sampled_from(
    [
        "messages",
        "tools",
        "system",
        "model",
        "max_tokens",
        "stream",
        "stream_options",
        "tool_choice",
        "temperature",
        "seed",
        "thinking",
        "metadata",
    ]
)
EXTRA_BODIES = st.dictionaries(EXTRA_KEYS, st.none() | JSON_VALUES, max_size=3)
OPTIONS = st.fixed_dictionaries(
    {
        "max_tokens": st.none() | st.integers(1, 10_000),
        "temperature": st.none() | st.floats(0, 2),
        "tool_choice": st.none() | st.sampled_from(["auto", "none", "required", "lookup"]),
        "stop": st.lists(TEXT, max_size=2),
        "model": st.none() | TEXT,
        "prompt_caching": st.none() | st.booleans(),
        "extra_body": EXTRA_BODIES,
    }
)
FUZZ = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(
    history=st.lists(MESSAGES, max_size=8),
    tools=TOOL_DEFINITIONS,
    tools_as_tuple=st.booleans(),
    options=st.lists(OPTIONS, min_size=1, max_size=3),
    client_caching=st.booleans(),
)
def test_generated_conversations_encode_as_built(
    history: list[ChatMessage],
    tools: list[ToolDefinition],
    tools_as_tuple: bool,
    options: list[dict[str, Any]],
    client_caching: bool,
) -> None:
    """Requests over growing prefixes of one history, with changing options, through one client
    of each kind: the cache serves old messages, never a stale or marked encoding."""
    clients: list[Client] = [openai_client(), anthropic_client(prompt_caching=client_caching)]
    definitions = tuple(tools) if tools_as_tuple else tools
    for end in range(len(history) + 1):
        for option in options:
            request = ChatRequest(messages=history[:end], tools=definitions, **option)
            for client in clients:
                check(client, request)


# --- the cache at work --------------------------------------------------------------------------


def tool_round(step: int) -> list[ChatMessage]:
    call = ToolCall(id=f"call_{step}", name="lookup", arguments={"i": step, "note": "ünï"})
    return [
        ChatMessage(role=Role.ASSISTANT, content=[ToolCallPart(tool_call=call)]),
        ChatMessage.tool_results([ToolResult(tool_call_id=call.id, content=f'{{"v":{step}}}')]),
    ]


LOOKUP = (ToolDefinition(name="lookup", description="Looks up.", input_schema={"type": "object"}),)


def counting(monkeypatch: pytest.MonkeyPatch, module: Any) -> list[ChatMessage]:
    """Record every message the module encodes (cache misses and fresh encodings)."""
    encoded: list[ChatMessage] = []
    real: Callable[..., bytes] = module._encoded_message

    def spy(message: ChatMessage, **kwargs: Any) -> bytes:
        encoded.append(message)
        return real(message, **kwargs)

    monkeypatch.setattr(module, "_encoded_message", spy)
    return encoded


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
def test_each_message_is_encoded_once_per_client(
    monkeypatch: pytest.MonkeyPatch, wire: str
) -> None:
    module = openai_module if wire == "openai" else anthropic_module
    encoded = counting(monkeypatch, module)
    make = openai_client if wire == "openai" else anthropic_client
    client, other = make(), make()
    history = [ChatMessage.system("Be brief."), ChatMessage.user("go")]
    for step in range(5):
        history += tool_round(step)
        encoded.clear()
        request = ChatRequest(messages=list(history), tools=LOOKUP)
        check(client, request)  # three encode_body calls, of which only the first misses
        new = history if step == 0 else history[-2:]
        if wire == "anthropic":  # each call encodes the last message afresh with its marker
            new = [*new, history[-1], history[-1], history[-1]]
        assert [id(m) for m in encoded] == [id(m) for m in new]
    # caches are per client: another client encodes everything itself
    encoded.clear()
    other.encode_body(ChatRequest(messages=history), stream=False)
    assert len(encoded) >= len(history)


def test_anthropic_cache_marker_moves_to_the_new_last_message() -> None:
    client = anthropic_client()
    history = [ChatMessage.user("go")]
    request = ChatRequest(messages=history, tools=LOOKUP)
    first = json.loads(client.encode_body(request, stream=False))
    assert first["messages"][0]["content"][0]["cache_control"] == {"type": "ephemeral"}
    assert first["tools"][0]["cache_control"] == {"type": "ephemeral"}
    history += tool_round(0)
    second = json.loads(client.encode_body(ChatRequest(messages=history), stream=False))
    marks = [
        index
        for index, message in enumerate(second["messages"])
        if any("cache_control" in block for block in message["content"])
    ]
    assert marks == [2]  # the user message's cached encoding carries no marker
    plain = ChatRequest(messages=history, tools=LOOKUP, prompt_caching=False)
    body = json.loads(client.encode_body(plain, stream=False))
    assert "cache_control" not in json.dumps(body)  # tuple cached marked and unmarked apart
    again = json.loads(client.encode_body(request, stream=False))
    assert again["tools"][0]["cache_control"] == {"type": "ephemeral"}


@pytest.mark.parametrize("make", [openai_client, anthropic_client])
def test_a_replaced_message_or_edited_tool_list_is_sent_as_it_now_is(
    make: Callable[[], Client],
) -> None:
    client = make()
    history = [ChatMessage.user("first"), *tool_round(0)]
    tools = list(LOOKUP)
    request = ChatRequest(messages=history, tools=tools)
    check(client, request)
    history[0] = ChatMessage.user("second")  # an equal-looking slot, another object
    tools.append(ToolDefinition(name="more", description="", input_schema={}))  # a list: edited
    data = client.encode_body(request, stream=False)
    assert b"second" in data
    assert b"first" not in data
    assert b'"more"' in data
    check(client, request)


@pytest.mark.parametrize("make", [openai_client, anthropic_client])
def test_a_message_that_cannot_be_encoded_is_a_config_error_every_time(
    make: Callable[[], Client],
) -> None:
    client = make()
    bad = ChatMessage(role=Role.USER, content=[ImagePart(image=Image())])
    for _ in range(2):
        with pytest.raises(AgentError) as caught:
            client.encode_body(ChatRequest(messages=[ChatMessage.user("hi"), bad]), stream=False)
        assert caught.value.kind is ErrorKind.CONFIG


# --- what chat() and stream() send ----------------------------------------------------------------


async def test_openai_chat_and_stream_send_the_encoded_body() -> None:
    sent: list[bytes] = []
    message = {"role": "assistant", "content": "ok"}
    reply = {"choices": [{"message": message, "finish_reason": "stop"}]}
    chunks = (
        b'data: {"choices":[{"index":0,"delta":{"content":"ok"},"finish_reason":"stop"}]}\n\n'
        b"data: [DONE]\n\n"
    )

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request.content)
        if json.loads(request.content).get("stream"):
            return httpx.Response(200, content=chunks)
        return httpx.Response(200, json=reply)

    client = OpenAICompatibleClient(api_key=KEY, transport=httpx.MockTransport(handler))
    request = ChatRequest(messages=[ChatMessage.user("héllo"), *tool_round(1)], tools=LOOKUP)
    try:
        assert (await client.chat(request)).text == "ok"
        events = [event async for event in client.stream(request)]
    finally:
        await client.aclose()
    assert isinstance(events[-1], StreamDone)
    assert sent == [
        client.encode_body(request, stream=False),
        client.encode_body(request, stream=True),
    ]


async def test_anthropic_chat_and_stream_send_the_encoded_body() -> None:
    sent: list[bytes] = []
    reply = {"content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn"}
    events_body = (
        b'event: message_start\ndata: {"type":"message_start","message":{"usage":{}}}\n\n'
        b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
    )

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request.content)
        if json.loads(request.content).get("stream"):
            return httpx.Response(200, content=events_body)
        return httpx.Response(200, json=reply)

    client = AnthropicClient(api_key=KEY, transport=httpx.MockTransport(handler))
    request = ChatRequest(messages=[ChatMessage.system("s"), ChatMessage.user("héllo")])
    try:
        assert (await client.chat(request)).text == "ok"
        events = [event async for event in client.stream(request)]
    finally:
        await client.aclose()
    assert isinstance(events[-1], StreamDone)
    assert sent == [
        client.encode_body(request, stream=False),
        client.encode_body(request, stream=True),
    ]


# --- the pieces -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"a": 1},
        {"m": [1, "é"]},
        {"a": 1, "m": [1, {"x": None}], "b": "é", "t": [], "c": {"d": 2.5}},
        {"m": [1], "t": {"k": "v"}},
    ],
)
def test_encode_json_splices_raw_values_in_place(body: dict[str, Any]) -> None:
    expected = reference_bytes(body)
    assert encode_json(body) == expected
    spliced = {k: RawJson(dumps(v)) if k in ("m", "t") else v for k, v in body.items()}
    assert encode_json(spliced) == expected
    everything_raw = {k: RawJson(dumps(v)) for k, v in body.items()}
    assert encode_json(everything_raw) == expected


class Key:
    """A stand-in for a frozen message: compared by identity only."""


def test_encoded_cache_is_keyed_by_identity_and_checks_it() -> None:
    cache = EncodedCache(max_entries=10, max_bytes=100)
    a, b = Key(), Key()
    cache.put(a, b"aa")
    assert cache.get(a) == b"aa"
    assert cache.get(b) is None
    # an entry whose object is not the one asked about (an id reused) is never served
    cache._entries[id(b)] = (a, b"stale")
    assert cache.get(b) is None
    cache.put(b, b"fresh")
    assert cache.get(b) == b"fresh"


def test_encoded_cache_evicts_the_least_recently_used_within_both_bounds() -> None:
    cache = EncodedCache(max_entries=3, max_bytes=10)
    keys = [Key() for _ in range(5)]
    for key in keys[:3]:
        cache.put(key, b"xx")
    assert cache.get(keys[0]) == b"xx"  # now the most recently used
    cache.put(keys[3], b"xx")
    assert cache.get(keys[1]) is None  # the least recently used went
    assert [cache.get(k) for k in (keys[0], keys[2], keys[3])] == [b"xx"] * 3
    assert (len(cache), cache.size) == (3, 6)
    cache.put(keys[4], b"123456")  # over the byte budget: the oldest go until it fits
    assert cache.size <= 10
    assert len(cache) <= 3
    assert cache.get(keys[4]) == b"123456"
    assert cache.get(keys[0]) is None
    cache.put(keys[4], b"1")  # a new encoding replaces the old, and the size follows
    assert cache.get(keys[4]) == b"1"
    assert cache.size == sum(len(data) for _, data in cache._entries.values())
    huge = Key()
    cache.put(huge, b"x" * 11)  # larger than the whole budget: not kept, nothing evicted
    assert cache.get(huge) is None
    assert cache.get(keys[4]) == b"1"


class Counting:
    """An encoder that records what it encodes; ``empty`` keys encode to nothing."""

    def __init__(self, empty: tuple[Key, ...] = ()) -> None:
        self.made: list[Key] = []
        self.empty = empty

    def __call__(self, key: Key) -> bytes:
        self.made.append(key)
        return b"" if key in self.empty else b'"%d"' % (id(key) % 1000)


def joined(encode: Counting, keys: list[Key]) -> bytes:
    return b",".join(data for data in map(encode, keys) if data)


def test_encoded_prefixes_encode_only_the_messages_after_the_known_prefix() -> None:
    encode = Counting()
    store: EncodedPrefixes[Key] = EncodedPrefixes(encode)
    history = [Key(), Key()]
    assert store.encoded(history).data == joined(Counting(), history)
    assert encode.made == history
    for _ in range(50):
        new = [Key(), Key()]
        history += new
        encode.made.clear()
        prefix = store.encoded(list(history))  # a new list each time, as the agent sends
        assert encode.made == new  # the earlier messages are not encoded again
        assert prefix.data == joined(Counting(), history)
        assert store.encoded(list(history)) is prefix  # the same request again: nothing new
    assert encode.made == new
    assert len(store) == 1  # one entry per conversation, however long it grew


def test_a_list_with_another_object_in_its_head_is_encoded_afresh() -> None:
    encode = Counting()
    store: EncodedPrefixes[Key] = EncodedPrefixes(encode)
    history = [Key(), Key(), Key()]
    store.encoded(history)
    swapped = [Key(), *history[1:]]  # the same last message, another head (truncation, a hook)
    encode.made.clear()
    assert store.encoded(swapped).data == joined(Counting(), swapped)
    assert encode.made == swapped


def test_equal_messages_that_encode_differently_are_never_confused() -> None:
    # 1 == True and {"a": 1, "b": 2} == {"b": 2, "a": 1}: equal values, other JSON
    store: EncodedPrefixes[ChatMessage] = EncodedPrefixes(
        lambda m: dumps(m.model_dump(mode="json"))
    )

    def call(arguments: dict[str, Any]) -> ChatMessage:
        part = ToolCallPart(tool_call=ToolCall(id="c", name="f", arguments=arguments))
        return ChatMessage(role=Role.ASSISTANT, content=[part])

    tail = ChatMessage.user("go on")
    first = [call({"n": 1, "m": 2}), tail]
    second = [call({"m": 2, "n": True}), tail]
    assert first[0] == second[0]
    store.encoded(first)
    assert b'"n":true' in store.encoded(second).data


def test_a_fork_from_an_earlier_point_is_encoded_as_it_is() -> None:
    encode = Counting()
    store: EncodedPrefixes[Key] = EncodedPrefixes(encode)
    trunk = [Key(), Key()]
    store.encoded([*trunk, Key()])
    other = [*trunk, Key(), Key()]
    assert store.encoded(other).data == joined(Counting(), other)


def test_empty_encodings_are_skipped_and_kept_apart() -> None:
    a, system, b, c = Key(), Key(), Key(), Key()
    encode = Counting(empty=(system, c))
    store: EncodedPrefixes[Key] = EncodedPrefixes(encode)
    prefix = store.encoded([a, system, b])
    assert prefix.skipped == [system]
    assert prefix.data == joined(Counting(), [a, b])
    assert prefix.last_index == 2
    assert prefix.data[prefix.last :] == Counting()(b)
    prefix = store.encoded([a, system, b, c])  # nothing new to send
    assert prefix.skipped == [system, c]
    assert prefix.last_index == 2
    assert prefix.data == joined(Counting(), [a, b])
    only_empty = store.encoded([c])
    assert (only_empty.data, only_empty.last_index) == (b"", -1)


def test_a_message_that_fails_to_encode_leaves_the_prefix_as_it_was() -> None:
    bad = Key()

    def encode(key: Key) -> bytes:
        if key is bad:
            raise AgentError.config("cannot")
        return b"{}"

    store: EncodedPrefixes[Key] = EncodedPrefixes(encode)
    history = [Key(), Key()]
    store.encoded(history)
    with pytest.raises(AgentError):
        store.encoded([*history, Key(), bad])
    assert store.encoded([*history, Key()]).data == b"{},{},{}"


def test_encoded_prefixes_stay_within_their_bounds() -> None:
    budget = 10 * MESSAGE_COST  # about ten message objects kept alive
    store: EncodedPrefixes[Key] = EncodedPrefixes(
        lambda key: b"{}", max_entries=3, max_bytes=budget
    )
    for one in [[Key()] for _ in range(5)]:
        store.encoded(one)
    assert len(store) == 3  # the least recently used went
    long = [Key() for _ in range(8)]  # with the others, more than the budget holds
    store.encoded(long)
    assert store.size <= budget
    assert store.size == sum(entry.size for entry in store._entries.values())
    assert store.encoded(long).data == b",".join([b"{}"] * 8)
    kept = (len(store), store.size)
    huge = [Key() for _ in range(11)]  # more than the whole budget: encoded, not kept
    assert store.encoded(huge).data == b",".join([b"{}"] * 11)
    assert (len(store), store.size) == kept
    store.clear()
    assert (len(store), store.size) == (0, 0)


@pytest.mark.parametrize("make", [openai_client, anthropic_client])
async def test_aclose_lets_go_of_the_messages(make: Callable[[], Client]) -> None:
    client = make()
    request = ChatRequest(messages=[ChatMessage.user("hi"), *tool_round(0)], tools=LOOKUP)
    client.encode_body(request, stream=False)
    assert len(client._messages) == 1  # the conversation's encoded prefix
    await client.aclose()
    assert len(client._messages) == 0

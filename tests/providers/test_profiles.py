"""Endpoint profiles (``providers/profiles.py``): what each OpenAI-compatible host accepts.

For every known host a request carrying everything the neutral request can carry is built
with the host's profile and checked against the parameters the host documents (the table
below, with the page each list was read from). The recorded requests of the hosts that have
recordings are compared with what we send in ``test_openai_wire.py``
(``test_build_body_matches_the_recorded_request``, each with its host's profile).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent_plugin.config import AgentSettings
from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.messages import (
    ChatMessage,
    Image,
    ImagePart,
    Role,
    TextPart,
    Thinking,
    ThinkingPart,
    ToolCall,
    ToolCallPart,
    ToolDefinition,
    ToolResult,
)
from agent_plugin.providers.base import ChatRequest
from agent_plugin.providers.factory import create_client
from agent_plugin.providers.openai import OpenAICompatibleClient
from agent_plugin.providers.profiles import GENERIC, PROFILES, EndpointProfile, profile_for, replace
from tests.wire import fixture_names, load

BASE_URLS = {
    "openai": "https://api.openai.com/v1",
    "azure": "https://my-resource.openai.azure.com/openai/v1",
    "mistral": "https://api.mistral.ai/v1",
    "cerebras": "https://api.cerebras.ai/v1",
    "openrouter": "https://openrouter.ai/api/v1",
    "groq": "https://api.groq.com/openai/v1",
    "deepseek": "https://api.deepseek.com",
    "together": "https://api.together.xyz/v1",
    "ollama": "http://localhost:11434/v1",
    "xai": "https://api.x.ai/v1",
    "gemini": "https://generativelanguage.googleapis.com/v1beta/openai",
}


@dataclass(frozen=True)
class Documented:
    """Among what this client can send, what a host's API reference lists."""

    url: str
    params: frozenset[str]
    roles: frozenset[str]
    assistant: frozenset[str]  # fields of an assistant message
    parts: frozenset[str] = frozenset({"text", "image_url"})  # user content part types
    function: frozenset[str] = frozenset({"name", "description", "parameters", "strict"})


COMMON = {"model", "messages", "tools", "tool_choice", "temperature", "stop", "stream"}
ROLES = frozenset({"system", "user", "assistant", "tool"})

DOCUMENTED: dict[str, Documented] = {
    "openai": Documented(
        "https://platform.openai.com/docs/api-reference/chat/create",
        frozenset(COMMON | {"parallel_tool_calls", "max_completion_tokens", "stream_options"}),
        ROLES | {"developer"},
        frozenset({"role", "content", "tool_calls", "refusal", "name"}),
    ),
    "azure": Documented(
        "https://learn.microsoft.com/en-us/azure/ai-foundry/openai/reference-preview-latest",
        frozenset(COMMON | {"parallel_tool_calls", "max_completion_tokens", "stream_options"}),
        ROLES | {"developer"},
        frozenset({"role", "content", "tool_calls", "refusal", "name"}),
    ),
    # no stream_options (422, see the recorded body); thinking parts in assistant content
    "mistral": Documented(
        "https://docs.mistral.ai/api/#tag/chat/operation/chat_completion_v1_chat_completions_post",
        frozenset(COMMON | {"parallel_tool_calls", "max_tokens"}),
        ROLES,
        frozenset({"role", "content", "tool_calls", "prefix"}),
        parts=frozenset({"text", "image_url", "thinking"}),
    ),
    "cerebras": Documented(
        "https://inference-docs.cerebras.ai/api-reference/chat-completions",
        frozenset(COMMON | {"parallel_tool_calls", "max_completion_tokens", "stream_options"}),
        ROLES | {"developer"},
        frozenset({"role", "content", "tool_calls", "reasoning"}),
        parts=frozenset({"text"}),
    ),
    "openrouter": Documented(
        "https://openrouter.ai/docs/api-reference/chat-completion",
        frozenset(COMMON | {"parallel_tool_calls", "max_tokens", "stream_options"}),
        ROLES | {"developer"},
        frozenset({"role", "content", "tool_calls", "reasoning", "name"}),
    ),
    "groq": Documented(
        "https://console.groq.com/docs/api-reference#chat-create",
        frozenset(COMMON | {"parallel_tool_calls", "max_completion_tokens", "stream_options"}),
        ROLES,
        frozenset({"role", "content", "tool_calls", "name"}),
        function=frozenset({"name", "description", "parameters"}),
    ),
    "deepseek": Documented(
        "https://api-docs.deepseek.com/api/create-chat-completion",
        frozenset(COMMON | {"max_tokens", "stream_options"}),
        ROLES,
        frozenset({"role", "content", "tool_calls", "reasoning_content", "name", "prefix"}),
        parts=frozenset({"text"}),
        function=frozenset({"name", "description", "parameters"}),
    ),
    "together": Documented(
        "https://docs.together.ai/reference/chat-completions-1",
        frozenset(COMMON | {"max_tokens"}),
        ROLES,
        frozenset({"role", "content", "tool_calls", "name"}),
        function=frozenset({"name", "description", "parameters"}),
    ),
    # tool_choice and parallel_tool_calls are not among Ollama's supported fields
    "ollama": Documented(
        "https://github.com/ollama/ollama/blob/main/docs/openai.md",
        frozenset({"model", "messages", "tools", "temperature", "stop", "stream"})
        | {"max_tokens", "stream_options"},
        ROLES,
        frozenset({"role", "content", "tool_calls", "reasoning"}),
        function=frozenset({"name", "description", "parameters"}),
    ),
    "xai": Documented(
        "https://docs.x.ai/docs/api-reference#chat-completions",
        frozenset(COMMON | {"parallel_tool_calls", "max_completion_tokens", "stream_options"}),
        ROLES,
        frozenset({"role", "content", "tool_calls", "name"}),
    ),
    "gemini": Documented(
        "https://ai.google.dev/api/compatibility",
        frozenset(COMMON | {"max_completion_tokens", "stream_options"}),
        ROLES,
        frozenset({"role", "content", "tool_calls"}),
        function=frozenset({"name", "description", "parameters"}),
    ),
}

WEATHER = ToolDefinition(
    name="get_weather",
    description="Weather for a city.",
    input_schema={"type": "object", "properties": {"city": {"type": "string"}}},
)


def everything(profile: EndpointProfile) -> ChatRequest:
    """A request with every field the neutral request has, as far as ``profile`` takes it."""
    user: list[Any] = [TextPart(text="Weather in Oslo?")]
    if profile.images:
        user.append(ImagePart(image=Image(url="https://img.test/oslo.png")))
    call = ToolCall(id="call_1", name="get_weather", arguments={"city": "Oslo"})
    return ChatRequest(
        messages=[
            ChatMessage.system("Be brief."),
            ChatMessage(role=Role.USER, content=user),
            ChatMessage(
                role=Role.ASSISTANT,
                content=[
                    ThinkingPart(thinking=Thinking(text="Look it up.")),
                    TextPart(text="Checking."),
                    ToolCallPart(tool_call=call),
                ],
            ),
            ChatMessage.tool_results([ToolResult(tool_call_id="call_1", content='{"temp": 3}')]),
        ],
        tools=[WEATHER],
        tool_choice="required" if profile.tool_choice else None,
        parallel_tool_calls=False if profile.parallel_tool_calls else None,
        strict_tools=True,
        max_tokens=256,
        temperature=0.2,
        stop=["END"],
    )


def offline(_: httpx.Request) -> httpx.Response:
    raise AssertionError("nothing is sent")


def client_for(name: str, **kwargs: Any) -> OpenAICompatibleClient:
    return OpenAICompatibleClient(
        base_url=BASE_URLS[name],
        api_key="sk-test",
        transport=httpx.MockTransport(offline),
        **kwargs,
    )


def test_every_known_profile_is_checked_against_its_documentation() -> None:
    assert set(DOCUMENTED) == set(PROFILES) == set(BASE_URLS)


@pytest.mark.parametrize("name", sorted(PROFILES))
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_request_for_each_host_is_one_it_documents(name: str, stream: bool) -> None:
    client = client_for(name)
    assert client.profile is PROFILES[name]  # chosen from the base URL
    docs = DOCUMENTED[name]
    body = client.build_body(everything(client.profile), stream=stream)
    assert set(body) <= docs.params, docs.url
    assert {m["role"] for m in body["messages"]} <= docs.roles, docs.url
    assistant = next(m for m in body["messages"] if m["role"] == "assistant")
    assert set(assistant) <= docs.assistant, docs.url
    user = next(m for m in body["messages"] if m["role"] == "user")
    parts = user["content"] if isinstance(user["content"], list) else [{"type": "text"}]
    content = assistant["content"]
    parts += content if isinstance(content, list) else []
    assert {p["type"] for p in parts} <= docs.parts, docs.url
    assert set(body["tools"][0]["function"]) <= docs.function, docs.url
    # and nothing the request asked for was lost on the way, where the host takes it
    profile = client.profile
    assert body[profile.max_tokens_field] == 256
    assert (body.get("tool_choice") == "required") is profile.tool_choice
    assert ("parallel_tool_calls" in body) is profile.parallel_tool_calls
    assert body["tools"][0]["function"].get("strict", False) is profile.strict_tools
    assert ("stream_options" in body) is (stream and profile.stream_usage)
    assert body["messages"][0]["role"] == profile.system_role
    if profile.send_reasoning and profile.reasoning_field != "thinking":
        assert assistant[profile.reasoning_field] == "Look it up."


def test_hosts_with_recorded_requests_are_replayed_with_their_profile() -> None:
    """Which known hosts' recorded requests ``test_openai_wire`` compares with ours."""
    recorded = {
        profile_for(load(n)["request"]["url"]).name
        for n in fixture_names("openai-compatible")
        if load(n)["request"]["url"] and isinstance(load(n)["request"]["body"], dict)
    }
    # Cerebras is recorded only for its model list; xAI and Azure not at all (see the README)
    assert recorded == set(PROFILES) - {"cerebras", "xai", "azure"} | {GENERIC.name}


@pytest.mark.parametrize(
    ("url", "name"),
    [
        ("https://api.openai.com/v1", "openai"),
        ("https://API.OpenAI.com/v1/", "openai"),
        ("https://x.openai.azure.com/openai/deployments/d", "azure"),
        ("https://x.cognitiveservices.azure.com/openai/v1", "azure"),
        ("https://api.mistral.ai/v1", "mistral"),
        ("https://api.cerebras.ai/v1", "cerebras"),
        ("https://openrouter.ai/api/v1", "openrouter"),
        ("https://api.groq.com/openai/v1", "groq"),
        ("https://api.deepseek.com", "deepseek"),
        ("https://api.together.xyz/v1", "together"),
        ("https://api.together.ai/v1", "together"),
        ("https://ollama.com/v1", "ollama"),
        ("http://127.0.0.1:11434/v1", "ollama"),
        ("https://api.x.ai/v1", "xai"),
        ("https://generativelanguage.googleapis.com/v1beta/openai", "gemini"),
        ("http://localhost:8000/v1", "openai-compatible"),  # vLLM
        ("https://openai.com.evil.test/v1", "openai-compatible"),
        ("https://proxy.test/api.openai.com/v1", "openai-compatible"),
        ("not a url at all\x00", "openai-compatible"),
    ],
)
def test_profile_for_a_base_url(url: str, name: str) -> None:
    assert profile_for(url).name == name


def test_a_profile_given_to_the_client_wins_over_the_host() -> None:
    client = client_for("mistral", profile=GENERIC)
    body = client.build_body(ChatRequest(messages=[ChatMessage.user("x")]), stream=True)
    assert body["stream_options"] == {"include_usage": True}
    assert "profile='openai-compatible'" in repr(client)


def test_replace_changes_fields_of_a_known_profile() -> None:
    mine = replace("mistral", images=False)
    assert (mine.name, mine.images, mine.stream_usage) == ("mistral", False, False)
    assert replace(GENERIC, max_tokens_field="max_completion_tokens").max_tokens_field == (
        "max_completion_tokens"
    )
    assert replace("openai-compatible") == GENERIC
    assert dataclasses.replace(mine) == mine  # a plain frozen value


@pytest.mark.parametrize(
    ("args", "changes", "says"),
    [
        (("nowhere",), {}, "unknown endpoint profile 'nowhere'"),
        (("openai",), {"colour": "red"}, "unknown endpoint profile field(s): colour"),
        (("openai",), {"system_role": "admin"}, "system_role must be one of system, developer"),
        (("openai",), {"reasoning_field": "thoughts"}, "reasoning_field must be one of"),
        (("openai",), {"images": "yes"}, "images must be true or false"),
    ],
)
def test_replace_refuses_what_is_not_a_profile(
    args: tuple[str], changes: dict[str, Any], says: str
) -> None:
    with pytest.raises(AgentError) as caught:
        replace(*args, **changes)
    assert caught.value.kind is ErrorKind.CONFIG
    assert says in caught.value.message


@pytest.mark.parametrize(
    ("name", "request_changes", "says"),
    [
        ("ollama", {"tool_choice": "required"}, "tool_choice 'required'"),
        ("ollama", {"tool_choice": "get_weather"}, "tool_choice 'get_weather'"),
        ("deepseek", {"parallel_tool_calls": False}, "parallel_tool_calls: false"),
        ("cerebras", {"image": True}, "an image"),
    ],
)
def test_what_an_endpoint_cannot_express_is_a_config_error(
    name: str, request_changes: dict[str, Any], says: str
) -> None:
    user: list[Any] = [TextPart(text="x")]
    if request_changes.pop("image", False):
        user.append(ImagePart(image=Image(url="https://img.test/a.png")))
    request = ChatRequest(
        messages=[ChatMessage(role=Role.USER, content=user)], tools=[WEATHER], **request_changes
    )
    client = client_for(name)
    for build in (client.build_body, client.encode_body):
        with pytest.raises(AgentError) as caught:
            build(request, stream=False)
        assert caught.value.kind is ErrorKind.CONFIG
        assert says in caught.value.message
        assert name in caught.value.message


def test_what_an_endpoint_takes_by_default_goes_quietly() -> None:
    """``auto`` and parallel calls are every server's defaults: left out where not taken,
    and so are strict schemas (the arguments are checked here anyway)."""
    request = ChatRequest(
        messages=[ChatMessage.user("x")],
        tools=[WEATHER],
        tool_choice="auto",
        parallel_tool_calls=True,
        strict_tools=True,
    )
    body = client_for("ollama").build_body(request, stream=False)
    assert {"tool_choice", "parallel_tool_calls"} & set(body) == set()
    assert "strict" not in body["tools"][0]["function"]
    generic = OpenAICompatibleClient(
        base_url="http://llm.test/v1", transport=httpx.MockTransport(offline)
    ).build_body(request, stream=False)
    assert (generic["tool_choice"], generic["parallel_tool_calls"]) == ("auto", True)
    assert generic["tools"][0]["function"]["strict"] is True


@pytest.mark.parametrize(
    ("name", "wire"),
    [
        ("deepseek", {"reasoning_content": "hmm"}),
        ("ollama", {"reasoning": "hmm"}),
        ("openai", {}),
        (
            "mistral",
            {
                "content": [
                    {"type": "thinking", "thinking": [{"type": "text", "text": "hmm"}]},
                    {"type": "text", "text": "Hi."},
                ]
            },
        ),
    ],
)
def test_reasoning_goes_back_where_the_host_takes_it(name: str, wire: dict[str, Any]) -> None:
    said = ChatMessage(
        role=Role.ASSISTANT,
        content=[ThinkingPart(thinking=Thinking(text="hmm")), TextPart(text="Hi.")],
    )
    client = client_for(name)
    [assistant] = client.build_body(ChatRequest(messages=[said]), stream=False)["messages"]
    assert assistant == {"role": "assistant", "content": "Hi.", **wire}
    # the cached encoding says the same
    again = client.build_body(ChatRequest(messages=[said]), stream=False)
    assert again["messages"] == [assistant]
    assert client.encode_body(ChatRequest(messages=[said]), stream=False).count(b"hmm") == (
        1 if wire else 0
    )


# --- [agent.endpoint] -----------------------------------------------------------------------


def test_the_endpoint_table_changes_the_hosts_profile(tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_text(
        '[agent]\nbase_url = "https://api.mistral.ai/v1"\n\n'
        "[agent.endpoint]\nimages = false\nparallel_tool_calls = false\n",
        encoding="utf-8",
    )
    settings = AgentSettings.load(environ={}, config_file=config)
    client = create_client(settings, api_key="k-test-12345678")
    assert isinstance(client, OpenAICompatibleClient)
    assert client.profile.name == "mistral"
    assert client.profile.stream_usage is False  # Mistral's own
    assert (client.profile.images, client.profile.parallel_tool_calls) == (False, False)
    # name picks another profile to start from, for a gateway in front of a known host
    named = AgentSettings.load(
        {"base_url": "https://gateway.example/v1", "endpoint": {"name": "groq"}}, environ={}
    )
    assert create_client(named, api_key=None).profile.name == "groq"  # type: ignore[attr-defined]
    plain = AgentSettings.load({"base_url": "https://gateway.example/v1"}, environ={})
    assert create_client(plain, api_key=None).profile is GENERIC  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("table", "says"),
    [
        ({"imgs": False}, "unknown endpoint profile field(s): imgs"),
        ({"name": "nope"}, "unknown endpoint profile 'nope'"),
        ({"name": 3}, "name must be a profile name"),
        ({"system_role": "boss"}, "system_role must be one of"),
    ],
)
def test_a_bad_endpoint_table_is_a_config_error_naming_it(
    table: dict[str, object], says: str
) -> None:
    settings = AgentSettings.load(
        {"base_url": "https://gateway.example/v1", "endpoint": table}, environ={}
    )
    with pytest.raises(AgentError) as caught:
        create_client(settings, api_key=None)
    assert caught.value.kind is ErrorKind.CONFIG
    assert "[agent.endpoint]" in str(caught.value)
    assert says in str(caught.value)

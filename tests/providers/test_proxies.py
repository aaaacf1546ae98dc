"""environment_proxy against httpx's own choice (AsyncClient with trust_env, no transport).

httpx keeps its proxy rules private, so the oracle reads the client's private routing: a change
in httpx fails here, loudly, rather than in a user's proxy setup.
"""

from __future__ import annotations

import httpx
import pytest

from agent_plugin.providers.proxies import environment_proxy

PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")

CASES = [
    ({}, "https://api.openai.com/v1"),
    ({"HTTPS_PROXY": "http://p:3128"}, "https://api.openai.com/v1"),
    ({"HTTPS_PROXY": "http://p:3128"}, "http://ollama:11434/v1"),
    ({"HTTP_PROXY": "http://p:3128"}, "http://ollama:11434/v1"),
    ({"ALL_PROXY": "http://a:8080", "HTTPS_PROXY": "http://p:3128"}, "http://ollama/v1"),
    ({"ALL_PROXY": "http://a:8080", "HTTPS_PROXY": "http://p:3128"}, "https://x.example/v1"),
    ({"HTTPS_PROXY": "p:3128"}, "https://api.openai.com/v1"),
    ({"http_proxy": "http://p:3128", "HTTP_PROXY": "http://q:3128"}, "http://x/v1"),
    ({"http_proxy": "", "HTTP_PROXY": "http://q:3128"}, "http://x/v1"),
    ({"HTTPS_PROXY": "http://p:3128", "NO_PROXY": "*"}, "https://api.openai.com/v1"),
    ({"HTTPS_PROXY": "http://p:3128", "NO_PROXY": "localhost,*"}, "https://api.openai.com/v1"),
    ({"HTTPS_PROXY": "http://p:3128", "NO_PROXY": " *"}, "https://api.openai.com/v1"),
    ({"HTTPS_PROXY": "http://p:3128", "NO_PROXY": "openai.com"}, "https://api.openai.com/v1"),
    ({"HTTPS_PROXY": "http://p:3128", "NO_PROXY": "openai.com"}, "https://openai.com/v1"),
    ({"HTTPS_PROXY": "http://p:3128", "NO_PROXY": ".openai.com"}, "https://openai.com/v1"),
    ({"HTTPS_PROXY": "http://p:3128", "NO_PROXY": ".openai.com"}, "https://api.openai.com/v1"),
    ({"HTTPS_PROXY": "http://p:3128", "NO_PROXY": "openai.com"}, "https://notopenai.com/v1"),
    ({"HTTP_PROXY": "http://p:3128", "NO_PROXY": "localhost:11434"}, "http://localhost:11434/v1"),
    ({"HTTP_PROXY": "http://p:3128", "NO_PROXY": "localhost:11434"}, "http://localhost:8000/v1"),
    ({"HTTP_PROXY": "http://p:3128", "NO_PROXY": "http://ollama"}, "http://ollama:11434/v1"),
    ({"HTTP_PROXY": "http://p:3128", "NO_PROXY": "https://ollama"}, "http://ollama:11434/v1"),
    ({"HTTP_PROXY": "http://p:3128", "NO_PROXY": "::1"}, "http://[::1]:11434/v1"),
    ({"HTTP_PROXY": "http://p:3128", "NO_PROXY": "127.0.0.1"}, "http://127.0.0.1:11434/v1"),
    ({"HTTP_PROXY": "http://p:3128", "NO_PROXY": "10.0.0.0/8"}, "http://10.1.2.3/v1"),
    ({"HTTP_PROXY": "http://p:3128", "NO_PROXY": "LOCALHOST"}, "http://localhost/v1"),
    ({"HTTP_PROXY": "http://p:3128", "NO_PROXY": "ollama, vllm"}, "http://vllm:8000/v1"),
]


def _httpx_choice(url: str) -> str | None:
    client = httpx.AsyncClient()
    transport = client._transport_for_url(httpx.URL(url))
    if transport is client._transport:
        return None
    proxy = transport._pool._proxy_url  # type: ignore[attr-defined]
    return f"{proxy.scheme.decode()}://{proxy.host.decode()}:{proxy.port}"


def _ours(url: str) -> str | None:
    proxy = environment_proxy(url)
    if proxy is None:
        return None
    parsed = httpx.URL(proxy)
    return f"{parsed.scheme}://{parsed.host}:{parsed.port}"


@pytest.mark.parametrize(("environ", "url"), CASES)
def test_the_proxy_is_the_one_httpx_would_choose(
    environ: dict[str, str], url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    monkeypatch.delenv("REQUEST_METHOD", raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert _ours(url) == _httpx_choice(url)


def test_a_no_proxy_entry_httpx_cannot_parse_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    # httpx.AsyncClient fails to build on "[::1]"; choosing a proxy should not
    monkeypatch.setenv("HTTP_PROXY", "http://p:3128")
    monkeypatch.setenv("NO_PROXY", "[::1],ollama")
    assert environment_proxy("http://ollama:11434/v1") is None
    assert environment_proxy("http://vllm:8000/v1") == "http://p:3128"

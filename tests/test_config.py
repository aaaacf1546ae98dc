"""The ``[agent]`` config: reference §1.1 and the Config cases of §1.23 [AP-01..AP-07], ported.

Plus profiles, the URL-secret rules, set-wins code overrides and the client factory. Every test
reads its own files under ``tmp_path`` and an explicit ``environ`` dict, never the real environment
(except the one test that checks the ``os.environ`` default, through ``monkeypatch``).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from agent_plugin.config import AgentSettings, config_sources, parse_provider
from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.messages import ChatMessage
from agent_plugin.providers.anthropic import AnthropicClient
from agent_plugin.providers.base import ChatRequest
from agent_plugin.providers.factory import create_client
from agent_plugin.providers.factory import parse_provider as factory_parse_provider
from agent_plugin.providers.openai import OpenAICompatibleClient
from agent_plugin.providers.scripted import ScriptedModel
from agent_plugin.redaction import mask_url

EXAMPLE = Path(__file__).resolve().parent.parent / "agent.toml.example"


def write(directory: Path, text: str, name: str = "agent.toml") -> Path:
    path = directory / name
    path.write_text(text, encoding="utf-8")
    return path


def load(
    path: Path | None = None,
    overrides: dict[str, Any] | None = None,
    /,
    **env: str,
) -> AgentSettings:
    environ = dict(env)
    if path is not None:
        environ["AGENT_CONFIG_FILE"] = str(path)
    return AgentSettings.load(overrides, environ=environ)


def config_error(
    path: Path | None = None, overrides: dict[str, Any] | None = None, /, **env: str
) -> str:
    with pytest.raises(AgentError) as caught:
        load(path, overrides, **env)
    assert caught.value.kind is ErrorKind.CONFIG
    return caught.value.message


# --- file: AP-01 .. AP-04 -------------------------------------------------------------------


def test_missing_section_yields_defaults(tmp_path: Path) -> None:
    settings = load(write(tmp_path, '[server]\nport = 8080\n\n[other]\nx = "y"\n'))
    assert settings.provider == "openai-compatible"
    assert settings.model is None
    assert settings.resolved_model() == "gpt-4o-mini"
    assert settings.resolved_base_url() == "https://api.openai.com/v1"
    assert settings.max_steps == 10
    assert settings.max_tokens == 32000
    assert settings.request_timeout_secs == 60
    assert settings.prompt_caching is True
    assert settings.max_run_secs is None
    assert settings.system_prompt is None
    assert settings.redis_url == "redis://127.0.0.1:6379/0"
    assert settings.database_url == "sqlite+aiosqlite:///./agent.db"
    assert settings.route_prefix == "/agent"
    assert settings.health_path == "/health"
    assert settings == AgentSettings.load(environ={}, config_file=tmp_path / "agent.toml")


def test_missing_default_file_yields_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert AgentSettings.load(environ={}).max_steps == 10


def test_default_file_is_agent_toml_in_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path, "[agent]\nmax_steps = 4\n")
    monkeypatch.chdir(tmp_path)
    assert AgentSettings.load(environ={}).max_steps == 4


def test_os_environ_is_the_default_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AGENT_MAX_STEPS", "6")
    monkeypatch.setenv("AGENT_API_KEY", "sk-from-env")
    settings = AgentSettings.load()
    assert settings.max_steps == 6
    assert settings.api_key() == "sk-from-env"
    # An explicit environ replaces os.environ entirely.
    assert AgentSettings.load(environ={}).max_steps == 10
    assert settings.api_key({}) is None


@pytest.mark.parametrize("how", ["argument", "variable"])
def test_a_named_config_file_must_exist(tmp_path: Path, how: str) -> None:
    missing = tmp_path / "nope.toml"
    environ = {} if how == "argument" else {"AGENT_CONFIG_FILE": str(missing)}
    config_file = missing if how == "argument" else None
    with pytest.raises(AgentError) as caught:
        AgentSettings.load(environ=environ, config_file=config_file)
    assert str(missing) in caught.value.message
    assert "does not exist" in caught.value.message
    assert ("AGENT_CONFIG_FILE" in caught.value.message) == (how == "variable")


def test_config_file_argument_wins_over_the_variable(tmp_path: Path) -> None:
    chosen = write(tmp_path, "[agent]\nmax_steps = 3\n", "chosen.toml")
    ignored = write(tmp_path, "[agent]\nmax_steps = 4\n", "ignored.toml")
    settings = AgentSettings.load(environ={"AGENT_CONFIG_FILE": str(ignored)}, config_file=chosen)
    assert settings.max_steps == 3


def test_full_section_parses(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        [agent]
        provider = "anthropic"
        model = "claude-opus-4-1"
        base_url = "https://proxy.example.com"
        request_timeout_secs = 30
        max_steps = 25
        max_tokens = 64000
        system_prompt = "Be brief."
        prompt_caching = false
        max_run_secs = 120
        max_cost_usd = 2
        budget_session_usd = 1.5
        budget_scope_usd = 10
        budget_day_usd = 200
        budget_warn_fraction = 0.9
        budget_on_exhausted = "stop"
        redis_url = "rediss://cache.example.com:6380/2"
        database_url = "postgresql+asyncpg://agent@db.example.com/agent"
        route_prefix = "/api/agent"
        health_path = "/healthz"
        session_lock = "reject"
        max_request_bytes = 65536
        fallback_models = ["claude-haiku-4-5"]
        trace_content = true
        pacing_rpm = 450

        [agent.pacing."claude-haiku-4-5"]
        rpm = 900
        tpm = 400000

        [agent.prices."claude-opus-4-1"]
        input = 15
        output = 75
        cache_read = 1.5

        [[agent.mcp_servers]]
        name = "files"
        command = "python"
        args = ["server.py"]
        """,
    )
    settings = load(path)
    assert settings.model_dump() == {
        "provider": "anthropic",
        "model": "claude-opus-4-1",
        "base_url": "https://proxy.example.com",
        "request_timeout_secs": 30,
        "max_steps": 25,
        "max_tokens": 64000,
        "system_prompt": "Be brief.",
        "prompt_caching": False,
        "max_run_secs": 120,
        "max_cost_usd": 2.0,
        "budget_session_usd": 1.5,
        "budget_scope_usd": 10.0,
        "budget_day_usd": 200.0,
        "budget_warn_fraction": 0.9,
        "budget_on_exhausted": "stop",
        "startup_wait_secs": 30,
        "redis_url": "rediss://cache.example.com:6380/2",
        "database_url": "postgresql+asyncpg://agent@db.example.com/agent",
        "route_prefix": "/api/agent",
        "health_path": "/healthz",
        "session_lock": "reject",
        "max_request_bytes": 65536,
        "database_pool_size": 10,
        "database_max_overflow": 10,
        "database_pool_timeout_secs": 30,
        "model_client": None,
        "endpoint": {},
        "mcp_servers": [{"name": "files", "command": "python", "args": ["server.py"]}],
        "fallback_models": ["claude-haiku-4-5"],
        "trace_content": True,
        "prices": {"claude-opus-4-1": {"input": 15.0, "output": 75.0, "cache_read": 1.5}},
        "pacing_rpm": 450,
        "pacing_tpm": None,
        "pacing": {"claude-haiku-4-5": {"rpm": 900, "tpm": 400000}},
    }
    assert settings.resolved_model() == "claude-opus-4-1"
    assert settings.resolved_base_url() == "https://proxy.example.com"


def test_anthropic_and_scripted_defaults(tmp_path: Path) -> None:
    anthropic = load(write(tmp_path, '[agent]\nprovider = "anthropic"\n'))
    assert anthropic.resolved_model() == "claude-sonnet-4-5"
    assert anthropic.resolved_base_url() == "https://api.anthropic.com"
    scripted = load(AGENT_PROVIDER="scripted")
    assert scripted.resolved_model() == "scripted"
    assert scripted.resolved_base_url() == ""
    assert load(AGENT_PROVIDER="scripted", AGENT_BASE_URL="http://x").resolved_base_url() == ""


@pytest.mark.parametrize(
    ("table", "key"),
    [
        ('api_key = "sk-secret"', "api_key"),
        ('"api-key" = "sk-secret"', "api-key"),
        ('API_KEY = "sk-secret"', "API_KEY"),
        # Checked before any other field: the key is refused even next to other mistakes.
        ('max_steps = 0\nbogus = 1\napi_key = "sk-secret"', "api_key"),
    ],
)
def test_api_key_in_file_fails_closed(tmp_path: Path, table: str, key: str) -> None:
    message = config_error(write(tmp_path, f"[agent]\n{table}\n"))
    assert "AGENT_API_KEY" in message
    assert repr(key) in message
    assert "sk-secret" not in message


def test_unknown_keys_are_rejected_with_a_suggestion(tmp_path: Path) -> None:
    message = config_error(write(tmp_path, "[agent]\nmax-steps = 3\n"))
    assert "'max-steps'" in message
    assert "unknown key" in message
    assert "did you mean 'max_steps'" in message
    assert "accepted keys: provider, model" in message
    nested = config_error(write(tmp_path, "[agent.heartbeat]\nevery = 3\n"))
    assert "'heartbeat'" in nested


def test_unknown_provider_rejected(tmp_path: Path) -> None:
    for message in (
        config_error(write(tmp_path, '[agent]\nprovider = "gemini"\n')),
        config_error(AGENT_PROVIDER="gemini"),
        config_error(None, {"provider": "gemini"}),
    ):
        assert "'gemini'" in message
        assert "openai-compatible" in message
        assert "anthropic" in message
        assert "scripted" in message
    with pytest.raises(AgentError) as caught:
        parse_provider("gemini")
    assert caught.value.kind is ErrorKind.CONFIG
    assert "gemini" in caught.value.message
    assert "accepted: openai-compatible" in caught.value.message
    assert "AGENT_PROVIDER" in config_error(AGENT_PROVIDER="gemini")
    non_string = config_error(write(tmp_path, "[agent]\nprovider = 3\n"))
    assert "'provider' in [agent]" in non_string
    assert "must be a string" in non_string


@pytest.mark.parametrize(
    ("spelling", "expected"),
    [
        ("openai-compatible", "openai-compatible"),
        ("OpenAI-Compatible", "openai-compatible"),
        ("openai", "openai-compatible"),
        ("openai_compatible", "openai-compatible"),
        ("  OPENAI  ", "openai-compatible"),
        ("anthropic", "anthropic"),
        ("Anthropic", "anthropic"),
        ("scripted", "scripted"),
        (" Scripted\t", "scripted"),
    ],
)
def test_provider_spellings_accepted(tmp_path: Path, spelling: str, expected: str) -> None:
    assert parse_provider(spelling) == expected
    assert factory_parse_provider(spelling) == expected
    assert load(write(tmp_path, f'[agent]\nprovider = "{spelling}"\n')).provider == expected
    assert load(AGENT_PROVIDER=spelling).provider == expected
    assert load(None, {"provider": spelling}).provider == expected


@pytest.mark.parametrize(
    ("line", "key", "hint"),
    [
        ("max_steps = 0", "max_steps", "1 to 1000"),
        ("max_steps = 1001", "max_steps", "1 to 1000"),
        ("max_tokens = 10", "max_tokens", "1000 to 1000000"),
        ("max_tokens = 1000001", "max_tokens", "1000 to 1000000"),
        ("request_timeout_secs = 0", "request_timeout_secs", "1 to 3600"),
        ("request_timeout_secs = 3601", "request_timeout_secs", "1 to 3600"),
        ("max_run_secs = 0", "max_run_secs", "1 to 86400"),
        ("max_run_secs = 86401", "max_run_secs", "1 to 86400"),
        ('base_url = "ftp://example.com"', "base_url", "http:// or https://"),
        ('base_url = "localhost:11434"', "base_url", "http:// or https://"),
        ('base_url = "http://"', "base_url", "http:// or https://"),
        ('model = "   "', "model", "non-blank"),
        ('model = ""', "model", "non-blank"),
        ("max_steps = 3.5", "max_steps", "whole number"),
        ('max_steps = "10"', "max_steps", "whole number"),
        ("max_steps = true", "max_steps", "whole number"),
        ('prompt_caching = "yes"', "prompt_caching", "true or false"),
        ("system_prompt = 3", "system_prompt", "text"),
        ('redis_url = "http://127.0.0.1:6379"', "redis_url", "redis://"),
        ('database_url = "agent.db"', "database_url", "SQLAlchemy URL"),
        ('route_prefix = "agent"', "route_prefix", "starts with '/'"),
        ('route_prefix = "/agent/"', "route_prefix", "does not end with '/'"),
        ('route_prefix = "/"', "route_prefix", "does not end with '/'"),
        ('health_path = "health"', "health_path", "starts with '/'"),
        ('health_path = "/health?x=1"', "health_path", "starts with '/'"),
    ],
)
def test_validation_rejects_nonsense(tmp_path: Path, line: str, key: str, hint: str) -> None:
    path = write(tmp_path, f"[agent]\n{line}\n")
    message = config_error(path)
    assert f"'{key}' in [agent] of {path}" in message
    assert hint in message


def test_validation_accepts_the_edges(tmp_path: Path) -> None:
    low = load(
        write(
            tmp_path,
            "[agent]\nmax_steps = 1\nmax_tokens = 1000\nrequest_timeout_secs = 1\n"
            'max_run_secs = 1\nbase_url = "http://localhost:11434/v1"\n'
            'redis_url = "unix:///run/redis.sock"\nroute_prefix = "/a"\n',
        )
    )
    assert (low.max_steps, low.max_tokens, low.request_timeout_secs, low.max_run_secs) == (
        1,
        1000,
        1,
        1,
    )
    assert low.base_url == "http://localhost:11434/v1"
    high = load(
        None,
        {
            "max_steps": 1000,
            "max_tokens": 1_000_000,
            "request_timeout_secs": 3600,
            "max_run_secs": 86400,
        },
    )
    assert high.max_run_secs == 86400
    assert load(None, {"model": "  gpt-4o  "}).model == "gpt-4o"


def test_every_invalid_field_is_reported(tmp_path: Path) -> None:
    message = config_error(write(tmp_path, "[agent]\nmax_steps = 0\nmax_tokens = 10\n"))
    assert "'max_steps'" in message
    assert "'max_tokens'" in message
    assert "got 0" in message
    assert "got 10" in message


def test_non_table_section_rejected(tmp_path: Path) -> None:
    path = write(tmp_path, 'agent = "openai"\n')
    message = config_error(path)
    assert "[agent]" in message
    assert str(path) in message
    assert "must be a table" in message


def test_invalid_toml_rejected(tmp_path: Path) -> None:
    path = write(tmp_path, "[agent\nmax_steps = \n")
    message = config_error(path)
    assert str(path) in message
    assert "not valid TOML" in message


def test_unreadable_file_rejected(tmp_path: Path) -> None:
    directory = tmp_path / "agent.toml"
    directory.mkdir()
    assert "cannot read config file" in config_error(directory)
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\xff\xfe[agent]\n")
    assert "cannot read config file" in config_error(binary)


# --- environment: AP-05 ---------------------------------------------------------------------


def test_env_overrides_file(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '[agent]\nmodel = "from-file"\nmax_steps = 7\nmax_tokens = 5000\nprompt_caching = true\n',
    )
    settings = load(
        path,
        AGENT_PROVIDER="anthropic",
        AGENT_MODEL="from-env",
        AGENT_BASE_URL="http://127.0.0.1:8080",
        AGENT_REQUEST_TIMEOUT_SECS="15",
        AGENT_MAX_STEPS="3",
        AGENT_SYSTEM_PROMPT="  keep my spaces  ",
        AGENT_PROMPT_CACHING="off",
        AGENT_MAX_RUN_SECS="90",
        AGENT_REDIS_URL="redis://10.0.0.1:6379/1",
        AGENT_DATABASE_URL="sqlite+aiosqlite:///:memory:",
        AGENT_ROUTE_PREFIX="/bot",
        AGENT_HEALTH_PATH="/status",
        AGENT_SESSION_LOCK="reject",
        AGENT_MAX_REQUEST_BYTES="4096",
        AGENT_BUDGET_SCOPE_USD=" 2.5 ",
    )
    assert settings.model_dump() == {
        "provider": "anthropic",
        "model": "from-env",
        "base_url": "http://127.0.0.1:8080",
        "request_timeout_secs": 15,
        "max_steps": 3,
        "max_tokens": 5000,  # untouched by the environment: the file's value
        "system_prompt": "  keep my spaces  ",
        "prompt_caching": False,
        "max_run_secs": 90,
        "max_cost_usd": None,
        "budget_session_usd": None,
        "budget_scope_usd": 2.5,
        "budget_day_usd": None,
        "budget_warn_fraction": 0.8,
        "budget_on_exhausted": "wrap_up",
        "startup_wait_secs": 30,
        "redis_url": "redis://10.0.0.1:6379/1",
        "database_url": "sqlite+aiosqlite:///:memory:",
        "route_prefix": "/bot",
        "health_path": "/status",
        "session_lock": "reject",
        "max_request_bytes": 4096,
        "database_pool_size": 10,
        "database_max_overflow": 10,
        "database_pool_timeout_secs": 30,
        "model_client": None,
        "endpoint": {},
        "mcp_servers": [],
        "fallback_models": [],
        "trace_content": False,
        "prices": {},
        "pacing_rpm": None,
        "pacing_tpm": None,
        "pacing": {},
    }


@pytest.mark.parametrize(
    ("variable", "value", "hint"),
    [
        ("AGENT_MAX_STEPS", "ten", "whole number"),
        ("AGENT_MAX_STEPS", "-1", "whole number"),
        ("AGENT_MAX_STEPS", "1.5", "whole number"),
        ("AGENT_MAX_STEPS", "0", "1 to 1000"),
        ("AGENT_MAX_TOKENS", "999", "1000 to 1000000"),
        ("AGENT_REQUEST_TIMEOUT_SECS", "0x10", "whole number"),
        ("AGENT_MAX_RUN_SECS", "86401", "1 to 86400"),
        ("AGENT_PROMPT_CACHING", "maybe", "1/true/yes/on or 0/false/no/off"),
        ("AGENT_PROMPT_CACHING", "t", "1/true/yes/on or 0/false/no/off"),
        ("AGENT_PROVIDER", "gemini", "anthropic"),
        ("AGENT_MODEL", "   ", "non-blank"),
        ("AGENT_BASE_URL", "ftp://example.com", "http:// or https://"),
        ("AGENT_REDIS_URL", "localhost:6379", "redis://"),
        ("AGENT_DATABASE_URL", "agent.db", "SQLAlchemy URL"),
        ("AGENT_ROUTE_PREFIX", "/agent/", "does not end with '/'"),
        ("AGENT_HEALTH_PATH", "health", "starts with '/'"),
        ("AGENT_BUDGET_DAY_USD", "lots", "a number of US dollars"),
        ("AGENT_BUDGET_DAY_USD", "0", "greater than 0"),
        ("AGENT_BUDGET_ON_EXHAUSTED", "later", "wrap_up"),
    ],
)
def test_env_parse_error_names_the_variable(variable: str, value: str, hint: str) -> None:
    message = config_error(**{variable: value})
    assert message.startswith(variable)
    assert hint in message


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("1", True),
        ("true", True),
        ("TRUE", True),
        (" Yes ", True),
        ("on", True),
        ("0", False),
        ("false", False),
        ("No", False),
        (" OFF\n", False),
    ],
)
def test_env_booleans_accept_the_documented_words(value: str, expected: bool) -> None:
    assert load(AGENT_PROMPT_CACHING=value).prompt_caching is expected


def test_env_integers_are_trimmed() -> None:
    assert load(AGENT_MAX_STEPS=" 42\n").max_steps == 42
    assert load(AGENT_MAX_RUN_SECS="\t600 ").max_run_secs == 600


def test_empty_env_variables_count_as_unset(tmp_path: Path) -> None:
    path = write(tmp_path, '[agent]\nmodel = "from-file"\nmax_steps = 7\n')
    settings = load(path, AGENT_MODEL="", AGENT_MAX_STEPS="", AGENT_PROMPT_CACHING="")
    assert (settings.model, settings.max_steps, settings.prompt_caching) == ("from-file", 7, True)


def test_unrelated_agent_variables_are_ignored() -> None:
    settings = load(AGENT_SOMETHING_ELSE="x", AGENT_API_KEY="sk-test", OTHER_MAX_STEPS="3")
    assert settings.max_steps == 10
    assert "api_key" not in settings.model_dump()


def test_a_bad_file_value_fails_even_when_the_environment_overrides_it(tmp_path: Path) -> None:
    path = write(tmp_path, "[agent]\nmax_steps = 0\n")
    message = config_error(path, AGENT_MAX_STEPS="5")
    assert f"'max_steps' in [agent] of {path}" in message


# --- code overrides: AP-06, with the "set wins" rule of SPEC §0 --------------------------------


def test_code_override_wins_when_set_even_if_it_equals_the_default(tmp_path: Path) -> None:
    path = write(tmp_path, "[agent]\nmax_steps = 7\nprompt_caching = false\n")
    settings = load(path, {"max_steps": 10, "prompt_caching": True}, AGENT_MAX_STEPS="8")
    assert settings.max_steps == 10
    assert settings.prompt_caching is True


def test_code_overrides_leave_untouched_fields_alone(tmp_path: Path) -> None:
    path = write(tmp_path, '[agent]\nmax_steps = 7\nmodel = "from-file"\n')
    settings = load(path, {"max_tokens": 2000}, AGENT_SYSTEM_PROMPT="from env")
    assert (settings.max_steps, settings.model, settings.max_tokens) == (7, "from-file", 2000)
    assert settings.system_prompt == "from env"
    assert load(path, {}) == load(path, None) == load(path)
    assert load(path, {}).max_steps == 7


def test_a_code_override_of_none_clears_an_optional_field(tmp_path: Path) -> None:
    path = write(tmp_path, '[agent]\nmodel = "from-file"\nmax_run_secs = 60\n')
    settings = load(path, {"model": None, "max_run_secs": None}, AGENT_MODEL="from-env")
    assert settings.model is None
    assert settings.max_run_secs is None
    assert settings.resolved_model() == "gpt-4o-mini"


def test_code_override_errors_name_the_override() -> None:
    assert config_error(None, {"max_steps": 0}).startswith("code override 'max_steps'")
    assert "whole number" in config_error(None, {"max_steps": "3"})
    unknown = config_error(None, {"max_stepz": 3})
    assert "code override 'max_stepz': unknown key (did you mean 'max_steps'?)" in unknown
    key = config_error(None, {"api_key": "sk-secret"})
    assert "AGENT_API_KEY" in key
    assert "sk-secret" not in key


def test_settings_are_frozen() -> None:
    settings = load()
    with pytest.raises(ValidationError):
        settings.max_steps = 3  # type: ignore[misc]


# --- profiles -----------------------------------------------------------------------------


def test_profile_overlay_sits_between_the_file_and_the_environment(tmp_path: Path) -> None:
    path = write(tmp_path, '[agent]\nmax_steps = 7\nmodel = "base"\nmax_tokens = 5000\n')
    write(tmp_path, '[agent]\nmax_steps = 20\nmodel = "prod"\n', "agent.prod.toml")
    settings = load(path, AGENT_PROFILE="prod", AGENT_MODEL="env")
    assert settings.max_steps == 20  # overlay over file
    assert settings.max_tokens == 5000  # file value the overlay did not touch
    assert settings.model == "env"  # environment over overlay
    assert load(path).max_steps == 7  # no profile, no overlay
    assert load(path, AGENT_PROFILE="  ").max_steps == 7


def test_overlay_without_an_agent_table_changes_nothing(tmp_path: Path) -> None:
    path = write(tmp_path, "[agent]\nmax_steps = 7\n")
    write(tmp_path, "[logging]\nlevel = 'debug'\n", "agent.dev.toml")
    assert load(path, AGENT_PROFILE="dev").max_steps == 7


def test_overlay_applies_without_a_base_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path, "[agent]\nmax_steps = 9\n", "agent.ci.toml")
    monkeypatch.chdir(tmp_path)
    assert AgentSettings.load(environ={"AGENT_PROFILE": "ci"}).max_steps == 9


def test_overlay_is_named_after_the_config_file(tmp_path: Path) -> None:
    path = write(tmp_path, "[agent]\nmax_steps = 7\n", "service.toml")
    write(tmp_path, "[agent]\nmax_steps = 8\n", "service.staging.toml")
    assert load(path, AGENT_PROFILE="staging").max_steps == 8


def test_missing_overlay_is_an_error_naming_it(tmp_path: Path) -> None:
    path = write(tmp_path, "[agent]\nmax_steps = 7\n")
    message = config_error(path, AGENT_PROFILE="prod")
    assert str(tmp_path / "agent.prod.toml") in message
    assert "AGENT_PROFILE='prod'" in message


@pytest.mark.parametrize("profile", ["../etc", "a/b", "-x", "..", "pr od"])
def test_profile_names_are_checked(tmp_path: Path, profile: str) -> None:
    message = config_error(write(tmp_path, ""), AGENT_PROFILE=profile)
    assert "AGENT_PROFILE" in message
    assert "not a valid profile name" in message


def test_overlay_follows_the_file_rules(tmp_path: Path) -> None:
    path = write(tmp_path, "[agent]\n")
    overlay = write(tmp_path, '[agent]\napi_key = "sk-secret"\n', "agent.prod.toml")
    message = config_error(path, AGENT_PROFILE="prod")
    assert "AGENT_API_KEY" in message
    assert str(overlay) in message
    write(tmp_path, "[agent]\nmax_steps = 0\n", "agent.prod.toml")
    assert f"'max_steps' in [agent] of {overlay}" in config_error(path, AGENT_PROFILE="prod")
    write(tmp_path, '[agent]\nredis_url = "redis://:pw@h:6379/0"\n', "agent.prod.toml")
    assert "AGENT_REDIS_URL" in config_error(path, AGENT_PROFILE="prod")


# --- secrets: the API key and URL passwords -------------------------------------------------


def test_api_key_missing_is_a_config_error() -> None:
    for settings in (load(), load(AGENT_PROVIDER="anthropic")):
        with pytest.raises(AgentError) as caught:
            settings.require_api_key({})
        assert caught.value.kind is ErrorKind.CONFIG
        assert caught.value.message.startswith("AGENT_API_KEY is not set")
    explicit_public = load(AGENT_BASE_URL="https://API.OPENAI.COM/v1/")
    assert explicit_public.key_required()
    with pytest.raises(AgentError):
        explicit_public.require_api_key({"AGENT_API_KEY": "   "})


def test_api_key_comes_from_the_environment() -> None:
    settings = load()
    assert settings.require_api_key({"AGENT_API_KEY": " sk-test-123 \n"}) == "sk-test-123"
    assert settings.api_key({"AGENT_API_KEY": "sk-test-123"}) == "sk-test-123"
    assert settings.api_key({}) is None


@pytest.mark.parametrize(
    "env",
    [
        {"AGENT_PROVIDER": "scripted"},
        {"AGENT_BASE_URL": "http://localhost:11434/v1"},
        {"AGENT_PROVIDER": "anthropic", "AGENT_BASE_URL": "http://127.0.0.1:9000"},
        {"AGENT_BASE_URL": "https://api.openai.com.evil.example/v1"},
    ],
)
def test_api_key_is_optional_elsewhere(env: dict[str, str]) -> None:
    settings = load(**env)
    assert not settings.key_required()
    assert settings.require_api_key({}) is None
    assert settings.require_api_key({"AGENT_API_KEY": "sk-local"}) == "sk-local"


def test_api_key_is_never_a_field() -> None:
    settings = load(AGENT_API_KEY="sk-never-shown")
    assert "api_key" not in AgentSettings.model_fields
    assert "sk-never-shown" not in repr(settings)
    assert "sk-never-shown" not in str(settings.model_dump())
    assert "sk-never-shown" not in settings.model_dump_json()


@pytest.mark.parametrize(
    ("key", "url", "variable"),
    [
        ("redis_url", "redis://:hunter2@cache:6379/0", "AGENT_REDIS_URL"),
        ("redis_url", "redis://default:hunter2@cache:6379/0", "AGENT_REDIS_URL"),
        ("redis_url", "redis://cache:6379/0?password=hunter2", "AGENT_REDIS_URL"),
        ("database_url", "postgresql+asyncpg://app:hunter2@db/agent", "AGENT_DATABASE_URL"),
        ("base_url", "https://user:hunter2@proxy.example.com/v1", "AGENT_BASE_URL"),
    ],
)
def test_url_with_password_is_refused_in_a_file(
    tmp_path: Path, key: str, url: str, variable: str
) -> None:
    message = config_error(write(tmp_path, f'[agent]\n{key} = "{url}"\n'))
    assert variable in message
    assert f"'{key}' in [agent]" in message
    assert "hunter2" not in message
    # The same URL is accepted from the environment and from code, and hidden in repr/str.
    for settings in (load(**{variable: url}), load(None, {key: url})):
        assert getattr(settings, key) == url
        assert "hunter2" not in repr(settings)
        assert "hunter2" not in str(settings)
        assert "***" in repr(settings)


def test_urls_without_a_password_are_fine_in_a_file(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '[agent]\nredis_url = "redis://default@cache:6379/0"\n'
        'database_url = "postgresql+asyncpg://app:@db/agent"\n',
    )
    settings = load(path)
    assert settings.redis_url == "redis://default@cache:6379/0"
    assert settings.database_url == "postgresql+asyncpg://app:@db/agent"


def test_invalid_url_errors_do_not_echo_passwords() -> None:
    message = config_error(AGENT_BASE_URL="ftp://user:hunter2@example.com")
    assert "hunter2" not in message
    assert "ftp://user:***@example.com" in message


@pytest.mark.parametrize(
    ("variable", "url"),
    [
        ("AGENT_DATABASE_URL", "postgresql+asyncpg//app:hunter2pw@db/agent"),  # no ":"
        ("AGENT_REDIS_URL", "redis//:hunter2pw@cache:6379/0"),
        ("AGENT_BASE_URL", "http//user:hunter2pw@gateway/v1"),
        ("AGENT_BASE_URL", "http://user:hunter2pw@[::1/v1"),  # no URL to urlsplit
    ],
)
def test_a_malformed_url_does_not_echo_its_password(variable: str, url: str) -> None:
    """A typo made the value no URL to mask_url, which then hid nothing of it."""
    message = config_error(**{variable: url})
    assert "hunter2pw" not in message
    assert "***@" in message


def test_settings_refused_in_code_do_not_echo_a_password() -> None:
    """``AgentSettings(...)`` raises pydantic's ValidationError, whose text showed the refused
    value (``input_value=...``) beside the masked one."""
    with pytest.raises(ValidationError) as caught:
        AgentSettings(redis_url="http://user:hunter2pw@cache/0")
    assert "hunter2pw" not in str(caught.value)
    assert "hunter2pw" not in repr(caught.value)


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("redis://:pw@h:6379/0", "redis://:***@h:6379/0"),
        ("postgresql+asyncpg://u:p%40ss@h:5432/db", "postgresql+asyncpg://u:***@h:5432/db"),
        ("redis://h/0?password=pw&ssl=true", "redis://h/0?password=***&ssl=true"),
        ("sqlite+aiosqlite:///./agent.db", "sqlite+aiosqlite:///./agent.db"),
        ("not a url", "not a url"),
        ("http://[::1", "http://[::1"),
    ],
)
def test_mask_url(url: str, masked: str) -> None:
    assert mask_url(url) == masked


def test_session_lock_policy_is_queue_or_reject(tmp_path: Path) -> None:
    assert load().session_lock == "queue"
    assert load(write(tmp_path, '[agent]\nsession_lock = "reject"\n')).session_lock == "reject"
    assert load(AGENT_SESSION_LOCK=" Reject ").session_lock == "reject"
    message = config_error(AGENT_SESSION_LOCK="wait")
    assert "AGENT_SESSION_LOCK" in message
    assert "queue or reject" in message
    assert "'session_lock'" in config_error(write(tmp_path, "[agent]\nsession_lock = 1\n"))


# --- the documented example ----------------------------------------------------------------


def example_assignments() -> dict[str, str]:
    pattern = re.compile(r"^# (\w+) = (.+)$")
    found: dict[str, str] = {}
    for line in EXAMPLE.read_text(encoding="utf-8").splitlines():
        match = pattern.match(line)
        if match:
            assert match.group(1) not in found, f"{match.group(1)} is shown twice"
            found[match.group(1)] = match.group(2)
    return found


def test_the_example_documents_every_key_with_its_default(tmp_path: Path) -> None:
    shown = example_assignments()
    assert set(shown) == set(AgentSettings.model_fields)
    assert "api_key" not in shown
    assert "AGENT_API_KEY" in EXAMPLE.read_text(encoding="utf-8")
    uncommented = "[agent]\n" + "".join(f"{key} = {value}\n" for key, value in shown.items())
    settings = load(write(tmp_path, uncommented))
    defaults = load()
    for key, field in AgentSettings.model_fields.items():
        if field.default is not None:
            assert getattr(settings, key) == getattr(defaults, key), key
    assert settings.resolved_model() == defaults.resolved_model()
    assert settings.resolved_base_url() == defaults.resolved_base_url()
    # The file as shipped (everything commented) is valid TOML and means "all defaults".
    assert tomllib.loads(EXAMPLE.read_text(encoding="utf-8")) == {"agent": {}}
    assert load(EXAMPLE) == defaults


# --- the client factory -----------------------------------------------------------------------


async def test_client_from_config_picks_provider() -> None:
    openai = create_client(load(AGENT_REQUEST_TIMEOUT_SECS="5"), api_key="sk-o")
    anthropic = create_client(
        load(AGENT_PROVIDER="anthropic", AGENT_PROMPT_CACHING="no"), api_key="sk-a"
    )
    scripted = create_client(load(AGENT_PROVIDER="scripted", AGENT_MODEL="demo"))
    try:
        assert isinstance(openai, OpenAICompatibleClient)
        assert openai.model == "gpt-4o-mini"
        assert openai.base_url == "https://api.openai.com/v1"
        assert "sk-o" not in repr(openai)
        assert isinstance(anthropic, AnthropicClient)
        assert anthropic.model == "claude-sonnet-4-5"
        assert anthropic.prompt_caching is False
        assert isinstance(scripted, ScriptedModel)
        assert await scripted.list_models() == ["demo"]
    finally:
        for client in (openai, anthropic, scripted):
            await client.aclose()


@pytest.mark.parametrize(
    ("env", "url", "header", "value"),
    [
        (
            {"AGENT_BASE_URL": "http://llm.test/v1", "AGENT_MODEL": "llama3"},
            "http://llm.test/v1/models",
            "authorization",
            "Bearer sk-wire",
        ),
        (
            {"AGENT_PROVIDER": "anthropic"},
            "https://api.anthropic.com/v1/models",
            "x-api-key",
            "sk-wire",
        ),
    ],
)
async def test_created_clients_use_the_resolved_url_and_key(
    env: dict[str, str], url: str, header: str, value: str
) -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"object": "list", "data": [{"id": "m1"}, {"id": "m2"}]})

    client = create_client(load(**env), api_key="sk-wire", transport=httpx.MockTransport(answer))
    try:
        assert await client.list_models() == ["m1", "m2"]
    finally:
        await client.aclose()
    assert str(seen[0].url) == url
    assert seen[0].headers[header] == value


async def test_created_client_sends_the_configured_model() -> None:
    bodies: list[bytes] = []

    def answer(request: httpx.Request) -> httpx.Response:
        bodies.append(request.content)
        return httpx.Response(
            200,
            json={
                "id": "c1",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "hi"},
                        "finish_reason": "stop",
                    }
                ],
            },
        )

    settings = load(AGENT_BASE_URL="http://llm.test/v1", AGENT_MODEL="qwen2.5")
    client = create_client(settings, transport=httpx.MockTransport(answer))
    try:
        await client.chat(ChatRequest(messages=[ChatMessage.user("hello")]))
    finally:
        await client.aclose()
    assert b'"model":"qwen2.5"' in bodies[0].replace(b" ", b"")


# --- .env and the secrets directory ------------------------------------------------------


def test_a_dotenv_file_in_the_working_directory_is_read_under_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "[agent]\nmax_steps = 4\nmodel = 'from-toml'\n")
    write(
        tmp_path,
        "# comment\nexport AGENT_MAX_STEPS=7\nAGENT_MODEL='from-dotenv'\nOTHER=ignored\n"
        "AGENT_API_KEY=sk-dotenv-12345\nAGENT_REDIS_URL=redis://:hunter22@cache:6379/0\n",
        name=".env",
    )
    settings = AgentSettings.load(environ={"AGENT_MODEL": "from-environment"})
    assert settings.max_steps == 7  # .env beats agent.toml
    assert settings.model == "from-environment"  # the environment beats .env
    assert settings.redis_url == "redis://:hunter22@cache:6379/0"  # a password is fine in .env
    assert settings.api_key({}) == "sk-dotenv-12345"
    assert settings.api_key({"AGENT_API_KEY": "sk-env-67890"}) == "sk-env-67890"
    # A blank variable in the environment counts as unset, so the file's value shows through.
    assert AgentSettings.load(environ={"AGENT_MAX_STEPS": ""}).max_steps == 7


def test_agent_env_file_names_another_file_which_must_exist(tmp_path: Path) -> None:
    env_file = write(tmp_path, "AGENT_MAX_STEPS=9\nAGENT_PROFILE=prod\n", name="prod.env")
    write(tmp_path, "[agent]\nmax_steps = 3\n")
    write(tmp_path, "[agent]\nmodel = 'overlay'\n", name="agent.prod.toml")
    environ = {"AGENT_ENV_FILE": str(env_file), "AGENT_CONFIG_FILE": str(tmp_path / "agent.toml")}
    settings = AgentSettings.load(environ=environ)
    assert (settings.max_steps, settings.model) == (9, "overlay")  # the profile came from .env

    missing = tmp_path / "missing.env"
    with pytest.raises(AgentError) as caught:
        AgentSettings.load(environ={"AGENT_ENV_FILE": str(missing)})
    assert caught.value.kind is ErrorKind.CONFIG
    assert str(missing) in str(caught.value)
    assert "AGENT_ENV_FILE" in str(caught.value)


def test_a_bad_value_in_dotenv_names_the_variable_and_the_file(tmp_path: Path) -> None:
    env_file = write(tmp_path, "AGENT_MAX_STEPS=lots\n", name="bad.env")
    with pytest.raises(AgentError) as caught:
        AgentSettings.load(environ={"AGENT_ENV_FILE": str(env_file)})
    message = str(caught.value)
    assert f"AGENT_MAX_STEPS in .env file {env_file} must be a whole number" in message
    assert "'lots'" in message
    assert "1 to 1000" in message

    write(tmp_path, "AGENT_PROVIDER=gemini\n", name="bad.env")
    with pytest.raises(AgentError, match=r"AGENT_PROVIDER in \.env file .*unknown provider"):
        AgentSettings.load(environ={"AGENT_ENV_FILE": str(env_file)})


def test_a_secrets_directory_holds_one_variable_per_file(tmp_path: Path) -> None:
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "agent_api_key").write_text("  sk-secret-12345\n", encoding="utf-8")
    (secrets / "AGENT_DATABASE_URL").write_text(
        "postgresql+asyncpg://app:s3cr3t-pw@db/app\n", encoding="utf-8"
    )
    (secrets / "AGENT_MAX_STEPS").write_text("5", encoding="utf-8")
    (secrets / "unrelated").write_text("x", encoding="utf-8")
    env_file = write(tmp_path, "AGENT_MAX_STEPS=6\n", name="app.env")
    environ = {"AGENT_SECRETS_DIR": str(secrets), "AGENT_CONFIG_FILE": str(tmp_path / "no.toml")}
    write(tmp_path, "", name="no.toml")

    settings = AgentSettings.load(environ=environ)
    assert settings.max_steps == 5
    assert settings.database_url == "postgresql+asyncpg://app:s3cr3t-pw@db/app"
    assert "s3cr3t-pw" not in repr(settings)
    assert settings.api_key(environ) == "sk-secret-12345"
    # .env beats the secrets directory, and may name the directory itself.
    both = {**environ, "AGENT_ENV_FILE": str(env_file)}
    assert AgentSettings.load(environ=both).max_steps == 6
    write(tmp_path, f"AGENT_SECRETS_DIR={secrets}\n", name="app.env")
    named_in_dotenv = {
        "AGENT_ENV_FILE": str(env_file),
        "AGENT_CONFIG_FILE": environ["AGENT_CONFIG_FILE"],
    }
    assert AgentSettings.load(environ=named_in_dotenv).max_steps == 5

    (secrets / "AGENT_MAX_STEPS").write_text("zero", encoding="utf-8")
    with pytest.raises(
        AgentError, match=rf"AGENT_MAX_STEPS in secrets dir {re.escape(str(secrets))}"
    ):
        AgentSettings.load(environ=environ)


@pytest.mark.parametrize("make", ["missing", "file"])
def test_a_secrets_dir_that_is_not_a_directory_is_a_config_error(tmp_path: Path, make: str) -> None:
    target = tmp_path / "secrets"
    if make == "file":
        target.write_text("", encoding="utf-8")
    with pytest.raises(AgentError) as caught:
        AgentSettings.load(environ={"AGENT_SECRETS_DIR": str(target)})
    assert caught.value.kind is ErrorKind.CONFIG
    expected = "does not exist" if make == "missing" else "is not a directory"
    assert f"secrets dir {target} {expected}" in str(caught.value)


def test_config_sources_name_each_variable_by_its_layer_never_its_value(tmp_path: Path) -> None:
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "AGENT_API_KEY").write_text("sk-secret-12345", encoding="utf-8")
    env_file = write(tmp_path, "AGENT_MODEL=m\n", name="app.env")
    environ = {
        "AGENT_ENV_FILE": str(env_file),
        "AGENT_SECRETS_DIR": str(secrets),
        "AGENT_MAX_STEPS": "3",
        "AGENT_CONFIG_FILE": str(tmp_path / "agent.toml"),
    }
    line = config_sources(environ)
    assert f"secrets dir {secrets} AGENT_API_KEY" in line
    assert f".env file {env_file} AGENT_MODEL" in line
    assert "environment AGENT_ENV_FILE, AGENT_MAX_STEPS, AGENT_SECRETS_DIR" in line
    assert "sk-secret" not in line

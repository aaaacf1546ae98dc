"""The ``[agent]`` configuration: :class:`AgentSettings`, loaded in layers, validated fail-closed.

Layers, weakest first: the defaults; ``agent.toml`` (``AGENT_CONFIG_FILE``); the profile
overlay ``agent.<AGENT_PROFILE>.toml``; ``AGENT_*`` variables (a secrets directory, a ``.env``
file, the process environment); code overrides given to :meth:`AgentSettings.load`. Each layer
is validated on its own, so every ``config`` error names where the bad value came from and what
would be accepted.

Secrets fail closed: the API key is ``AGENT_API_KEY`` only, and a URL with a password is
accepted from the variables or code, never from a TOML file; ``repr`` hides URL passwords.
``docs/guide/configuration.md`` has every layer and key.
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal
from urllib.parse import SplitResult, urlsplit

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import (
    BaseSettings,
    DotEnvSettingsSource,
    PydanticBaseSettingsSource,
    SecretsSettingsSource,
    SettingsConfigDict,
)

from agent_plugin.errors import AgentError
from agent_plugin.redaction import mask_url

if TYPE_CHECKING:
    from agent_plugin.pacing import PacingConfig

__all__ = [
    "API_KEY_ENV",
    "CONFIG_FILE_ENV",
    "DEFAULT_CONFIG_FILE",
    "DEFAULT_ENV_FILE",
    "ENV_FILE_ENV",
    "ENV_PREFIX",
    "PROFILE_ENV",
    "SECRETS_DIR_ENV",
    "AgentSettings",
    "ProviderName",
    "SessionLockPolicy",
    "config_sources",
    "parse_provider",
]

ProviderName = Literal["openai-compatible", "anthropic", "scripted"]
"""The canonical provider names."""

SessionLockPolicy = Literal["queue", "reject"]
"""What a background run does when another run holds its session: wait its turn, or refuse
(409 when it is enqueued)."""

ENV_PREFIX: Final = "AGENT_"
API_KEY_ENV: Final = "AGENT_API_KEY"
CONFIG_FILE_ENV: Final = "AGENT_CONFIG_FILE"
PROFILE_ENV: Final = "AGENT_PROFILE"
ENV_FILE_ENV: Final = "AGENT_ENV_FILE"
SECRETS_DIR_ENV: Final = "AGENT_SECRETS_DIR"
DEFAULT_CONFIG_FILE: Final = "agent.toml"
DEFAULT_ENV_FILE: Final = ".env"
TABLE: Final = "agent"

_PROVIDER_SPELLINGS: Final[dict[str, ProviderName]] = {
    "openai-compatible": "openai-compatible",
    "openai_compatible": "openai-compatible",
    "openai": "openai-compatible",
    "anthropic": "anthropic",
    "scripted": "scripted",
}
_ACCEPTED_PROVIDERS: Final = (
    "openai-compatible (also openai, openai_compatible), anthropic, scripted"
)

_DEFAULT_MODEL: Final[dict[ProviderName, str]] = {
    "openai-compatible": "gpt-4o-mini",
    "anthropic": "claude-sonnet-4-5",
    "scripted": "scripted",
}
_DEFAULT_BASE_URL: Final[dict[ProviderName, str]] = {
    "openai-compatible": "https://api.openai.com/v1",
    "anthropic": "https://api.anthropic.com",
    "scripted": "",
}
_KEYED_HOSTS: Final = frozenset({"api.openai.com", "api.anthropic.com"})
"""Public hosts that refuse requests without a key; other servers (Ollama, vLLM) need none."""

_SECRET_URL_FIELDS: Final = ("base_url", "redis_url", "database_url")
_INT_FIELDS: Final = frozenset(
    {
        "request_timeout_secs",
        "max_steps",
        "max_tokens",
        "max_run_secs",
        "max_request_bytes",
        "startup_wait_secs",
        "database_pool_size",
        "database_max_overflow",
        "database_pool_timeout_secs",
        "pacing_rpm",
        "pacing_tpm",
    }
)
_FLOAT_FIELDS: Final = frozenset(
    {
        "max_cost_usd",
        "budget_session_usd",
        "budget_scope_usd",
        "budget_day_usd",
        "budget_warn_fraction",
    }
)
_BOOL_FIELDS: Final = frozenset({"prompt_caching"})
_TRUE: Final = frozenset({"1", "true", "yes", "on"})
_FALSE: Final = frozenset({"0", "false", "no", "off"})
_PROFILE_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_DOTTED: Final = r"[^\W\d]\w*(?:\.[^\W\d]\w*)*"
_IMPORT_PATH: Final = re.compile(f"{_DOTTED}:{_DOTTED}")
_URL_SCHEME: Final = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://")

_ACCEPTED: Final[dict[str, str]] = {
    "provider": _ACCEPTED_PROVIDERS,
    "model": "a non-blank model name, or unset for the provider's default",
    "base_url": "an http:// or https:// URL, or unset for the provider's default",
    "request_timeout_secs": "a whole number from 1 to 3600",
    "max_steps": "a whole number from 1 to 1000",
    "max_tokens": "a whole number from 1000 to 1000000",
    "system_prompt": "text",
    "prompt_caching": "true or false",
    "max_run_secs": "a whole number from 1 to 86400, or unset for no limit",
    "startup_wait_secs": "a whole number from 0 to 3600",
    "max_cost_usd": "a number of US dollars above 0, or unset for no limit",
    "budget_session_usd": "a number of US dollars above 0, or unset for no window",
    "budget_scope_usd": "a number of US dollars above 0, or unset for no window",
    "budget_day_usd": "a number of US dollars above 0, or unset for no window",
    "budget_warn_fraction": "a number between 0 and 1",
    "budget_on_exhausted": "wrap_up or stop",
    "redis_url": "a redis://, rediss:// or unix:// URL",
    "database_url": "an SQLAlchemy URL such as sqlite+aiosqlite:///./agent.db",
    "database_pool_size": "a whole number from 1 to 1000",
    "database_max_overflow": "a whole number from 0 to 1000",
    "database_pool_timeout_secs": "a whole number from 1 to 3600",
    "route_prefix": "a path that starts with '/' and does not end with '/', such as /agent",
    "health_path": "a path that starts with '/' and does not end with '/', such as /health",
    "session_lock": "queue or reject",
    "max_request_bytes": "a whole number of bytes from 1024 to 1073741824",
    "model_client": "an import path such as tests.models:support_bot, or unset",
    "mcp_servers": "[[agent.mcp_servers]] tables in the file (or a list of tables in code)",
    "endpoint": "an [agent.endpoint] table: name (a known profile) and the profile's fields",
    "pacing_rpm": "a whole number of model calls per minute, or unset for no limit",
    "pacing_tpm": "a whole number of tokens per minute, or unset for no limit",
}


def parse_provider(text: str) -> ProviderName:
    """The canonical provider for ``text``: trimmed, case-insensitive, with the accepted aliases.

    Raises a ``config`` :class:`AgentError` that quotes ``text`` and lists the accepted names.
    """
    name = _provider_or_none(text)
    if name is None:
        raise AgentError.config(f"unknown provider {text!r}; accepted: {_ACCEPTED_PROVIDERS}")
    return name


def _provider_or_none(text: str) -> ProviderName | None:
    return _PROVIDER_SPELLINGS.get(text.strip().lower())


def _has_password(url: str) -> bool:
    return mask_url(url) != url


def _shown(url: str) -> str:
    """``url`` for an error message, its password hidden even when it is malformed: a typo
    such as ``postgres//user:pw@host`` is no URL to :func:`mask_url`, which then hid nothing,
    so whatever stands before the last ``@`` of a URL it leaves as it is goes."""
    masked = mask_url(url)
    if masked == url and "@" in url:
        return "***@" + url.rpartition("@")[2]
    return masked


@dataclass(frozen=True)
class _LoadContext:
    """What a construction of :class:`AgentSettings` reads (set by :meth:`AgentSettings.load`)."""

    variables: _Variables | None = None
    config_file: str | Path | None = None
    layer_only: bool = False
    """Validate the given values alone: no file, no environment (used to check one layer)."""


_CONTEXT: ContextVar[_LoadContext | None] = ContextVar("agent_settings_context", default=None)


class AgentSettings(BaseSettings):
    """The validated ``[agent]`` settings; frozen. Build them with :meth:`load`.

    The API key is deliberately not a field: read it with :meth:`api_key` or
    :meth:`require_api_key`, which look at ``AGENT_API_KEY`` only.
    """

    model_config = SettingsConfigDict(
        frozen=True,
        extra="forbid",
        strict=True,
        validate_default=True,
        # a ValidationError of AgentSettings(...) in code would show each refused value as it
        # is, the password of a URL too; load() words its errors itself
        hide_input_in_errors=True,
    )

    provider: ProviderName = Field(
        default="openai-compatible",
        description="Which wire protocol to speak: openai-compatible, anthropic or scripted.",
    )
    model: str | None = Field(default=None, description="Model id; unset = provider default.")
    base_url: str | None = Field(default=None, description="API base URL; unset = provider's.")
    request_timeout_secs: int = Field(default=60, ge=1, le=3600)
    max_steps: int = Field(default=10, ge=1, le=1000, description="Tool rounds per run.")
    max_tokens: int = Field(default=32000, ge=1000, le=1_000_000, description="Tokens per run.")
    system_prompt: str | None = None
    prompt_caching: bool = Field(default=True, description="Anthropic cache breakpoints.")
    max_run_secs: int | None = Field(default=None, ge=1, le=86400, description="Wall clock.")
    max_cost_usd: float | None = Field(
        default=None, gt=0, description="USD per run; every call must be priced (prices)."
    )
    budget_session_usd: float | None = Field(
        default=None, gt=0, description="USD the runs of one session may spend together."
    )
    budget_scope_usd: float | None = Field(
        default=None, gt=0, description="USD the runs of one memory scope may spend together."
    )
    budget_day_usd: float | None = Field(
        default=None, gt=0, description="USD all runs may spend in one UTC day."
    )
    budget_warn_fraction: float | None = Field(
        default=0.8, gt=0, lt=1, description="A budget_warning event at this share of a window."
    )
    budget_on_exhausted: Literal["wrap_up", "stop"] = Field(
        default="wrap_up",
        description="A window without room: one wrap-up call, or stop (budget_exhausted).",
    )
    startup_wait_secs: int = Field(
        default=30,
        ge=0,
        le=3600,
        description="How long an app or worker starting up waits for its database (and a "
        "worker for Redis) before it exits with an error.",
    )
    redis_url: str = "redis://127.0.0.1:6379/0"
    database_url: str = "sqlite+aiosqlite:///./agent.db"
    database_pool_size: int = Field(
        default=10, ge=1, le=1000, description="PostgreSQL connections kept open per process."
    )
    database_max_overflow: int = Field(
        default=10, ge=0, le=1000, description="More PostgreSQL connections opened at a peak."
    )
    database_pool_timeout_secs: int = Field(
        default=30, ge=1, le=3600, description="Wait for a free pooled connection, then 503."
    )
    route_prefix: str = "/agent"
    health_path: str = "/health"
    session_lock: SessionLockPolicy = Field(
        default="queue",
        description="A background run for a busy session: wait its turn (queue) or 409 (reject).",
    )
    max_request_bytes: int = Field(
        default=1_048_576,
        ge=1024,
        le=1 << 30,
        description="The largest request body an agent route reads (413 beyond it).",
    )
    model_client: str | None = Field(
        default=None,
        description="Import path (module:name) of an LlmClient, or of a function of the "
        "settings that makes one; replaces the provider (tests script app and worker alike).",
    )
    endpoint: dict[str, Any] = Field(
        default_factory=dict,
        description="[agent.endpoint]: what the OpenAI-compatible endpoint accepts, over the "
        "profile its host is known by (name = a known profile to start from instead).",
    )
    mcp_servers: list[dict[str, Any]] = Field(
        default_factory=list,
        description="[[agent.mcp_servers]] tables: MCP servers whose tools the agent gets "
        "(checked at startup by agent_plugin.mcp.configured_servers).",
    )
    fallback_models: list[str] = Field(
        default_factory=list,
        description="Models of the same provider tried in turn when the model is unavailable, "
        "still rate limited after retries, or the conversation is too long for it.",
    )
    trace_content: bool = Field(
        default=False,
        description="Put messages and tool arguments and results (redacted) on OpenTelemetry "
        "spans (also OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true).",
    )
    prices: dict[str, dict[str, float]] = Field(
        default_factory=dict,
        description='[agent.prices."<model>"]: USD per million tokens (input, output, '
        "cache_read, cache_write) over the genai-prices table.",
    )
    pacing_rpm: int | None = Field(
        default=None, ge=1, description="Model calls per minute per model, across the fleet."
    )
    pacing_tpm: int | None = Field(
        default=None, ge=1, description="Tokens per minute per model, across the fleet."
    )
    pacing: dict[str, dict[str, int]] = Field(
        default_factory=dict,
        description='[agent.pacing."<model>"]: rpm and tpm of one model, replacing '
        "pacing_rpm and pacing_tpm for it.",
    )

    @field_validator("fallback_models")
    @classmethod
    def _check_fallback_models(cls, value: list[str]) -> list[str]:
        names = [name.strip() for name in value]
        if any(not name for name in names):
            raise ValueError("model names must not be blank")
        return names

    @field_validator("prices")
    @classmethod
    def _check_prices(cls, value: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
        from agent_plugin.pricing import ModelPrice

        for model, table in value.items():
            try:
                ModelPrice.of(model, table)
            except AgentError as error:
                raise ValueError(error.message) from None
        return value

    @field_validator("pacing")
    @classmethod
    def _check_pacing(cls, value: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
        from agent_plugin.pacing import PacingConfig

        try:
            PacingConfig.of(None, None, value)
        except AgentError as error:
            raise ValueError(error.message) from None
        return value

    def pacing_config(self) -> PacingConfig:
        """The pacing limits these settings describe (:mod:`agent_plugin.pacing`)."""
        from agent_plugin.pacing import PacingConfig

        return PacingConfig.of(self.pacing_rpm, self.pacing_tpm, self.pacing)

    @field_validator("provider", mode="before")
    @classmethod
    def _normalise_provider(cls, value: object) -> object:
        if isinstance(value, str):
            name = _provider_or_none(value)
            if name is None:
                raise ValueError(f"unknown provider {value!r}; accepted: {_ACCEPTED_PROVIDERS}")
            return name
        raise ValueError(f"must be a string; accepted: {_ACCEPTED_PROVIDERS}")

    @field_validator("model")
    @classmethod
    def _check_model(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value.strip():
            raise ValueError("must not be blank")
        return value.strip()

    @field_validator("base_url")
    @classmethod
    def _check_base_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        value = value.strip()
        parts = _split(value)
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"must be an http:// or https:// URL, got {_shown(value)!r}")
        return value

    @field_validator("redis_url")
    @classmethod
    def _check_redis_url(cls, value: str) -> str:
        value = value.strip()
        parts = _split(value)
        if parts is None or parts.scheme not in ("redis", "rediss", "unix"):
            raise ValueError(f"must be a redis://, rediss:// or unix:// URL, got {_shown(value)!r}")
        return value

    @field_validator("database_url")
    @classmethod
    def _check_database_url(cls, value: str) -> str:
        value = value.strip()
        if not _URL_SCHEME.match(value) or _split(value) is None:
            raise ValueError(
                f"must be an SQLAlchemy URL like dialect+driver://..., got {_shown(value)!r}"
            )
        return value

    @field_validator("session_lock", mode="before")
    @classmethod
    def _normalise_session_lock(cls, value: object) -> object:
        if isinstance(value, str) and value.strip().lower() in ("queue", "reject"):
            return value.strip().lower()
        raise ValueError(f"must be queue or reject, got {value!r}")

    @field_validator("model_client")
    @classmethod
    def _check_import_path(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not _IMPORT_PATH.fullmatch(value):
            raise ValueError(f"must read package.module:name, got {value!r}")
        return value

    @field_validator("route_prefix", "health_path")
    @classmethod
    def _check_path(cls, value: str) -> str:
        if (
            not value.startswith("/")
            or value.endswith("/")
            or any(ch.isspace() or ch in "?#" for ch in value)
        ):
            raise ValueError(
                "must start with '/', not end with '/' and hold no spaces, '?' or '#', "
                f"got {value!r}"
            )
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Code (init arguments) > ``AGENT_*`` > profile overlay > ``agent.toml`` > defaults."""
        context = _CONTEXT.get() or _LoadContext()
        if context.layer_only:
            return (init_settings,)
        variables = context.variables or _Variables.read(None)
        path, named_by = _config_path(variables, context.config_file)
        sources: list[PydanticBaseSettingsSource] = [
            init_settings,
            _EnvSource(settings_cls, variables),
        ]
        profile = _profile(variables)
        if profile is not None:
            overlay = path.with_name(f"{path.stem}.{profile}{path.suffix}")
            named = f"{PROFILE_ENV}={profile!r}"
            sources.append(_TomlTableSource(settings_cls, overlay, named_by=named))
        sources.append(_TomlTableSource(settings_cls, path, named_by=named_by))
        return tuple(sources)

    @classmethod
    def load(
        cls,
        overrides: Mapping[str, Any] | None = None,
        *,
        environ: Mapping[str, str] | None = None,
        config_file: str | Path | None = None,
    ) -> AgentSettings:
        """Read the file, the profile overlay and the variables, then apply ``overrides``.

        ``environ`` replaces ``os.environ`` (tests pass a dict; the ``.env`` file and the secrets
        directory are still read, as ``environ`` names them); ``config_file`` replaces
        ``AGENT_CONFIG_FILE``. Every key of ``overrides`` wins over the loaded value, even when
        it equals the default. Raises a ``config`` :class:`AgentError` naming the file and key,
        the environment variable or the override, and the accepted values.
        """
        values = dict(overrides or {})
        _check_keys(
            values,
            lambda key: f"code override {key!r}",
            fix=f"set {API_KEY_ENV}, or pass api_key= to create_client",
        )
        _validate_layer(values, lambda key: f"code override {key!r}")
        variables = _Variables.read(environ)
        token = _CONTEXT.set(_LoadContext(variables=variables, config_file=config_file))
        try:
            return cls(**values)
        except ValidationError as error:
            raise AgentError.config(_describe(error, lambda key: f"setting {key!r}")) from None
        finally:
            _CONTEXT.reset(token)

    def resolved_model(self) -> str:
        """The configured model, or the provider's default."""
        return self.model or _DEFAULT_MODEL[self.provider]

    def resolved_base_url(self) -> str:
        """The configured base URL, or the provider's default (``""`` for ``scripted``)."""
        if self.provider == "scripted":
            return ""
        return self.base_url or _DEFAULT_BASE_URL[self.provider]

    def api_key(self, environ: Mapping[str, str] | None = None) -> str | None:
        """``AGENT_API_KEY``, trimmed; blank is ``None``.

        Read like every variable: from ``environ`` (default ``os.environ``), else the ``.env``
        file, else the secrets directory. The key is never a field, so it stays out of ``repr``
        and ``model_dump``.
        """
        key = (_Variables.read(environ).get(API_KEY_ENV) or "").strip()
        return key or None

    def key_required(self) -> bool:
        """Whether the provider's host refuses requests without a key (public OpenAI/Anthropic)."""
        if self.provider == "scripted":
            return False
        parts = _split(self.resolved_base_url())
        return parts is not None and parts.hostname in _KEYED_HOSTS

    def require_api_key(self, environ: Mapping[str, str] | None = None) -> str | None:
        """The API key, or a ``config`` error when the public OpenAI/Anthropic host needs one.

        Other base URLs (Ollama, vLLM, llama.cpp) and the scripted provider may run without one,
        so ``None`` is returned for them when ``AGENT_API_KEY`` is unset.
        """
        key = self.api_key(environ)
        if key is None and self.key_required():
            host = _split(self.resolved_base_url())
            raise AgentError.config(
                f"{API_KEY_ENV} is not set; the {self.provider} provider at "
                f"{host.hostname if host else self.resolved_base_url()} needs an API key. "
                f"Set {API_KEY_ENV} in the environment, the .env file or the secrets directory "
                "(never in agent.toml), or point base_url at a server that needs none."
            )
        return key

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        for name, value in super().__repr_args__():
            if name in _SECRET_URL_FIELDS and isinstance(value, str):
                yield name, mask_url(value)
            else:
                yield name, value


_FIELDS: Final = tuple(AgentSettings.model_fields)
_VARIABLES: Final = (
    *(f"{ENV_PREFIX}{name.upper()}" for name in _FIELDS),
    API_KEY_ENV,
    CONFIG_FILE_ENV,
    PROFILE_ENV,
)
"""Every variable a secrets directory may hold (not ``AGENT_ENV_FILE`` or ``AGENT_SECRETS_DIR``,
which name the files: the first is read from the environment only, the second also from
``.env``)."""


def _split(url: str) -> SplitResult | None:
    """``urlsplit(url)`` with its port checked, or ``None`` when ``url`` does not parse."""
    try:
        parts = urlsplit(url)
        _ = parts.port
    except ValueError:
        return None
    return parts


def config_sources(
    environ: Mapping[str, str] | None = None, config_file: str | Path | None = None
) -> str:
    """Where settings loaded with ``environ`` and ``config_file`` come from, for a start-up
    log line: the config file (or that there is none), the profile overlay, and the names (never
    the values) of the ``AGENT_*`` variables that are set, by where each came from."""
    variables = _Variables.read(environ)
    path, _named_by = _config_path(variables, config_file)
    parts = [f"{path} (absent: defaults)" if not path.is_file() else str(path)]
    profile = (variables.get(PROFILE_ENV) or "").strip()
    if profile:
        parts.append(f"overlay {path.with_name(f'{path.stem}.{profile}{path.suffix}')}")
    by_layer: dict[str, list[str]] = {}
    for name in sorted(variables.values):
        if name != CONFIG_FILE_ENV:
            by_layer.setdefault(variables.layers[name], []).append(name)
    parts.extend(f"{layer} {', '.join(names)}" for layer, names in by_layer.items())
    return " + ".join(parts)


def _config_path(variables: _Variables, config_file: str | Path | None) -> tuple[Path, str | None]:
    """The config file, and who named it (a named file must exist; the default may be absent)."""
    if config_file is not None:
        return Path(config_file), "the config_file argument"
    named = (variables.get(CONFIG_FILE_ENV) or "").strip()
    if named:
        return Path(named), variables.where(CONFIG_FILE_ENV)
    return Path(DEFAULT_CONFIG_FILE), None


def _profile(variables: _Variables) -> str | None:
    profile = (variables.get(PROFILE_ENV) or "").strip()
    if not profile:
        return None
    if not _PROFILE_NAME.fullmatch(profile) or ".." in profile:
        raise AgentError.config(
            f"{variables.where(PROFILE_ENV)}={profile!r} is not a valid profile name; accepted: "
            "letters, digits, "
            "'-', '_' and '.', such as prod or staging"
        )
    return profile


def _check_keys(values: Mapping[str, Any], where: Callable[[str], str], *, fix: str) -> None:
    """Refuse ``api_key`` first, then unknown keys, with a suggestion and the accepted keys."""
    for key in values:
        if key.replace("-", "_").lower() == "api_key":
            raise AgentError.config(
                f"{where(key)}: the API key is read from the environment variable {API_KEY_ENV} "
                f"only; {fix}"
            )
    for key in values:
        if key not in _FIELDS:
            close = difflib.get_close_matches(key.replace("-", "_"), _FIELDS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise AgentError.config(
                f"{where(key)}: unknown key{hint}; accepted keys: {', '.join(_FIELDS)}"
            )


def _validate_layer(values: Mapping[str, Any], where: Callable[[str], str]) -> None:
    """Validate one layer's values alone, so an error can name where they came from."""
    token = _CONTEXT.set(_LoadContext(layer_only=True))
    try:
        AgentSettings.model_validate(values)
    except ValidationError as error:
        raise AgentError.config(_describe(error, where)) from None
    finally:
        _CONTEXT.reset(token)


def _describe(error: ValidationError, where: Callable[[str], str]) -> str:
    problems = []
    for item in error.errors(include_url=False):
        field = str(item["loc"][0]) if item["loc"] else "settings"
        message = str(item["msg"]).removeprefix("Value error, ")
        if field not in _SECRET_URL_FIELDS and ", got " not in message:
            message += f", got {item['input']!r}"
        accepted = _ACCEPTED.get(field)
        already_listed = field == "provider" and "accepted:" in message
        suffix = f" (accepted: {accepted})" if accepted and not already_listed else ""
        problems.append(f"{where(field)}: {message}{suffix}")
    return "; ".join(problems)


class _TomlTableSource(PydanticBaseSettingsSource):
    """The ``[agent]`` table of one TOML file, checked and validated on its own."""

    def __init__(
        self, settings_cls: type[BaseSettings], path: Path, *, named_by: str | None
    ) -> None:
        super().__init__(settings_cls)
        self.path = path
        self.named_by = named_by
        """Who asked for this file; ``None`` for the default file, which may be absent."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        """Unused: :meth:`__call__` reads the whole table at once."""
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        table = self._table()
        where = self._where
        _check_keys(table, where, fix=f"remove it from the file and set {API_KEY_ENV} instead")
        for name in _SECRET_URL_FIELDS:
            value = table.get(name)
            if isinstance(value, str) and _has_password(value):
                env = f"{ENV_PREFIX}{name.upper()}"
                raise AgentError.config(
                    f"{where(name)}: the URL carries a password, and secrets are accepted from "
                    f"the environment only; set {env} instead (the file may keep a URL without "
                    "the password)"
                )
        _validate_layer(table, where)
        return table

    def _where(self, key: str) -> str:
        return f"{key!r} in [{TABLE}] of {self.path}"

    def _table(self) -> dict[str, Any]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            if self.named_by is not None:
                raise AgentError.config(
                    f"config file {self.path} does not exist (named by {self.named_by})"
                ) from None
            return {}
        except (OSError, UnicodeDecodeError) as error:
            raise AgentError.config(f"cannot read config file {self.path}: {error}") from None
        try:
            document = tomllib.loads(text)
        except tomllib.TOMLDecodeError as error:
            raise AgentError.config(f"config file {self.path} is not valid TOML: {error}") from None
        table = document.get(TABLE)
        if table is None:
            return {}
        if not isinstance(table, dict):
            raise AgentError.config(
                f"[{TABLE}] in {self.path} must be a table, got a value of type "
                f"{type(table).__name__} "
                f"(write the keys under an [{TABLE}] header)"
            )
        return table


class _Variables:
    """The ``AGENT_*`` variables a load reads, each with the layer it came from.

    Strongest first: the process environment (or the ``environ`` given), the ``.env`` file,
    the secrets directory. Both files are read with pydantic-settings' own sources
    (:class:`~pydantic_settings.DotEnvSettingsSource`, and the file lookup of
    :class:`~pydantic_settings.SecretsSettingsSource`); a blank value counts as unset.
    """

    ENVIRONMENT: Final = "environment"

    def __init__(self, values: Mapping[str, str], layers: Mapping[str, str]) -> None:
        self.values = dict(values)
        self.layers = dict(layers)
        """Each variable's layer: ``environment``, ``.env file <p>`` or ``secrets dir <p>``."""

    @classmethod
    def read(cls, environ: Mapping[str, str] | None) -> _Variables:
        base = {
            name: value
            for name, value in (os.environ if environ is None else environ).items()
            if name.startswith(ENV_PREFIX) and value != ""
        }
        dotenv, dotenv_layer = _read_env_file(base)
        secrets_dir = base.get(SECRETS_DIR_ENV) or dotenv.get(SECRETS_DIR_ENV)
        named_by = cls.ENVIRONMENT if SECRETS_DIR_ENV in base else dotenv_layer
        secrets, secrets_layer = _read_secrets_dir(secrets_dir, named_by)
        values: dict[str, str] = {}
        layers: dict[str, str] = {}
        weakest_first = ((secrets_layer, secrets), (dotenv_layer, dotenv), (cls.ENVIRONMENT, base))
        for layer, found in weakest_first:
            for name, value in found.items():
                values[name] = value
                layers[name] = layer
        return cls(values, layers)

    def get(self, name: str) -> str | None:
        return self.values.get(name)

    def where(self, name: str) -> str:
        """``name`` as an error message names it: the variable, and its file when not the
        process environment."""
        layer = self.layers.get(name, self.ENVIRONMENT)
        return name if layer == self.ENVIRONMENT else f"{name} in {layer}"


def _read_env_file(base: Mapping[str, str]) -> tuple[dict[str, str], str]:
    """The ``AGENT_*`` values of the ``.env`` file ``base`` names (default ``./.env``, which may
    be absent; a named file must exist), and the file's layer name."""
    named = base.get(ENV_FILE_ENV, "").strip()
    path = Path(named or DEFAULT_ENV_FILE).expanduser()
    layer = f".env file {path}"
    if not path.is_file():
        if named:
            raise AgentError.config(f"env file {path} does not exist (named by {ENV_FILE_ENV})")
        return {}, layer
    source = DotEnvSettingsSource(
        AgentSettings, env_file=path, env_prefix=ENV_PREFIX, case_sensitive=True
    )
    try:
        found = source.env_vars
    except (OSError, UnicodeDecodeError) as error:
        raise AgentError.config(f"cannot read env file {path}: {error}") from None
    values = {
        name: value
        for name, value in found.items()
        if name.startswith(ENV_PREFIX) and value and name != ENV_FILE_ENV
    }
    return values, layer


def _read_secrets_dir(named: str | None, named_by: str) -> tuple[dict[str, str], str]:
    """One value per file of the secrets directory that is named after an ``AGENT_*`` variable
    (case-insensitive, content trimmed, as pydantic-settings reads Docker and Kubernetes
    secrets), and the directory's layer name."""
    if not named or not named.strip():
        return {}, "secrets dir"
    path = Path(named.strip()).expanduser()
    layer = f"secrets dir {path}"
    if not path.is_dir():
        what = "is not a directory" if path.exists() else "does not exist"
        raise AgentError.config(
            f"secrets dir {path} {what} (named by {SECRETS_DIR_ENV} in the {named_by})"
        )
    values: dict[str, str] = {}
    for name in _VARIABLES:
        found = SecretsSettingsSource.find_case_path(path, name, case_sensitive=False)
        if found is None or not found.is_file():
            continue
        try:
            value = found.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as error:
            raise AgentError.config(f"cannot read secret file {found}: {error}") from None
        if value:
            values[name] = value
    return values, layer


class _EnvSource(PydanticBaseSettingsSource):
    """``AGENT_<FIELD>`` variables, parsed and validated with errors that name the variable
    and, when it came from a file, the file."""

    def __init__(self, settings_cls: type[BaseSettings], variables: _Variables) -> None:
        super().__init__(settings_cls)
        self.variables = variables

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        """Unused: :meth:`__call__` reads every variable at once."""
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        values: dict[str, Any] = {}
        where = self.variables.where
        for name in _FIELDS:
            raw = self.variables.get(_variable(name))
            if raw is None:
                continue
            values[name] = _parse_env(name, where(_variable(name)), raw)
        _validate_layer(values, lambda name: where(_variable(name)))
        return values


def _variable(name: str) -> str:
    return f"{ENV_PREFIX}{name.upper()}"


def _parse_env(name: str, variable: str, raw: str) -> Any:
    text = raw.strip()
    if name in _INT_FIELDS:
        if not text.isascii() or not text.isdigit():
            raise AgentError.config(
                f"{variable} must be a whole number, got {raw!r} (accepted: {_ACCEPTED[name]})"
            )
        return int(text)
    if name in _FLOAT_FIELDS:
        try:
            return float(text)
        except ValueError:
            raise AgentError.config(
                f"{variable} must be a number, got {raw!r} (accepted: {_ACCEPTED[name]})"
            ) from None
    if name in _BOOL_FIELDS:
        word = text.lower()
        if word in _TRUE:
            return True
        if word in _FALSE:
            return False
        raise AgentError.config(
            f"{variable} must be a boolean, got {raw!r} (accepted: 1/true/yes/on or 0/false/no/off)"
        )
    return raw

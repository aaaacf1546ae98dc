"""The runtime: what an app or a worker runs agents with, and how it is opened.

:class:`RuntimeSpec` is what the app configured (tools, hooks, policy, stores, the always-on
parts); :func:`open_runtime` turns it and the loaded settings into an :class:`AgentRuntime`
(provider client, database, stores) and :meth:`AgentRuntime.agent_for` turns a run's
:class:`~agent_plugin.options.AgentOverrides` (and output type) into an agent. Nothing here
knows FastAPI or arq: the web plugin and the worker open the same runtime.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, TypeAlias

from agent_plugin.agent import Agent
from agent_plugin.compaction import Compaction
from agent_plugin.config import AgentSettings
from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.hooks import AgentHooks
from agent_plugin.ids import DEFAULT_SCOPE
from agent_plugin.memory import MemoryStore
from agent_plugin.options import DEFAULT_OVERRIDES, AgentOverrides
from agent_plugin.outages import waiting_for_services
from agent_plugin.output import Output, OutputType
from agent_plugin.policy import AllowAll, Strictest, ToolPolicy, ToolRules
from agent_plugin.pricing import ModelPrice, Prices
from agent_plugin.proactive import (
    Delivery,
    Enqueue,
    FollowupPlan,
    FollowupTool,
    Heartbeat,
    LogDelivery,
)
from agent_plugin.providers.base import LlmClient
from agent_plugin.redaction import mask_url, register_secret, unregister_secret, url_password
from agent_plugin.sessions import SessionStore
from agent_plugin.skills import Skill, load_skills
from agent_plugin.spend import BudgetWindows, LocalLedger, SpendLedger
from agent_plugin.telemetry import Telemetry
from agent_plugin.tools import Tool, ToolRegistry
from agent_plugin.toolsets import (
    LiveToolset,
    Toolset,
    close_toolsets,
    gather_tools,
    start_toolsets,
)

if TYPE_CHECKING:
    import httpx

    from agent_plugin.pacing import Pacer, PacingConfig
    from agent_plugin.storage import Database, SqlRunStore

__all__ = ["AgentRuntime", "ModelFactory", "RuntimeSpec", "check_always_on", "open_runtime"]

logger = logging.getLogger("agent_plugin")

ModelFactory: TypeAlias = Callable[[AgentSettings], LlmClient | None]
"""Builds the model from the loaded settings; ``None`` means "build the configured provider"."""

_MIN_FOLLOWUP: Final = timedelta(minutes=1)
_CACHED_AGENTS: Final = 16
_NO_OUTPUTS: Final[Mapping[str, Output[Any]]] = {}


class AgentRuntime:
    """What runs agents in one process (an app or a worker): settings, the provider client,
    the tools, hooks, policy and stores, and the always-on parts.

    ``delivery`` receives the reports of background runs with delivery on; ``heartbeat`` is
    what the workers tick; ``followups`` (the longest delay) gives every agent the
    ``schedule_followup`` tool; ``runs`` holds the background runs' records (``None`` when
    background runs are off); ``toolsets`` are the started toolsets (MCP servers), whose
    current tools every agent gets; ``outputs`` are the output types a run may name (see
    :meth:`output_named`). :meth:`aclose` closes what the runtime opened.
    """

    def __init__(
        self,
        *,
        settings: AgentSettings,
        client: LlmClient,
        session_store: SessionStore,
        tools: Iterable[Tool] = (),
        hooks: Sequence[AgentHooks] = (),
        policy: ToolPolicy | None = None,
        memory_store: MemoryStore | None = None,
        skills: Sequence[Skill] = (),
        compaction: Compaction | None = None,
        delivery: Delivery | None = None,
        heartbeat: Heartbeat | None = None,
        followups: timedelta | None = None,
        database: Database | None = None,
        runs: SqlRunStore | None = None,
        toolsets: Sequence[LiveToolset] = (),
        outputs: Mapping[str, Output[Any]] = _NO_OUTPUTS,
        owns_client: bool = False,
        telemetry: Telemetry | None = None,
        pacer: Pacer | None = None,
        ledger: SpendLedger | None = None,
    ) -> None:
        self.settings = settings
        self.pacer = pacer
        """Holds every agent's model calls under the pacing limits (None: no pacing)."""
        self.windows = windows_of(settings)
        """The spending windows every agent's runs share (``[agent] budget_*``)."""
        if ledger is None and self.windows.any:
            ledger = LocalLedger()
        self.ledger = ledger
        """Where the windows' totals live (default: this process, shared by its agents)."""
        self.telemetry = telemetry if telemetry is not None else telemetry_of(settings)
        """Spans, metrics and prices of every agent the runtime builds."""
        self.outputs: Mapping[str, Output[Any]] = dict(outputs)
        self.client = client
        self.tools = ToolRegistry(tools)
        self.hooks = tuple(hooks)
        self.policy: ToolPolicy = policy if policy is not None else AllowAll()
        self.session_store = session_store
        self.memory_store = memory_store
        self.skills = tuple(skills)
        self.compaction = compaction
        self.delivery: Delivery = delivery if delivery is not None else LogDelivery()
        self.heartbeat = heartbeat
        self.followups = followups
        self.database = database
        self.runs = runs
        self.toolsets = tuple(toolsets)
        self._owns_client = owns_client
        self._secrets: list[str] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._agents: dict[tuple[AgentOverrides, Enqueue | None, object], Agent[Any]] = {}
        self._revisions: tuple[int, ...] = tuple(t.revision for t in self.toolsets)
        self._built_in: list[str] | None = None

    def __repr__(self) -> str:
        return (
            f"AgentRuntime(provider={self.settings.provider!r}, "
            f"model={self.settings.resolved_model()!r}, tools={self.tools.names()!r})"
        )

    def agent_for(
        self,
        overrides: AgentOverrides = DEFAULT_OVERRIDES,
        *,
        book_followup: Enqueue | None = None,
        output: OutputType[Any] | Output[Any] | None = None,
    ) -> Agent[Any]:
        """The app's agent with a run's ``overrides``.

        ``max_steps``, ``max_tokens``, ``system_prompt`` and ``max_run_secs`` come from the
        settings unless overridden; tools, hooks, policy, skills, compaction and the memory
        store from the runtime. ``read_only`` adds :meth:`ToolRules.read_only
        <agent_plugin.policy.ToolRules.read_only>` to the policy. With ``followups`` the agent
        gets the ``schedule_followup`` tool, which books through ``book_followup`` (without
        one it tells the model that nothing can run later). The agent produces ``output`` (a
        type or an :class:`~agent_plugin.output.Output`), or the registered output that
        ``overrides.output`` names, or text. Agents keep no per-run state, so one is built per
        set of overrides and output and reused, until a toolset's tools change.
        """
        if output is not None and overrides.output is not None:
            raise AgentError.config(
                f"a run names the output {overrides.output!r}: give it no output type besides"
            )
        if overrides.output is not None:
            output = self.output_named(overrides.output)
        revisions = tuple(toolset.revision for toolset in self.toolsets)
        if revisions != self._revisions:
            self._agents.clear()
            self._revisions = revisions
        key = (overrides, book_followup, _output_key(output))
        agent = self._agents.get(key)
        if agent is None:
            agent = self._build(overrides, book_followup, output)
            if len(self._agents) >= _CACHED_AGENTS:
                self._agents.pop(next(iter(self._agents)))
            self._agents[key] = agent
        return agent

    def _own_tools(self, overrides: AgentOverrides, book_followup: Enqueue | None) -> list[Tool]:
        tools: list[Tool] = list(self.tools)
        if self.followups is not None:
            tools.append(
                FollowupTool(
                    book_followup or _no_followups,
                    max_delay=self.followups,
                    depth=overrides.followup_depth,
                    session=overrides.session,
                    memory_scope=overrides.memory_scope or DEFAULT_SCOPE,
                )
            )
        return tools

    def _with_toolsets(self, tools: list[Tool], *, strict: bool) -> list[Tool]:
        """``tools`` and the toolsets' current tools (see :func:`gather_tools`)."""
        if not self.toolsets:
            return tools
        if self._built_in is None:  # the names the agent adds itself (memory, load_skill)
            bare = Agent(self.client, memory=self.memory_store, skills=self.skills)
            self._built_in = bare.tools.names()
        return gather_tools(tools, self.toolsets, reserved=self._built_in, strict=strict)

    def check_tool_names(self) -> None:
        """Raise a ``config`` error when a toolset's tool has the name of another tool."""
        self._with_toolsets(self._own_tools(DEFAULT_OVERRIDES, None), strict=True)

    def output_named(self, name: str) -> Output[Any]:
        """The output type registered as ``name``; an ``invalid`` error names the registered
        ones for an unknown name."""
        found = self.outputs.get(name)
        if found is None:
            known = ", ".join(sorted(self.outputs)) or "none are registered"
            raise AgentError(ErrorKind.INVALID, f"no output type is named {name!r} ({known})")
        return found

    def _build(
        self,
        overrides: AgentOverrides,
        book_followup: Enqueue | None,
        output: OutputType[Any] | Output[Any] | None = None,
    ) -> Agent[Any]:
        settings = self.settings
        scope = overrides.memory_scope or DEFAULT_SCOPE
        tools = self._with_toolsets(self._own_tools(overrides, book_followup), strict=False)
        policy = self.policy
        if overrides.read_only:
            policy = Strictest([policy, ToolRules.read_only()])
        system_prompt = overrides.system_prompt
        max_steps = overrides.max_steps
        return Agent(
            self.client,
            tools=tools,
            system_prompt=system_prompt if system_prompt is not None else settings.system_prompt,
            max_steps=max_steps if max_steps is not None else settings.max_steps,
            max_tokens=settings.max_tokens,
            max_cost_usd=settings.max_cost_usd,
            hooks=self.hooks,
            policy=policy,
            max_duration=settings.max_run_secs,
            memory=self.memory_store,
            memory_scope=scope,
            skills=self.skills,
            compaction=self.compaction,
            output_type=output,
            telemetry=self.telemetry,
            pacer=self.pacer,
            budget_windows=self.windows,
            spend_ledger=self.ledger,
        )

    def register_secrets(self, values: Iterable[str | None]) -> None:
        """Redact ``values`` by value everywhere (events, records, logs, errors) while the
        runtime is open; a value too short to redact safely is logged and skipped."""
        for value in values:
            if value is None:
                continue
            if register_secret(value):
                self._secrets.append(value)
            else:
                logger.warning(
                    "a configured secret of %d characters is too short to redact by value",
                    len(value),
                )

    def describe(self) -> str:
        """One line for logs: provider, model, where the model is and where the data lives,
        passwords masked."""
        settings = self.settings
        parts = [
            f"provider={settings.provider}",
            f"model={settings.resolved_model()}",
        ]
        if settings.provider != "scripted":
            parts.append(f"base_url={mask_url(settings.resolved_base_url())}")
        if self.database is not None:
            parts.append(f"database={self.database.display_url}")
        if self.runs is not None:
            parts.append(f"redis={mask_url(settings.redis_url)}")
        return " ".join(parts)

    def tool_names(self) -> list[str]:
        """The names of the tools an agent of this runtime offers the model, sorted."""
        return self.agent_for().tools.names()

    def spawn(self, work: Awaitable[Any]) -> asyncio.Task[Any]:
        """Run ``work`` in a task the runtime tracks and cancels at shutdown."""
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def aclose(self) -> None:
        """Cancel tracked tasks, close the toolsets and the delivery (when it has an
        ``aclose``), dispose the database and close the client the runtime built."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        try:
            await close_toolsets(self.toolsets)
            await _close_delivery(self.delivery)
            if self.database is not None:
                await self.database.dispose()
            if self.pacer is not None:
                await self.pacer.aclose()
        finally:
            try:
                if self._owns_client:
                    await self.client.aclose()
                close = getattr(self.ledger, "aclose", None)
                if close is not None:
                    await close()
            finally:
                for value in self._secrets:
                    unregister_secret(value)
                self._secrets.clear()


def _output_key(output: OutputType[Any] | Output[Any] | None) -> object:
    """What tells agents of different outputs apart in the cache: the type itself (a list of
    types as a tuple), or the :class:`Output`."""
    return tuple(output) if isinstance(output, list) else output


async def _no_followups(_plan: FollowupPlan) -> str:
    raise AgentError(
        ErrorKind.UNAVAILABLE,
        "background runs are off for this plugin, so nothing can run later",
    )


async def _close_delivery(delivery: Delivery) -> None:
    close = getattr(delivery, "aclose", None)
    if not callable(close):
        return
    try:
        await close()
    except Exception as error:  # closing must not stop the rest of the shutdown
        logger.warning("closing the delivery %r failed: %s", delivery, error)


# --- opening a runtime ----------------------------------------------------------------------


@dataclass(frozen=True)
class RuntimeSpec:
    """What an app configured its agent with; :func:`open_runtime` opens a runtime from it.

    ``model`` is a client to use as it is (not closed by the runtime) or a
    :data:`ModelFactory`; ``http_transport`` makes the configured provider's transport.
    ``session_store`` ``None`` and ``memory_store="sql"`` use the SQL stores on
    ``database_url``; ``skill_folders`` are read at opening. ``run_records``: open the run
    store (background runs are on); ``pool_size`` replaces the settings'
    ``database_pool_size``.
    ``auto_migrate`` ``None``: migrate SQLite, only check PostgreSQL. ``toolsets`` (MCP
    servers) are started at opening, with those of the settings' ``mcp_servers``.
    ``secrets``: values the app wants redacted by value, beside the configured key and
    URL passwords. ``outputs``: the output types a run may name, by name.
    ``pacing``: limits replacing the settings' pacing keys. ``key_prefix``: the prefix of the
    plugin's Redis keys when its runs share Redis (background runs are on): pacing and the
    spending windows then hold across the fleet there (``None``: in this process only).
    """

    tools: tuple[Tool, ...] = ()
    toolsets: tuple[Toolset, ...] = ()
    hooks: tuple[AgentHooks, ...] = ()
    policy: ToolPolicy | None = None
    model: LlmClient | ModelFactory | None = None
    http_transport: Callable[[], httpx.AsyncBaseTransport] | None = None
    session_store: SessionStore | None = None
    memory_store: MemoryStore | Literal["sql"] | None = None
    skills: tuple[Skill, ...] = ()
    skill_folders: tuple[Path, ...] = ()
    compaction: Compaction | None = None
    delivery: Delivery | None = None
    heartbeat: Heartbeat | None = None
    followups: timedelta | None = None
    run_records: bool = False
    pool_size: int | None = None
    auto_migrate: bool | None = None
    secrets: tuple[str, ...] = field(default=(), repr=False)
    environ: dict[str, str] | None = field(default=None, repr=False)
    outputs: Mapping[str, Output[Any]] = field(default_factory=dict)
    pacing: PacingConfig | None = None
    key_prefix: str | None = None

    @property
    def needs_database(self) -> bool:
        return self.session_store is None or self.memory_store == "sql" or self.run_records


def windows_of(settings: AgentSettings) -> BudgetWindows:
    """The spending windows the settings configure (``budget_*``)."""
    return BudgetWindows(
        session_usd=settings.budget_session_usd,
        scope_usd=settings.budget_scope_usd,
        day_usd=settings.budget_day_usd,
        warn_fraction=settings.budget_warn_fraction,
        on_exhausted=settings.budget_on_exhausted,
    )


def _ledger_for(settings: AgentSettings, prefix: str | None) -> SpendLedger | None:
    """A ledger in Redis (``redis_url``) under the plugin's key ``prefix`` when the settings
    configure a window: every worker and the app then spend from the same totals (``None``:
    no prefix, the runtime keeps them in this process)."""
    if prefix is None or not windows_of(settings).any:
        return None
    from redis.asyncio import Redis

    from agent_plugin.live.spend import RedisLedger

    return RedisLedger(Redis.from_url(settings.redis_url), prefix=prefix, owns=True)


def check_always_on(spec: RuntimeSpec) -> None:
    """Check ``delivery``, ``heartbeat`` and ``followups``; raise a ``config``
    :class:`AgentError` saying what is wrong.

    The app's and the worker's startup call it, so a misconfigured heartbeat stops the
    process instead of never ticking.
    """
    heartbeat = spec.heartbeat
    if heartbeat is not None:
        if not isinstance(heartbeat, Heartbeat):
            raise AgentError.config(
                "heartbeat must be a Heartbeat, built with Heartbeat.every(timedelta) or "
                f'Heartbeat.cron("<cron expression>"), got {heartbeat!r}'
            )
        try:
            heartbeat.validate()
            heartbeat.cron_fields()
            heartbeat.tzinfo()
        except AgentError as error:
            raise AgentError.config(f"invalid heartbeat: {error.message}") from None
    delivery = spec.delivery
    if delivery is not None and not isinstance(delivery, Delivery):
        raise AgentError.config(
            "delivery must have an async deliver(report) method (LogDelivery, "
            f"WebhookDelivery or your own), got {delivery!r}"
        )
    delay = spec.followups
    if delay is not None and (not isinstance(delay, timedelta) or delay < _MIN_FOLLOWUP):
        raise AgentError.config(
            f"followups needs the longest delay as a timedelta of at least one minute, got "
            f"{delay!r}"
        )
    if not spec.run_records:
        needs = [
            what
            for what, given in (("a heartbeat", heartbeat), ("follow-ups", delay))
            if given is not None
        ]
        if needs:
            verb = "needs" if needs == ["a heartbeat"] else "need"
            raise AgentError.config(
                f"{' and '.join(needs)} {verb} background runs, which are off for this "
                "plugin (jobs=False, or in-memory stores only): pass jobs=True to AgentPlugin"
            )


async def open_runtime(spec: RuntimeSpec, settings: AgentSettings) -> AgentRuntime:
    """Build the runtime: the client, the database (migrated or checked) and the stores.

    Fails with an :class:`AgentError` that names the key, variable or URL (passwords hidden);
    whatever was opened before the failure is closed again.
    """
    check_always_on(spec)
    skills = [*spec.skills]
    for folder in spec.skill_folders:
        skills.extend(load_skills(folder))
    client, owns_client = _client_for(spec, settings)
    if settings.fallback_models:
        from agent_plugin.providers.fallback import FallbackClient, FallbackModel

        models = [FallbackModel(client, name) for name in settings.fallback_models]
        client = FallbackClient([client, *models])
    database: Database | None = None
    toolsets: list[LiveToolset] = []
    try:
        if spec.needs_database:
            database = _database_for(spec, settings)
            prepared = database
            await waiting_for_services(
                f"opening the database {database.display_url}",
                lambda: _prepare(prepared, spec.auto_migrate),
                settings.startup_wait_secs,
            )
        session_store, memory_store = _stores_for(spec, database)
        runs = None
        if spec.run_records and database is not None:
            from agent_plugin.storage import SqlRunStore

            runs = SqlRunStore(database)
        environ = spec.environ if spec.environ is not None else os.environ
        toolsets = await start_toolsets(_toolsets_for(spec, settings), environ)
        runtime = AgentRuntime(
            settings=settings,
            client=client,
            tools=spec.tools,
            hooks=spec.hooks,
            policy=spec.policy,
            session_store=session_store,
            memory_store=memory_store,
            skills=skills,
            compaction=spec.compaction,
            delivery=spec.delivery,
            heartbeat=spec.heartbeat,
            followups=spec.followups,
            database=database,
            runs=runs,
            toolsets=toolsets,
            outputs=spec.outputs,
            owns_client=owns_client,
            pacer=pacer_for(settings, spec.key_prefix, spec.pacing),
            ledger=_ledger_for(settings, spec.key_prefix),
        )
        runtime.check_tool_names()
        runtime.register_secrets(_configured_secrets(spec, settings))
        return runtime
    except BaseException:
        try:
            await close_toolsets(toolsets)
            if database is not None:
                await database.dispose()
        finally:
            if owns_client:
                await client.aclose()
        raise


def _configured_secrets(spec: RuntimeSpec, settings: AgentSettings) -> list[str | None]:
    """The values redacted by value while a runtime is open: the provider's key, the passwords
    of the configured URLs, and the secrets the app named."""
    urls = [settings.base_url, settings.redis_url, settings.database_url]
    return [settings.api_key(spec.environ), *map(url_password, urls), *spec.secrets]


def _toolsets_for(spec: RuntimeSpec, settings: AgentSettings) -> list[Toolset]:
    """The spec's toolsets, then the MCP servers of the settings' ``mcp_servers`` tables."""
    if not settings.mcp_servers:
        return list(spec.toolsets)
    from agent_plugin.mcp import configured_servers

    return [*spec.toolsets, *configured_servers(settings.mcp_servers)]


def pacer_for(
    settings: AgentSettings, key_prefix: str | None, config: PacingConfig | None = None
) -> Pacer | None:
    """The pacer of ``config`` (default: the settings' pacing limits): shared in Redis under
    the plugin's ``key_prefix`` (``pacing:`` added), or in this process without one; ``None``
    when no limit is set."""
    if config is None:
        config = settings.pacing_config()
    if not config.active:
        return None
    if key_prefix is None:
        from agent_plugin.pacing import LocalPacer

        return LocalPacer(config)
    from agent_plugin.live.pacing import RedisPacer

    return RedisPacer.from_url(settings.redis_url, config, prefix=f"{key_prefix}pacing:")


def telemetry_of(settings: AgentSettings) -> Telemetry:
    """The telemetry the settings ask for: contents on spans with ``trace_content`` (or the
    convention's variable), the configured prices over the ``genai-prices`` table."""
    prices = Prices({model: ModelPrice.of(model, t) for model, t in settings.prices.items()})
    return Telemetry(record_content=settings.trace_content or None, prices=prices)


def _client_for(spec: RuntimeSpec, settings: AgentSettings) -> tuple[LlmClient, bool]:
    model = spec.model
    if isinstance(model, LlmClient):
        return model, False
    if model is not None:
        built = model(settings)
        if built is not None:
            return built, True
    if settings.model_client is not None:
        return _imported_client(settings.model_client, settings)
    from agent_plugin.providers.factory import create_client  # httpx: with the first client

    api_key = settings.require_api_key(spec.environ)
    transport = spec.http_transport() if spec.http_transport is not None else None
    return create_client(settings, api_key=api_key, transport=transport), True


def _imported_client(path: str, settings: AgentSettings) -> tuple[LlmClient, bool]:
    """The client ``model_client`` names: a client as it is (not closed here: the module keeps
    it), or what a factory of the settings makes (closed with the runtime)."""
    module_name, _, attribute = path.partition(":")
    where = f"model_client {path!r}"
    try:
        found: object = importlib.import_module(module_name)
    except ImportError as error:
        raise AgentError.config(f"{where}: cannot import {module_name}: {error}") from None
    for name in attribute.split("."):
        try:
            found = getattr(found, name)
        except AttributeError:
            raise AgentError.config(f"{where}: {module_name} has no {attribute}") from None
    if isinstance(found, LlmClient):
        return found, False
    if callable(found):
        built = found(settings)
        if isinstance(built, LlmClient):
            return built, True
        raise AgentError.config(
            f"{where}: the factory returned {type(built).__name__}, not an LlmClient"
        )
    raise AgentError.config(
        f"{where} is a {type(found).__name__}: name an LlmClient (such as a ScriptedModel) "
        "or a function that takes the settings and returns one"
    )


def _database_for(spec: RuntimeSpec, settings: AgentSettings) -> Database:
    from agent_plugin.storage import Database

    try:
        return Database(
            settings.database_url,
            pool_size=spec.pool_size or settings.database_pool_size,
            max_overflow=settings.database_max_overflow,
            pool_timeout=settings.database_pool_timeout_secs,
        )
    except ImportError as error:
        raise AgentError.config(
            f"the database driver {error.name or error} is not installed (for PostgreSQL: "
            "pip install 'fastapi-agent-plugin[postgres]')"
        ) from error


async def _prepare(database: Database, auto_migrate: bool | None) -> None:
    migrate = auto_migrate
    if migrate is None:
        migrate = database.dialect == "sqlite"
    if migrate:
        await database.migrate()
        return
    await database.check()
    current = await database.current_revision()
    newest = _newest_revision()
    if current != newest:
        raise AgentError.config(
            f"the database {database.display_url} is at migration {current or 'none'} and "
            f"this version of the plugin needs {newest}: run `python -m agent_plugin migrate` "
            "with AGENT_DATABASE_URL set to this database (or --database-url), or pass "
            "auto_migrate=True to AgentPlugin"
        )


def _newest_revision() -> str | None:
    """The head revision of the plugin's migration scripts."""
    from alembic.script import ScriptDirectory

    from agent_plugin.storage.migrations import alembic_config

    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def _stores_for(
    spec: RuntimeSpec, database: Database | None
) -> tuple[SessionStore, MemoryStore | None]:
    sessions = spec.session_store
    memory = spec.memory_store
    if database is not None:
        from agent_plugin.storage import SqlMemoryStore, SqlSessionStore

        if sessions is None:
            sessions = SqlSessionStore(database)
        if memory == "sql":
            memory = SqlMemoryStore(database)
    if sessions is None or isinstance(memory, str):  # pragma: no cover - needs_database
        raise AgentError.config("the SQL stores need a database")
    return sessions, memory

"""The FastAPI plugin: :class:`AgentPlugin`, the :data:`AgentHandle` dependency, error mapping.

A few lines give an app an agent::

    from agent_plugin import tool
    from agent_plugin.plugin import AgentHandle, AgentPlugin

    plugin = AgentPlugin(tools=[get_weather])
    app = FastAPI()
    plugin.install(app)

    @app.post("/ask")
    async def ask(prompt: str, agent: AgentHandle) -> dict[str, str]:
        outcome = await agent.run(prompt)
        ...

**Startup** (the app's lifespan) loads the ``[agent]`` settings (``agent.toml``, the profile
overlay, ``AGENT_*`` variables, then :meth:`AgentPlugin.configure` overrides), requires
``AGENT_API_KEY`` for the public OpenAI and Anthropic hosts [AP-07], builds the provider client
(unless the plugin was given a ``model``), opens the database and its stores, and publishes an
:class:`AgentRuntime` on ``app.state.agent_runtime``. Anything wrong fails the app's startup with
an :class:`AgentError` that names the key, variable or URL (passwords hidden). **Shutdown** closes
the client the plugin built and disposes the database engine.

**Database.** Unless both stores are given, the plugin opens ``database_url`` (a SQLite file by
default; needs the ``storage`` extra). With ``auto_migrate`` unset the plugin migrates SQLite at
startup and only *checks* PostgreSQL: there it fails with "run ``python -m agent_plugin
migrate``" when the schema is not at the newest revision, because production schema changes
belong to a deploy step, not to every replica's boot. ``auto_migrate=True``/``False`` forces
either behaviour.

**Routes** (:meth:`AgentPlugin.install`): ``GET {route_prefix}/tools`` lists the tools, and with
background runs on, ``GET {route_prefix}/runs/{run_id}`` reports a run and
``POST {route_prefix}/runs/{run_id}/decisions`` resumes a paused one (see :meth:`AgentPlugin.router`
and :mod:`agent_plugin.jobs`), all behind the ``dependencies`` given to ``install`` (your auth);
the health routes of
:mod:`agent_plugin.health` at ``health_path`` (not added when the app already has a route there:
include ``plugin.health.check`` in yours). The layout (prefix, health path) is read from the
settings when ``install`` runs; a settings error found then is raised at startup, so every
configuration error surfaces in one place.

**Errors.** ``install`` registers an exception handler that answers an :class:`AgentError` with
the status of its kind [AP-08] and an RFC 9457 problem body (``application/problem+json``)::

    {"type": "tag:fastapi-agent-plugin,2025:error/rate_limited", "title": "RateLimited",
     "status": 429, "detail": "openai-compatible answered 429: ...", "kind": "rate_limited"}

``type`` is a ``tag:`` URI (RFC 4151), the RFC's suggestion for problem types that are not meant
to be dereferenced; ``kind`` repeats the kind for clients that switch on it, and ``provider`` and
``retry_after`` appear when known (plus a ``Retry-After`` header). The detail is the error's
message: API keys never appear in it and a provider's body is cut at 500 characters.

**Always-on.** ``heartbeat=`` schedules check-ins that the workers run (see
:meth:`AgentPlugin.worker_settings`), ``followups=`` (or :meth:`AgentPlugin.followups`) lets
agents book their own next run, and ``delivery=`` says where the reports of those background
runs go (:mod:`agent_plugin.proactive`). Heartbeats and follow-ups need background runs;
startup checks all three.

**Lifespan order.** ``install`` wraps the app's own lifespan: the plugin starts first and stops
last, so the app's startup and shutdown code can use the agent. An app that builds
``FastAPI(lifespan=plugin.lifespan)`` itself may still call ``install`` for the routes: the
plugin notices and does not start twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal, TypeAlias, Unpack

from fastapi import APIRouter, Body, Depends, FastAPI, Header, HTTPException, Query, Request
from fastapi.params import Depends as DependsParam
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError

from agent_plugin.agent import Agent
from agent_plugin.config import AgentSettings
from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.events import AgentEvent, RunEnded
from agent_plugin.health import AgentHealth, health_router
from agent_plugin.hooks import AgentHooks
from agent_plugin.memory import DEFAULT_SCOPE, MemoryStore
from agent_plugin.outcomes import AgentOutcome, ApprovalDecision, RunState
from agent_plugin.policy import AllowAll, Strictest, ToolPolicy, ToolRules
from agent_plugin.proactive import Delivery, FollowupPlan, FollowupTool, Heartbeat, LogDelivery
from agent_plugin.providers.base import LlmClient
from agent_plugin.providers.factory import create_client
from agent_plugin.sessions import Compaction, SessionStore, resume_in_session, run_in_session
from agent_plugin.skills import Skill, load_skills
from agent_plugin.tools import Tool, ToolEffect, ToolRegistry

if TYPE_CHECKING:
    import httpx

    from agent_plugin.jobs import (
        AgentRunArgs,
        HeartbeatStats,
        JobOptions,
        RunFields,
        RunHandle,
        RunQueue,
    )
    from agent_plugin.storage import Database, RunRecord

__all__ = [
    "PROBLEM_TYPE_PREFIX",
    "AgentHandle",
    "AgentPlugin",
    "AgentRuntime",
    "AgentRuntimeHandle",
    "DisconnectPolicy",
    "ModelFactory",
    "ToolInfo",
    "agent_error_handler",
    "get_agent_handle",
    "problem_response",
]

logger = logging.getLogger("agent_plugin")

PROBLEM_TYPE_PREFIX: Final = "tag:fastapi-agent-plugin,2025:error/"
"""The ``type`` of a problem body is this prefix plus the error's kind."""

NOT_INSTALLED: Final = "agent plugin is not installed"

_MIN_FOLLOWUP: Final = timedelta(minutes=1)

ModelFactory: TypeAlias = Callable[[AgentSettings], LlmClient | None]
"""Builds the model from the loaded settings; ``None`` means "build the configured provider"."""

DisconnectPolicy: TypeAlias = Literal["cancel", "continue"]
"""What a streamed run does when its client goes away: stop, or run to the end unobserved."""

Configurer: TypeAlias = Callable[[AgentSettings], Mapping[str, Any]]


# --- the runtime ----------------------------------------------------------------------------


class AgentRuntime:
    """What the plugin builds at startup and shares with every request: one per app.

    Holds the provider client, the settings, the tools, hooks, policy, stores, skills and
    compaction, and builds :class:`Agent` s from them with :meth:`agent`.

    The always-on parts: ``delivery`` receives the reports of background runs with delivery
    on (a :class:`~agent_plugin.proactive.LogDelivery` when none is given; one with an
    ``aclose`` method is closed with the runtime), ``heartbeat`` is what the worker's
    ``agent_heartbeat`` job ticks, and ``followups`` (the longest delay, a timedelta) gives
    every agent the ``schedule_followup`` tool (see :meth:`enqueue_followup`).
    """

    def __init__(
        self,
        *,
        settings: AgentSettings,
        client: LlmClient,
        tools: Iterable[Tool] = (),
        hooks: Sequence[AgentHooks] = (),
        policy: ToolPolicy | None = None,
        session_store: SessionStore,
        memory_store: MemoryStore | None = None,
        skills: Sequence[Skill] = (),
        compaction: Compaction | None = None,
        delivery: Delivery | None = None,
        heartbeat: Heartbeat | None = None,
        followups: timedelta | None = None,
        database: Database | None = None,
        owns_client: bool = False,
    ) -> None:
        self.settings = settings
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
        """The longest delay of a follow-up; ``None``: agents get no ``schedule_followup``."""
        self.database = database
        self.jobs: RunQueue | None = None
        """Background runs (:mod:`agent_plugin.jobs`); ``None`` when they are off."""
        self._owns_client = owns_client
        self._tasks: set[asyncio.Task[Any]] = set()
        self._default_agent: Agent | None = None

    def __repr__(self) -> str:
        return (
            f"AgentRuntime(provider={self.settings.provider!r}, "
            f"model={self.settings.resolved_model()!r}, tools={self.tools.names()!r})"
        )

    def agent(self, scope: str | None = None) -> Agent:
        """An agent configured from the settings; ``scope`` picks its memory (default "agent").

        ``max_steps``, ``max_tokens``, ``system_prompt`` and ``max_run_secs`` (the wall-clock
        limit) come from the settings; tools, hooks, policy, skills and the memory store from
        the plugin, and with ``followups`` the ``schedule_followup`` tool (a chain's first
        link; it books the follow-up in the calling run's session). The default scope's agent
        is built once and shared (agents keep no per-run state); other scopes get a fresh one.
        """
        if scope is None or scope == DEFAULT_SCOPE:
            if self._default_agent is None:
                self._default_agent = self._build_agent(DEFAULT_SCOPE)
            return self._default_agent
        return self._build_agent(scope)

    def agent_with(
        self,
        scope: str | None = None,
        *,
        system_prompt: str | None = None,
        max_steps: int | None = None,
        hooks: Sequence[AgentHooks] = (),
        policy: ToolPolicy | None = None,
        followup_depth: int = 0,
        session: str | None = None,
    ) -> Agent:
        """A fresh agent like :meth:`agent`, with this run's overrides.

        ``system_prompt`` and ``max_steps`` replace the settings when given; ``hooks`` run
        after the plugin's own; ``policy`` replaces the plugin's (a heartbeat tick's read-only
        policy). ``followup_depth`` and ``session`` place the ``schedule_followup`` tool in its
        chain (a follow-up run is ``followup_depth`` links deep). Background runs build their
        agents here.
        """
        return self._build_agent(
            scope or DEFAULT_SCOPE,
            system_prompt=system_prompt,
            max_steps=max_steps,
            hooks=hooks,
            policy=policy,
            followup_depth=followup_depth,
            session=session,
        )

    def heartbeat_policy(self) -> ToolPolicy:
        """The policy of a heartbeat tick's run: the heartbeat's
        :meth:`~agent_plugin.proactive.Heartbeat.run_args_policy` of the plugin's policy, or
        (a tick queued before the heartbeat was removed) the read-only one."""
        if self.heartbeat is not None:
            return self.heartbeat.run_args_policy(self.policy)
        return Strictest([self.policy, ToolRules.read_only()])

    async def enqueue_followup(self, plan: FollowupPlan) -> str:
        """Book a follow-up the agent asked for: a delayed tracked ``agent_run`` (see
        :meth:`agent_plugin.jobs.RunQueue.enqueue_followup`); returns its run id.

        Without background runs this raises an ``unavailable`` :class:`AgentError`, which the
        tool reports to the model as "cannot schedule the follow-up: ...".
        """
        jobs = self.jobs
        if jobs is None:
            raise AgentError(
                ErrorKind.UNAVAILABLE,
                "background runs are off for this plugin, so nothing can run later",
            )
        return await jobs.enqueue_followup(plan)

    def _build_agent(
        self,
        scope: str,
        *,
        system_prompt: str | None = None,
        max_steps: int | None = None,
        hooks: Sequence[AgentHooks] = (),
        policy: ToolPolicy | None = None,
        followup_depth: int = 0,
        session: str | None = None,
    ) -> Agent:
        settings = self.settings
        tools: list[Tool] = list(self.tools)
        if self.followups is not None:
            tools.append(
                FollowupTool(
                    self.enqueue_followup,
                    max_delay=self.followups,
                    depth=followup_depth,
                    session=session,
                    memory_scope=scope,
                )
            )
        return Agent(
            self.client,
            tools=tools,
            system_prompt=system_prompt if system_prompt is not None else settings.system_prompt,
            max_steps=max_steps if max_steps is not None else settings.max_steps,
            max_tokens=settings.max_tokens,
            hooks=[*self.hooks, *hooks],
            policy=policy if policy is not None else self.policy,
            max_duration=settings.max_run_secs,
            memory=self.memory_store,
            memory_scope=scope,
            skills=self.skills,
        )

    def tool_names(self) -> list[str]:
        """The names of the tools an agent of this runtime offers the model, sorted."""
        return self.agent().tools.names()

    def spawn(self, work: Awaitable[Any]) -> asyncio.Task[Any]:
        """Run ``work`` in a task the runtime tracks and cancels at shutdown."""
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def aclose(self) -> None:
        """Cancel tracked tasks, close Redis and the delivery (when it has an ``aclose``, as
        :class:`~agent_plugin.proactive.WebhookDelivery` has), dispose the database, close the
        client the plugin built."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        try:
            if self.jobs is not None:
                with contextlib.suppress(Exception):
                    await self.jobs.aclose()
            await _close_delivery(self.delivery)
            if self.database is not None:
                await self.database.dispose()
        finally:
            if self._owns_client:
                await self.client.aclose()


async def _close_delivery(delivery: Delivery) -> None:
    close = getattr(delivery, "aclose", None)
    if not callable(close):
        return
    try:
        await close()
    except Exception as error:  # closing must not stop the rest of the shutdown
        logger.warning("closing the delivery %r failed: %s", delivery, error)


# --- the plugin -----------------------------------------------------------------------------


class AgentPlugin:
    """Adds an agent to a FastAPI app: config, client, stores, routes, health, error mapping.

    Everything can be given to the constructor or added with the builder methods
    (:meth:`tool`, :meth:`tools`, :meth:`hook`, :meth:`skill`, :meth:`configure`), which return
    the plugin so calls chain.

    * ``model``: an :class:`LlmClient` to use instead of the configured provider (no API key is
      then needed, and the plugin does not close it), or a :data:`ModelFactory` called with the
      loaded settings (a client it returns is closed at shutdown; ``None`` falls back to the
      configured provider).
    * ``http_transport``: a callable that makes the httpx transport of the configured
      provider's client, called once per start (the client closes it at shutdown): a proxy or
      TLS setup, or a faster engine under many concurrent runs, e.g.
      :class:`~agent_plugin.providers.LeanTransport` (HTTP/1.1 only, no proxies) or
      ``AiohttpTransport`` of ``httpx-aiohttp``. Default: httpx's own, through the proxy the
      environment names for the provider's URL.
    * ``session_store``: default the SQL store on ``database_url``. ``memory_store``: ``None``
      (the default) gives agents no memory, because a memory scope is shared by everyone who
      uses it; ``"sql"`` uses the SQL store on ``database_url``; or pass any store.
    * ``skills``: :class:`Skill` s, or a folder of ``SKILL.md`` skills read at startup.
    * ``settings``: complete settings to use instead of reading the file and environment;
      ``environ`` and ``config_file`` replace ``os.environ`` and ``AGENT_CONFIG_FILE``.
    * ``auto_migrate``: see the module documentation (``None``: SQLite yes, PostgreSQL no).
    * ``health``: the :class:`AgentHealth` component (to tune its cache and time limit).
    * ``delivery``: where the reports of background runs with delivery on go (heartbeat
      ticks, follow-ups, runs enqueued with ``deliver=True``): a
      :class:`~agent_plugin.proactive.Delivery` such as
      :class:`~agent_plugin.proactive.WebhookDelivery`; default
      :class:`~agent_plugin.proactive.LogDelivery`.
    * ``heartbeat``: a :class:`~agent_plugin.proactive.Heartbeat` the workers tick (an arq
      cron job named ``agent_heartbeat``, see :meth:`worker_settings`).
    * ``followups``: the longest delay (a timedelta of at least a minute) of the
      ``schedule_followup`` tool every agent then gets; also :meth:`followups`.
    * ``jobs``: background runs on arq (:mod:`agent_plugin.jobs`): ``None`` (the default) turns
      them on when the plugin uses its SQL database anyway (the default stores), ``True`` or a
      :class:`~agent_plugin.jobs.JobOptions` turns them on (opening ``database_url`` for the
      run records even with in-memory stores), ``False`` turns them off.
    """

    def __init__(
        self,
        *,
        tools: Iterable[Tool] = (),
        hooks: Iterable[AgentHooks] = (),
        policy: ToolPolicy | None = None,
        model: LlmClient | ModelFactory | None = None,
        http_transport: Callable[[], httpx.AsyncBaseTransport] | None = None,
        session_store: SessionStore | None = None,
        memory_store: MemoryStore | Literal["sql"] | None = None,
        skills: Iterable[Skill] | str | Path = (),
        compaction: Compaction | None = None,
        delivery: Delivery | None = None,
        heartbeat: Heartbeat | None = None,
        followups: timedelta | None = None,
        settings: AgentSettings | None = None,
        environ: Mapping[str, str] | None = None,
        config_file: str | Path | None = None,
        auto_migrate: bool | None = None,
        health: AgentHealth | None = None,
        jobs: JobOptions | bool | None = None,
    ) -> None:
        self._tools: list[Tool] = list(tools)
        self._hooks: list[AgentHooks] = list(hooks)
        self.policy = policy
        self.model = model
        self.http_transport = http_transport
        self.session_store = session_store
        self.memory_store = memory_store
        self._skills: list[Skill] = []
        self._skill_folders: list[Path] = []
        self._add_skills(skills)
        self.compaction = compaction
        self.delivery = delivery
        self.heartbeat = heartbeat
        self.followup_max_delay = followups
        """The longest follow-up delay (``followups=``, or :meth:`followups`)."""
        self._settings = settings
        self._environ = environ
        self._config_file = config_file
        self.auto_migrate = auto_migrate
        self.health = health if health is not None else AgentHealth()
        self._overrides: dict[str, Any] = {}
        self._configurers: list[Configurer] = []
        self._runtimes: weakref.WeakKeyDictionary[Any, AgentRuntime] = weakref.WeakKeyDictionary()
        self._jobs = jobs
        self._current: AgentRuntime | None = None

    def __repr__(self) -> str:
        names = sorted(getattr(t, "name", "?") for t in self._tools)
        return f"AgentPlugin(tools={names!r}, overrides={sorted(self._overrides)!r})"

    # --- builder -------------------------------------------------------------------------

    @property
    def registered_tools(self) -> list[Tool]:
        """The tools registered so far, in registration order."""
        return list(self._tools)

    @property
    def registered_hooks(self) -> list[AgentHooks]:
        return list(self._hooks)

    @property
    def overrides(self) -> dict[str, Any]:
        """The settings overrides given to :meth:`configure` as keywords."""
        return dict(self._overrides)

    def tool(self, tool: Tool) -> AgentPlugin:
        """Register one tool."""
        self._tools.append(tool)
        return self

    def tools(self, tools: Iterable[Tool]) -> AgentPlugin:
        """Register several tools."""
        self._tools.extend(tools)
        return self

    def hook(self, hook: AgentHooks) -> AgentPlugin:
        """Register a hook; hooks run in registration order."""
        self._hooks.append(hook)
        return self

    def skill(self, skill: Skill | str | Path) -> AgentPlugin:
        """Register a skill, or a folder of ``SKILL.md`` skills (read at startup)."""
        self._add_skills([skill] if isinstance(skill, Skill) else skill)
        return self

    def followups(self, max_delay: timedelta) -> AgentPlugin:
        """Give every agent the ``schedule_followup`` tool: the agent books its own next
        wake-up, at most ``max_delay`` from now (at least one minute) [AP-46].

        A booking is a delayed tracked background run in the same session and memory scope,
        with delivery on; a chain of follow-ups stops at ten links. Needs background runs.
        """
        self.followup_max_delay = max_delay
        return self

    def configure(self, fn: Configurer | None = None, /, **overrides: Any) -> AgentPlugin:
        """Override settings in code: the strongest layer.

        ``configure(max_steps=5)`` sets values: every key given wins over the file and the
        environment, even when it equals the default. ``configure(fn)`` calls ``fn`` with the
        loaded settings at startup; the mapping it returns is applied the same way (and
        validated), e.g. ``configure(lambda s: {"max_steps": s.max_steps * 2})``.
        """
        if fn is not None:
            self._configurers.append(fn)
        self._overrides.update(overrides)
        return self

    def _add_skills(self, skills: Iterable[Skill] | str | Path) -> None:
        if isinstance(skills, str | Path):
            self._skill_folders.append(Path(skills))
        else:
            self._skills.extend(skills)

    # --- settings ------------------------------------------------------------------------

    def load_settings(self) -> AgentSettings:
        """The settings the plugin would start with: loaded, overridden, validated."""
        overrides = dict(self._overrides)
        settings = self._settings_with(overrides)
        for configurer in self._configurers:
            overrides.update(configurer(settings))
            settings = self._settings_with(overrides)
        return settings

    def _settings_with(self, overrides: Mapping[str, Any]) -> AgentSettings:
        if self._settings is None:
            return AgentSettings.load(
                overrides, environ=self._environ, config_file=self._config_file
            )
        if not overrides:
            return self._settings
        try:
            return AgentSettings.model_validate({**self._settings.model_dump(), **overrides})
        except ValidationError as error:
            problems = "; ".join(
                f"code override {'.'.join(str(p) for p in e['loc']) or '?'}: {e['msg']}"
                for e in error.errors(include_url=False)
            )
            raise AgentError.config(problems) from None

    # --- startup and shutdown ------------------------------------------------------------

    async def start(self) -> AgentRuntime:
        """Build the runtime: settings, client, database and stores. Fails with AgentError.

        ``install`` and :meth:`lifespan` call this; call it yourself to use the runtime outside
        a FastAPI app (a script, a worker), and ``await runtime.aclose()`` when done.
        """
        try:
            return await self._start()
        except AgentError as error:
            raise AgentError(
                error.kind,
                f"the agent plugin could not start: {error.message}",
                provider=error.provider,
                status=error.status,
            ) from error

    async def _start(self) -> AgentRuntime:
        settings = self.load_settings()
        self.check_always_on()
        skills = [*self._skills]
        for folder in self._skill_folders:
            skills.extend(load_skills(folder))
        client, owns_client = self._client_for(settings)
        database: Database | None = None
        try:
            database = self._database_for(settings)
            if database is not None:
                await self._prepare(database)
            session_store, memory_store = self._stores_for(database)
            runtime = AgentRuntime(
                settings=settings,
                client=client,
                tools=self._tools,
                hooks=self._hooks,
                policy=self.policy,
                session_store=session_store,
                memory_store=memory_store,
                skills=skills,
                compaction=self.compaction,
                delivery=self.delivery,
                heartbeat=self.heartbeat,
                followups=self.followup_max_delay,
                database=database,
                owns_client=owns_client,
            )
            options = self.job_options()
            if options is not None and database is not None:
                from agent_plugin.jobs import RunQueue
                from agent_plugin.storage import SqlRunStore

                runtime.jobs = RunQueue(runtime, SqlRunStore(database), options)
            return runtime
        except BaseException:
            try:
                if database is not None:
                    await database.dispose()
            finally:
                if owns_client:
                    await client.aclose()
            raise

    def check_always_on(self) -> None:
        """Check ``delivery``, ``heartbeat`` and ``followups``; raise a ``config``
        :class:`AgentError` saying what is wrong.

        Startup (the app's and the worker's) and :meth:`worker_settings` call it, so a
        misconfigured heartbeat stops the process instead of never ticking.
        """
        heartbeat = self.heartbeat
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
        delivery = self.delivery
        if delivery is not None and not isinstance(delivery, Delivery):
            raise AgentError.config(
                "delivery must have an async deliver(report) method (LogDelivery, "
                f"WebhookDelivery or your own), got {delivery!r}"
            )
        delay = self.followup_max_delay
        if delay is not None and (not isinstance(delay, timedelta) or delay < _MIN_FOLLOWUP):
            raise AgentError.config(
                f"followups needs the longest delay as a timedelta of at least one minute, got "
                f"{delay!r}"
            )
        if self.job_options() is None:
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

    def _client_for(self, settings: AgentSettings) -> tuple[LlmClient, bool]:
        model = self.model
        if isinstance(model, LlmClient):
            return model, False
        if model is not None:
            built = model(settings)
            if built is not None:
                return built, True
        api_key = settings.require_api_key(self._environ)
        transport = self.http_transport() if self.http_transport is not None else None
        return create_client(settings, api_key=api_key, transport=transport), True

    def _stores_need_database(self) -> bool:
        return self.session_store is None or self.memory_store == "sql"

    def _needs_database(self) -> bool:
        return self._stores_need_database() or self.job_options() is not None

    def job_options(self) -> JobOptions | None:
        """The background-run options, or ``None`` when background runs are off."""
        option = self._jobs
        if option is False or (option is None and not self._stores_need_database()):
            return None
        from agent_plugin.jobs import JobOptions

        return option if isinstance(option, JobOptions) else JobOptions()

    def _database_for(self, settings: AgentSettings) -> Database | None:
        if not self._needs_database():
            return None
        from agent_plugin.storage import Database

        options = self.job_options()
        try:
            # a worker runs up to max_jobs runs at once, each with its own transactions
            return Database(settings.database_url, pool_size=options.max_jobs if options else None)
        except ImportError as error:
            raise AgentError.config(
                f"the database driver {error.name or error} is not installed (for PostgreSQL: "
                "pip install 'fastapi-agent-plugin[postgres]')"
            ) from error

    async def _prepare(self, database: Database) -> None:
        migrate = self.auto_migrate
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

    def _stores_for(self, database: Database | None) -> tuple[SessionStore, MemoryStore | None]:
        sessions = self.session_store
        memory = self.memory_store
        if database is not None:
            from agent_plugin.storage import SqlMemoryStore, SqlSessionStore

            if sessions is None:
                sessions = SqlSessionStore(database)
            if memory == "sql":
                memory = SqlMemoryStore(database)
        if sessions is None or isinstance(memory, str):  # pragma: no cover - _needs_database
            raise AgentError.config("the SQL stores need a database")
        return sessions, memory

    @asynccontextmanager
    async def lifespan(self, app: FastAPI) -> AsyncIterator[None]:
        """Start the runtime for ``app`` and stop it afterwards: ``FastAPI(lifespan=...)``.

        Publishes the runtime on ``app.state.agent_runtime`` and to :attr:`health`. Entered
        again for an app it already runs for (a lifespan given to ``FastAPI`` and composed by
        ``install``), it does nothing.
        """
        if app in self._runtimes:
            yield
            return
        runtime = await self.start()
        self._runtimes[app] = runtime
        app.state.agent_runtime = runtime
        self._current = runtime
        self.health.attach(runtime.client, runtime.settings.provider)
        logger.info("agent plugin started: %r", runtime)
        try:
            yield
        finally:
            self.health.detach(runtime.client)
            app.state.agent_runtime = None
            del self._runtimes[app]
            if self._current is runtime:
                self._current = None
            await runtime.aclose()
            logger.info("agent plugin stopped")

    def runtime(self, app: FastAPI) -> AgentRuntime | None:
        """The runtime running for ``app``, if it started."""
        return self._runtimes.get(app)

    # --- background runs -----------------------------------------------------------------

    def worker_settings(self, **overrides: Any) -> type[Any]:
        """arq ``WorkerSettings`` that run this plugin's background jobs.

        Put it in a module and start the standard arq CLI on it::

            # yourapp/worker.py
            from yourapp.main import plugin
            WorkerSettings = plugin.worker_settings()

            $ arq yourapp.worker.WorkerSettings

        The worker's startup opens the same runtime as the app (settings, client, database,
        stores) and its shutdown closes it. Redis comes from ``redis_url``; the queue, the
        job timeout, retries and the result lifetime from the plugin's
        :class:`~agent_plugin.jobs.JobOptions`. With a ``heartbeat``, the settings register
        the cron job ``agent_heartbeat`` on its schedule and set the worker's ``timezone`` to
        the heartbeat's (``cron_jobs`` given in ``overrides`` are kept beside it).
        ``overrides`` set any other arq worker setting. The settings and the always-on
        options are read when this is called: a bad configuration fails here.
        """
        self.check_always_on()
        options = self.job_options()
        if options is None:
            raise AgentError.config(
                "background runs are off for this plugin (jobs=False, or in-memory stores "
                "only): pass jobs=True to AgentPlugin to keep run records in database_url"
            )
        from agent_plugin.jobs import worker_settings

        return worker_settings(self, options, **overrides)

    async def start_worker(self) -> AgentRuntime:
        """Start a runtime for an arq worker (the ``on_startup`` of :meth:`worker_settings`)."""
        runtime = await self.start()
        if runtime.jobs is None:
            await runtime.aclose()
            raise AgentError.config("background runs are off for this plugin: pass jobs=True")
        if self._current is None:
            self._current = runtime
        return runtime

    async def stop_worker(self, runtime: AgentRuntime) -> None:
        """Close a runtime opened by :meth:`start_worker`."""
        if self._current is runtime:
            self._current = None
        await runtime.aclose()

    def _handle(self) -> AgentRuntimeHandle:
        runtime = self._current
        if runtime is None:
            raise AgentError(ErrorKind.UNAVAILABLE, f"{NOT_INSTALLED} or has not started")
        return AgentRuntimeHandle(runtime)

    async def enqueue_run(self, args: AgentRunArgs | str, /, **fields: Unpack[RunFields]) -> str:
        """:meth:`AgentRuntimeHandle.enqueue_run` on the running app's (or worker's) runtime."""
        return await self._handle().enqueue_run(args, **fields)

    async def enqueue_run_tracked(
        self, args: AgentRunArgs | str, /, **fields: Unpack[RunFields]
    ) -> RunHandle:
        """:meth:`AgentRuntimeHandle.enqueue_run_tracked` on the running runtime."""
        return await self._handle().enqueue_run_tracked(args, **fields)

    async def enqueue_run_in(
        self, delay: float | timedelta, args: AgentRunArgs | str, /, **fields: Unpack[RunFields]
    ) -> str:
        """:meth:`AgentRuntimeHandle.enqueue_run_in` on the running runtime."""
        return await self._handle().enqueue_run_in(delay, args, **fields)

    async def enqueue_resume(
        self, run_id: str, decisions: Iterable[ApprovalDecision] = ()
    ) -> RunHandle:
        """:meth:`AgentRuntimeHandle.enqueue_resume` on the running runtime."""
        return await self._handle().enqueue_resume(run_id, decisions)

    async def run_status(self, run_id: str) -> RunRecord:
        """:meth:`AgentRuntimeHandle.run_status` on the running runtime."""
        return await self._handle().run_status(run_id)

    async def heartbeat_stats(self) -> HeartbeatStats:
        """:meth:`AgentRuntimeHandle.heartbeat_stats` on the running runtime."""
        return await self._handle().heartbeat_stats()

    # --- installing ----------------------------------------------------------------------

    def install(
        self,
        app: FastAPI,
        *,
        dependencies: Sequence[DependsParam] = (),
        health_route: bool | None = None,
        runs_route: bool = False,
        console: bool = False,
    ) -> None:
        """Add the routes, the error handler and the health route; wrap the app's lifespan.

        ``dependencies`` (e.g. ``[Depends(require_user)]``) guard the agent routes; the
        health routes stay open. ``health_route=None`` adds them unless the app already has a
        route at the health path. ``runs_route=True`` adds ``POST {prefix}/runs`` and
        ``console=True`` the run console page (see :meth:`router`).
        """
        if getattr(app.state, "agent_plugin", None) is not None:
            raise AgentError.config("an agent plugin is already installed in this app")
        app.state.agent_plugin = self
        prefix, health_path = self._layout()
        app.add_exception_handler(AgentError, agent_error_handler)
        app.include_router(
            self.router(prefix, dependencies=dependencies, runs_route=runs_route, console=console)
        )
        if health_route is None:
            health_route = not any(
                getattr(route, "path", None) == health_path for route in app.router.routes
            )
        if health_route:
            app.include_router(health_router(self.health, health_path))
        original = app.router.lifespan_context

        @asynccontextmanager
        async def lifespan(inner: FastAPI) -> AsyncIterator[Any]:
            async with self.lifespan(inner), original(inner) as state:
                yield state

        app.router.lifespan_context = lifespan

    def _layout(self) -> tuple[str, str]:
        """The route prefix and health path; defaults when the settings do not load yet."""
        try:
            settings = self.load_settings()
        except AgentError:  # reported at startup, where every configuration error surfaces
            defaults = AgentSettings.model_construct()
            return defaults.route_prefix, defaults.health_path
        return settings.route_prefix, settings.health_path

    def router(
        self,
        prefix: str = "/agent",
        *,
        dependencies: Sequence[DependsParam] = (),
        runs_route: bool = False,
        console: bool = False,
    ) -> APIRouter:
        """The agent routes under ``prefix``, all behind ``dependencies``.

        * ``GET {prefix}/tools``: the tools the agent offers the model.

        With background runs on (:meth:`job_options`):

        * ``GET {prefix}/runs/{run_id}``: the run's record (status, progress, outcome summary,
          typed error, calls awaiting approval); 404 for an unknown id.
        * ``POST {prefix}/runs/{run_id}/decisions``: a JSON list of
          ``{"call_id": ..., "approval": {"verdict": "approve" | "edit" | "reject", ...}}`` for
          a paused run; 202 with the run's handle, the resume queued. 409 when the run is not
          paused, a decision names a call that does not await approval, or the pause was
          decided already.
        * ``POST {prefix}/runs`` (only with ``runs_route=True``): ``{"prompt", "session"?}``
          starts a tracked run; 202 with the handle (``Location``: the status path).
        * ``GET {prefix}/runs/{run_id}/events``: the run's events as Server-Sent Events
          (:mod:`agent_plugin.live`), from the start or after ``Last-Event-ID`` (header, or the
          ``last_event_id`` query parameter), ending after its ``run_end`` (``?follow=true``:
          after the final one, through pauses); 204 when the client has seen the end already,
          400 for a malformed id, 404 for an unknown run. When the run's record says it ended
          (or paused, without ``follow``) but its ``run_end`` never reached the stream (a Redis
          error as its worker published it), the reader gets one built from the record: the
          record is read every 15 s while no event arrives.
        * ``POST {prefix}/runs/{run_id}/cancel`` (``{"reason"?}``): cancels a queued, paused or
          running run (a running one ends ``cancelled`` at its next boundary, in its worker);
          202 with the handle, 409 for a finished run.
        * ``POST {prefix}/runs/{run_id}/messages`` (``{"text"}``): a user message that joins a
          running run before its next model call; 202, or 409 when the run is not running
          (or runs in a session, which takes no messages yet).
        * ``GET {prefix}/console/{run_id}`` (only with ``console=True``): a page that shows
          the run live and offers approve / reject for calls awaiting approval. Browsers'
          ``EventSource`` sends no ``Authorization`` header: behind ``dependencies`` the console
          works with cookie (session) auth.

        Run ids are unguessable (128 random bits), but every caller that passes
        ``dependencies`` can read any run it knows the id of: scope the ids per user in your
        own routes if users must not share them.
        """
        router = APIRouter(prefix=prefix, tags=["agent"], dependencies=list(dependencies))

        @router.get(
            "/tools",
            response_model=list[ToolInfo],
            summary="The tools the agent offers the model",
            responses={503: {"description": NOT_INSTALLED}},
        )
        async def list_agent_tools(agent: AgentHandle) -> list[ToolInfo]:
            return [ToolInfo.of(t) for t in agent.agent().tools]

        if self.job_options() is not None:
            _add_run_routes(router, runs_route=runs_route)
            _add_live_routes(router, console=console, prefix=prefix)
        return router


class RunRequest(BaseModel):
    """The body of ``POST {prefix}/runs``: a task to run in the background."""

    model_config = ConfigDict(extra="forbid")

    prompt: str = Field(min_length=1, max_length=32_000, examples=["Summarise today's tickets"])
    session: str | None = Field(default=None, min_length=1, max_length=255)


def _add_run_routes(router: APIRouter, *, runs_route: bool) -> None:
    """The run routes of :meth:`AgentPlugin.router`."""
    from agent_plugin.jobs import RunHandle
    from agent_plugin.storage.runs import RunRecord

    problems: dict[int | str, dict[str, Any]] = {
        404: {"description": "No such run (problem details)"},
        409: {"description": "The run is not paused, or a decision is not accepted"},
        503: {"description": "Redis or the database is unreachable, or the plugin is not running"},
    }

    @router.get(
        "/runs/{run_id}",
        response_model=RunRecord,
        summary="A background run's status, progress and outcome",
        responses={404: problems[404], 503: problems[503]},
    )
    async def get_run(run_id: str, agent: AgentHandle) -> Any:
        return await agent.run_status(run_id)

    @router.post(
        "/runs/{run_id}/decisions",
        status_code=202,
        response_model=RunHandle,
        summary="Approve, edit or reject the calls a paused run waits on, and resume it",
        responses=problems,
    )
    async def decide_run(
        run_id: str,
        decisions: Annotated[list[ApprovalDecision], Body()],
        agent: AgentHandle,
        response: Response,
    ) -> Any:
        handle = await agent.enqueue_resume(run_id, decisions)
        response.headers["location"] = handle.status_path
        return handle

    if runs_route:

        @router.post(
            "/runs",
            status_code=202,
            response_model=RunHandle,
            summary="Start a tracked background run",
            responses={409: problems[409], 503: problems[503]},
        )
        async def start_run(body: RunRequest, agent: AgentHandle, response: Response) -> Any:
            handle = await agent.enqueue_run_tracked(body.prompt, session=body.session)
            response.headers["location"] = handle.status_path
            return handle


class SteeringRequest(BaseModel):
    """The body of ``POST {prefix}/runs/{run_id}/messages``: a message for a running run."""

    model_config = ConfigDict(extra="forbid")

    text: str = Field(min_length=1, max_length=32_000, examples=["Also check the staging logs"])


class CancelRequest(BaseModel):
    """The (optional) body of ``POST {prefix}/runs/{run_id}/cancel``."""

    model_config = ConfigDict(extra="forbid")

    reason: str = Field(default="cancelled over HTTP", min_length=1, max_length=500)


def _add_live_routes(router: APIRouter, *, console: bool, prefix: str) -> None:
    """The live-run routes of :meth:`AgentPlugin.router`: events, cancel, messages, console."""
    from agent_plugin.console import CONSOLE_HEADERS, console_page
    from agent_plugin.events import RunEnded
    from agent_plugin.jobs import RunHandle
    from agent_plugin.live import (
        caught_up_with_end,
        parse_event_id,
        replay_response,
        run_events_response,
        stream_key,
    )
    from agent_plugin.storage.runs import RunStatus

    problems: dict[int | str, dict[str, Any]] = {
        404: {"description": "No such run (problem details)"},
        409: {"description": "The run is not in a state that takes this request"},
        503: {"description": "Redis or the database is unreachable, or the plugin is not running"},
    }

    @router.get(
        "/runs/{run_id}/events",
        response_class=StreamingResponse,
        summary="A run's events as Server-Sent Events",
        responses={
            200: {"content": {"text/event-stream": {}}},
            204: {"description": "The client has seen the run's end already"},
            400: {"description": "Last-Event-ID is not an event id"},
            404: problems[404],
            503: problems[503],
        },
    )
    async def run_events(
        run_id: str,
        agent: AgentHandle,
        last_event_id: Annotated[str | None, Header()] = None,
        after: Annotated[str | None, Query(alias="last_event_id")] = None,
        follow: bool = False,
    ) -> Response:
        record = await agent.run_status(run_id)  # 404 for an unknown run, never a hang
        jobs = agent.jobs
        redis = await jobs.redis()
        live_prefix = jobs.options.live_prefix
        last = last_event_id or after
        if last is not None and parse_event_id(last) is None:
            raise HTTPException(400, "Last-Event-ID is not an event id")
        finished = record.status.finished
        if await caught_up_with_end(redis, run_id, last, prefix=live_prefix, finished=finished):
            return Response(status_code=204)
        if finished and not await redis.exists(stream_key(run_id, live_prefix)):
            if last is not None:
                return Response(status_code=204)
            end = RunEnded(run_id=run_id, summary=record.outcome, error=record.error)
            return replay_response([end])

        async def recorded_end() -> RunEnded | None:
            try:
                now = await jobs.get(run_id)
            except AgentError as error:
                if error.kind is ErrorKind.NOT_FOUND:  # its record went (a discarded enqueue)
                    return RunEnded(run_id=run_id, error=error.info())
                # the stream goes on; the next check may do better
                logger.warning("run %s: cannot read its record: %s", run_id, error)
                return None
            paused = now.status is RunStatus.AWAITING_APPROVAL and now.outcome is not None
            if not (now.status.finished or paused):  # (a pause's end carries its summary)
                return None
            return RunEnded(run_id=run_id, summary=now.outcome, error=now.error)

        return run_events_response(
            redis,
            run_id,
            last_event_id=last,
            follow=follow,
            prefix=live_prefix,
            recorded_end=recorded_end,
        )

    @router.post(
        "/runs/{run_id}/cancel",
        status_code=202,
        response_model=RunHandle,
        summary="Cancel a queued, paused or running run",
        responses=problems,
    )
    async def cancel_run(
        run_id: str,
        agent: AgentHandle,
        response: Response,
        body: Annotated[CancelRequest | None, Body()] = None,
    ) -> Any:
        await agent.jobs.cancel(run_id, body.reason if body else "cancelled over HTTP")
        handle = agent.jobs.handle(run_id)
        response.headers["location"] = handle.status_path
        return handle

    @router.post(
        "/runs/{run_id}/messages",
        status_code=202,
        response_model=RunHandle,
        summary="Send a message that joins a running run before its next model call",
        responses=problems,
    )
    async def steer_run(
        run_id: str, body: SteeringRequest, agent: AgentHandle, response: Response
    ) -> Any:
        await agent.jobs.steer(run_id, body.text)
        handle = agent.jobs.handle(run_id)
        response.headers["location"] = handle.status_path
        return handle

    if console:

        @router.get("/console/{run_id}", response_class=HTMLResponse, include_in_schema=False)
        async def run_console(run_id: str, agent: AgentHandle) -> HTMLResponse:
            await agent.run_status(run_id)  # 404 for an unknown run
            return HTMLResponse(console_page(run_id, prefix=prefix), headers=CONSOLE_HEADERS)


def _newest_revision() -> str | None:
    """The head revision of the plugin's migration scripts."""
    from alembic.script import ScriptDirectory

    from agent_plugin.storage.migrations import alembic_config

    return ScriptDirectory.from_config(alembic_config()).get_current_head()


# --- the request dependency -----------------------------------------------------------------


class ToolInfo(BaseModel):
    """A tool as the agent routes list it."""

    model_config = ConfigDict(frozen=True)

    name: str
    description: str
    effect: ToolEffect
    input_schema: dict[str, JsonValue]

    @classmethod
    def of(cls, tool: Tool) -> ToolInfo:
        return cls(
            name=tool.name,
            description=tool.description,
            effect=tool.effect,
            input_schema=tool.input_schema,
        )


class AgentRuntimeHandle:
    """What :data:`AgentHandle` gives a route: the app's agent, ready to run [AP-50].

    ``run`` is one task; ``chat`` continues a session (saved in the session store) and
    ``chat_as`` does so with the memory of ``scope`` (one per user or tenant); ``resume`` and
    ``resume_as`` continue a run paused for approval, keeping its run id and saving to its
    session when it ran in one; ``stream`` answers with Server-Sent Events. ``enqueue_run``,
    ``enqueue_run_tracked``, ``enqueue_run_in`` and ``enqueue_resume`` queue background runs
    for an arq worker, and ``run_status`` reads their records (:mod:`agent_plugin.jobs`).
    """

    def __init__(self, runtime: AgentRuntime) -> None:
        self.runtime = runtime

    def __repr__(self) -> str:
        return f"AgentRuntimeHandle({self.runtime!r})"

    def agent(self, scope: str | None = None) -> Agent:
        """The configured agent (memory ``scope``, default ``"agent"``)."""
        return self.runtime.agent(scope)

    def tool_names(self) -> list[str]:
        return self.runtime.tool_names()

    async def run(self, prompt: str, *, run_id: str | None = None) -> AgentOutcome:
        """Run one task from scratch."""
        return await self.agent().run(prompt, run_id=run_id)

    async def chat(self, session: str, prompt: str) -> AgentOutcome:
        """Continue ``session`` with ``prompt``; the turn is saved unless it paused."""
        return await self.chat_as(DEFAULT_SCOPE, session, prompt)

    async def chat_as(self, scope: str, session: str, prompt: str) -> AgentOutcome:
        """:meth:`chat` with the memory of ``scope``."""
        runtime = self.runtime
        turn = await run_in_session(
            runtime.agent(scope),
            runtime.session_store,
            session,
            prompt,
            compaction=runtime.compaction,
        )
        return turn.outcome

    async def resume(
        self, state: RunState, decisions: Iterable[ApprovalDecision] = ()
    ) -> AgentOutcome:
        """Continue a paused run with the reviewer's decisions."""
        return await self.resume_as(DEFAULT_SCOPE, state, decisions)

    async def resume_as(
        self, scope: str, state: RunState, decisions: Iterable[ApprovalDecision] = ()
    ) -> AgentOutcome:
        """:meth:`resume` with the memory of ``scope``."""
        agent = self.runtime.agent(scope)
        if state.session_id is not None and state.session_version is not None:
            turn = await resume_in_session(agent, self.runtime.session_store, state, decisions)
            return turn.outcome
        return (await agent.resume(state, decisions)).outcome

    # --- background runs -----------------------------------------------------------------

    @property
    def jobs(self) -> RunQueue:
        """The runtime's background-run queue; a ``config`` error when background runs are off."""
        jobs = self.runtime.jobs
        if jobs is None:
            raise AgentError.config(
                "background runs are off for this plugin (jobs=False, or in-memory stores "
                "only): pass jobs=True to AgentPlugin"
            )
        return jobs

    async def enqueue_run(self, args: AgentRunArgs | str, /, **fields: Unpack[RunFields]) -> str:
        """Queue a background run and return its id (see :meth:`enqueue_run_tracked`)."""
        return (await self.enqueue_run_tracked(args, **fields)).run_id

    async def enqueue_run_tracked(
        self, args: AgentRunArgs | str, /, **fields: Unpack[RunFields]
    ) -> RunHandle:
        """Queue a background run; answer its id and the path that reports its status.

        ``args`` is an :class:`~agent_plugin.jobs.AgentRunArgs` or a prompt; ``fields`` set
        the other arguments (``session``, ``memory_scope``, ``system_prompt``, ``max_steps``,
        ``run_id``, ...). The run's record exists (``queued``) before its job reaches Redis;
        the same ``run_id`` twice is a no-op. Fails with ``unavailable`` when Redis cannot be
        reached, and ``conflict`` for a busy session under ``session_lock = "reject"``.
        """
        from agent_plugin.jobs import run_args

        return await self.jobs.enqueue(run_args(args, **fields))

    async def enqueue_run_in(
        self, delay: float | timedelta, args: AgentRunArgs | str, /, **fields: Unpack[RunFields]
    ) -> str:
        """:meth:`enqueue_run`, starting ``delay`` (seconds or a timedelta) from now."""
        from agent_plugin.jobs import run_args

        seconds = delay.total_seconds() if isinstance(delay, timedelta) else float(delay)
        if not math.isfinite(seconds) or seconds < 0:
            raise AgentError.config(f"a run's delay must be 0 seconds or more, got {delay!r}")
        handle = await self.jobs.enqueue(run_args(args, **fields), defer=seconds)
        return handle.run_id

    async def enqueue_resume(
        self, run_id: str, decisions: Iterable[ApprovalDecision] = ()
    ) -> RunHandle:
        """Accept reviewers' decisions for a paused background run and queue its resume.

        The paused state stays in the run's record; ``conflict`` when the run is not paused,
        a decision names a call that does not await approval, or the pause was decided
        already; ``not_found`` for an unknown run.
        """
        return await self.jobs.enqueue_resume(run_id, list(decisions))

    async def run_status(self, run_id: str) -> RunRecord:
        """The record of a background run; ``not_found`` for an unknown id."""
        return await self.jobs.get(run_id)

    async def heartbeat_stats(self) -> HeartbeatStats:
        """How the heartbeat's ticks went, across every worker: started, skipped because the
        session was busy or the precheck said no, failed; and the latest tick."""
        return await self.jobs.heartbeat_stats()

    def stream(
        self,
        prompt: str,
        *,
        session: str | None = None,
        scope: str | None = None,
        on_disconnect: DisconnectPolicy = "cancel",
    ) -> StreamingResponse:
        """Run a task (in ``session``, if given) and stream its events as Server-Sent Events.

        Each event is one SSE message: ``id`` (1, 2, ...), ``event`` (the event's ``type``) and
        ``data`` (its JSON); the last is ``run_end``. If the run fails before it starts, one
        ``error`` event carries the error. ``on_disconnect="cancel"`` stops the run when the
        client goes away; ``"continue"`` lets it finish (and save its session turn).
        """
        agent = self.runtime.agent(scope)
        store = self.runtime.session_store
        compaction = self.runtime.compaction
        queue: asyncio.Queue[AgentEvent | BaseException | None] = asyncio.Queue()

        async def work() -> None:
            if session is None:
                await agent.run_turn([], prompt, on_event=queue.put_nowait, stream=True)
            else:
                await run_in_session(
                    agent,
                    store,
                    session,
                    prompt,
                    compaction=compaction,
                    on_event=queue.put_nowait,
                    stream=True,
                )

        def finished(task: asyncio.Task[None]) -> None:
            error = None if task.cancelled() else task.exception()
            queue.put_nowait(error)

        async def frames() -> AsyncIterator[str]:
            task = self.runtime.spawn(work())
            task.add_done_callback(finished)
            count = 0
            ended = False
            try:
                while True:
                    item = await queue.get()
                    if item is None or isinstance(item, BaseException):
                        if not ended:
                            count += 1
                            yield _sse(count, "error", _error_data(item))
                        return
                    count += 1
                    yield _sse(count, item.type, item.model_dump_json())
                    ended = ended or isinstance(item, RunEnded)
            finally:
                if on_disconnect == "cancel" and not task.done():
                    task.cancel()

        return StreamingResponse(
            frames(),
            media_type="text/event-stream",
            headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
        )


def _sse(event_id: int, event: str, data: str) -> str:
    return f"id: {event_id}\nevent: {event}\ndata: {data}\n\n"


def _error_data(error: BaseException | None) -> str:
    if isinstance(error, AgentError):
        return error.info().model_dump_json()
    message = "the run stopped" if error is None else f"{type(error).__name__}: {error}"
    return json.dumps({"kind": ErrorKind.INTERNAL.value, "message": message})


def get_agent_handle(request: Request) -> AgentRuntimeHandle:
    """The dependency behind :data:`AgentHandle`: 503 when the plugin is not running."""
    runtime = getattr(request.app.state, "agent_runtime", None)
    if not isinstance(runtime, AgentRuntime):
        raise HTTPException(status_code=503, detail=NOT_INSTALLED)
    return AgentRuntimeHandle(runtime)


AgentHandle = Annotated[AgentRuntimeHandle, Depends(get_agent_handle)]
"""Write ``agent: AgentHandle`` in a route's signature to get the app's agent."""


# --- errors ---------------------------------------------------------------------------------


def problem_response(error: AgentError) -> JSONResponse:
    """An RFC 9457 problem response for ``error`` with the status of its kind [AP-08]."""
    kind = error.kind
    body: dict[str, Any] = {
        "type": PROBLEM_TYPE_PREFIX + kind.value,
        "title": kind.display_name,
        "status": kind.http_status,
        "detail": error.message,
        "kind": kind.value,
    }
    headers: dict[str, str] = {}
    if error.provider is not None:
        body["provider"] = error.provider
    if error.retry_after is not None:
        body["retry_after"] = error.retry_after
        headers["retry-after"] = str(max(0, math.ceil(error.retry_after)))
    return JSONResponse(
        body,
        status_code=kind.http_status,
        headers=headers,
        media_type="application/problem+json",
    )


async def agent_error_handler(request: Request, error: Exception) -> Response:
    """The exception handler :meth:`AgentPlugin.install` registers for :class:`AgentError`."""
    if not isinstance(error, AgentError):  # pragma: no cover - registered for AgentError only
        raise error
    if error.kind.http_status >= 500:
        logger.warning("%s %s failed: %s", request.method, request.url.path, error)
    return problem_response(error)

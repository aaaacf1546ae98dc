"""The FastAPI plugin: :class:`AgentPlugin` gathers what an app configures, opens the runtime
in the app's lifespan (and in every worker), and installs routes, health and error handling.
``docs/getting-started.md`` walks through it; ``docs/configuration.md`` lists the settings.
"""

from __future__ import annotations

import logging
import re
import weakref
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from fastapi import APIRouter, FastAPI
from fastapi.params import Depends as DependsParam
from pydantic import ValidationError

from agent_plugin import logs
from agent_plugin.compaction import Compaction
from agent_plugin.config import AgentSettings, config_sources
from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.hooks import AgentHooks
from agent_plugin.jobs import JobOptions
from agent_plugin.memory import MemoryStore
from agent_plugin.options import OUTPUT_NAME_PATTERN
from agent_plugin.output import Output, OutputType
from agent_plugin.policy import ToolPolicy
from agent_plugin.proactive import Delivery, Heartbeat
from agent_plugin.providers.base import LlmClient
from agent_plugin.runtime import (
    AgentRuntime,
    ModelFactory,
    RuntimeSpec,
    check_always_on,
    open_runtime,
)
from agent_plugin.sessions import SessionStore
from agent_plugin.skills import Skill
from agent_plugin.tools import Tool
from agent_plugin.toolsets import Toolset
from agent_plugin.web.handle import STATE_KEY, AppAgent
from agent_plugin.web.health import AgentHealth, health_router
from agent_plugin.web.problems import agent_error_handler
from agent_plugin.web.routes import DEFAULT_BODY_LIMIT, agent_router

if TYPE_CHECKING:
    import httpx

    from agent_plugin.pacing import PacingConfig

__all__ = ["AgentPlugin", "Configurer"]

logger = logging.getLogger("agent_plugin")

Configurer: TypeAlias = Callable[[AgentSettings], Mapping[str, Any]]
"""Computes settings overrides from the loaded settings (see :meth:`AgentPlugin.configure`)."""


class AgentPlugin:
    """Adds an agent to a FastAPI app: config, client, stores, routes, health, error mapping.

    Everything can be given to the constructor or added with the builder methods
    (:meth:`tool`, :meth:`tools`, :meth:`hook`, :meth:`skill`, :meth:`followups`,
    :meth:`configure`), which return the plugin so calls chain.

    * ``model``: an :class:`LlmClient` to use instead of the configured provider (no API key is
      then needed, and the plugin does not close it), or a :data:`ModelFactory` called with the
      loaded settings (a client it returns is closed at shutdown; ``None`` falls back to the
      configured provider).
    * ``http_transport``: a callable that makes the httpx transport of the configured
      provider's client, called once per start (the client closes it at shutdown): a proxy or
      TLS setup, or a faster engine under many concurrent runs.
    * ``session_store``: default the SQL store on ``database_url``. ``memory_store``: ``None``
      (the default) gives agents no memory, because a memory scope is shared by everyone who
      uses it; ``"sql"`` uses the SQL store on ``database_url``; or pass any store.
    * ``skills``: :class:`Skill` s, or a folder of ``SKILL.md`` skills read at startup.
    * ``settings``: complete settings to use instead of reading the file and environment;
      ``environ`` and ``config_file`` replace ``os.environ`` and ``AGENT_CONFIG_FILE``.
    * ``auto_migrate``: ``None`` migrates SQLite at startup and only checks PostgreSQL (run
      ``python -m agent_plugin migrate`` as a deploy step); ``True``/``False`` force either.
    * ``health``: the :class:`AgentHealth` component (to tune its cache and time limit).
    * ``delivery``: where the reports of background runs with delivery on go (heartbeat
      ticks, follow-ups, runs enqueued with ``deliver=True``); default a log.
    * ``heartbeat``: a :class:`~agent_plugin.proactive.Heartbeat` the workers tick.
    * ``followups``: the longest delay (a timedelta of at least a minute) of the
      ``schedule_followup`` tool every agent then gets; also :meth:`followups`.
    * ``toolsets``: long-lived sources of tools, such as MCP servers
      (``[MCPServer.stdio(...), MCPServer.http(...)]`` from :mod:`agent_plugin.mcp`), started
      with the app and with every worker, besides those of the ``mcp_servers`` setting.
    * ``jobs``: background runs on arq: ``None`` (the default) turns them on when the plugin
      uses its SQL database anyway (the default stores), ``True`` or a :class:`JobOptions`
      turns them on (opening ``database_url`` for the run records even with in-memory
      stores), ``False`` turns them off.
    * ``secrets``: values to redact by value wherever they appear (events, records, logs,
      errors), beside the configured key and URL passwords, which are always redacted.
    * ``outputs``: output types by name (``{"ticket": Ticket}``, or an
      :class:`~agent_plugin.output.Output` for a mode, retries or validators), which a
      background run names (``enqueue(prompt, output="ticket")``, ``"output": "ticket"`` in
      ``POST {prefix}/runs``); the run's record then holds its output as JSON, and the run
      routes' OpenAPI schema documents them. Also :meth:`output`.
    * ``pacing``: a :class:`~agent_plugin.pacing.PacingConfig` replacing the settings'
      ``pacing_rpm``, ``pacing_tpm`` and ``pacing`` (limits per another window, say); paced
      through Redis with background runs on, in the process otherwise.
    """

    def __init__(
        self,
        *,
        tools: Iterable[Tool] = (),
        toolsets: Iterable[Toolset] = (),
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
        secrets: Iterable[str] = (),
        outputs: Mapping[str, OutputType[Any] | Output[Any]] | None = None,
        pacing: PacingConfig | None = None,
    ) -> None:
        self._tools: list[Tool] = list(tools)
        self._toolsets: list[Toolset] = list(toolsets)
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
        self._running: weakref.WeakKeyDictionary[Any, AppAgent] = weakref.WeakKeyDictionary()
        self._jobs = jobs
        self.secrets = tuple(secrets)
        """Values redacted by value wherever they appear, beside the configured API key and the
        passwords of the configured URLs (a token a tool uses, say)."""
        self.pacing = pacing
        self._outputs: dict[str, Output[Any]] = {}
        for name, output in (outputs or {}).items():
            self.output(name, output)

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
    def registered_outputs(self) -> dict[str, Output[Any]]:
        """The output types a run may name, by name."""
        return dict(self._outputs)

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

    def output(self, name: str, output_type: OutputType[Any] | Output[Any]) -> AgentPlugin:
        """Register an output type under ``name`` (a letter, then up to 63 letters, digits,
        ``_``, ``.`` or ``-``): a type, or an :class:`~agent_plugin.output.Output` with its
        mode, retries and validators. A bad name or type is a ``config`` error now."""
        if not isinstance(name, str) or re.fullmatch(OUTPUT_NAME_PATTERN, name) is None:
            raise AgentError.config(
                f"an output name must be a letter, then up to 63 letters, digits, '_', '.' or "
                f"'-', got {name!r}"
            )
        if name in self._outputs:
            raise AgentError.config(f"an output named {name!r} is registered already")
        try:
            built = output_type if isinstance(output_type, Output) else Output(output_type)
        except AgentError as error:
            problem = error.message.removeprefix("output: ")
            raise AgentError.config(f"output {name!r}: {problem}") from None
        if not built.typed:
            raise AgentError.config(f"output {name!r} is plain text: register a type instead")
        self._outputs[name] = built
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
        wake-up, at most ``max_delay`` from now (at least one minute).

        A booking is a delayed background run in the same session and memory scope, with
        delivery on; a chain of follow-ups stops at ten links. Needs background runs.
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

    def job_options(self) -> JobOptions | None:
        """The background-run options, or ``None`` when background runs are off."""
        option = self._jobs
        stores_need_database = self.session_store is None or self.memory_store == "sql"
        if option is False or (option is None and not stores_need_database):
            return None
        return option if isinstance(option, JobOptions) else JobOptions()

    def spec(self) -> RuntimeSpec:
        """What this plugin opens runtimes from (see :func:`~agent_plugin.runtime.open_runtime`)."""
        options = self.job_options()
        return RuntimeSpec(
            tools=tuple(self._tools),
            toolsets=tuple(self._toolsets),
            hooks=tuple(self._hooks),
            policy=self.policy,
            model=self.model,
            http_transport=self.http_transport,
            session_store=self.session_store,
            memory_store=self.memory_store,
            skills=tuple(self._skills),
            skill_folders=tuple(self._skill_folders),
            compaction=self.compaction,
            delivery=self.delivery,
            heartbeat=self.heartbeat,
            followups=self.followup_max_delay,
            run_records=options is not None,
            auto_migrate=self.auto_migrate,
            secrets=self.secrets,
            environ=dict(self._environ) if self._environ is not None else None,
            outputs=dict(self._outputs),
            pacing=self.pacing,
            key_prefix=None if options is None else options.key_prefix,
        )

    def check_always_on(self) -> None:
        """Check ``delivery``, ``heartbeat`` and ``followups``; a ``config`` error says what is
        wrong (see :func:`~agent_plugin.runtime.check_always_on`)."""
        check_always_on(self.spec())

    # --- startup and shutdown ------------------------------------------------------------

    async def start(self) -> AgentRuntime:
        """Open a runtime: settings, client, database and stores. Fails with AgentError.

        The app's lifespan and every worker call this; ``await runtime.aclose()`` when done.
        """
        logs.install()
        try:
            return await open_runtime(self.spec(), self.load_settings())
        except AgentError as error:
            raise AgentError(
                error.kind,
                f"the agent plugin could not start: {error.message}",
                provider=error.provider,
                status=error.status,
            ) from error

    async def _open(self) -> AppAgent:
        runtime = await self.start()
        options = self.job_options()
        if runtime.runs is None or options is None:
            return AppAgent(runtime)
        from agent_plugin.jobs.queue import RunQueue  # arq, Redis: only with background runs

        return AppAgent(runtime, RunQueue(runtime.settings, runtime.runs, options))

    @staticmethod
    async def _close(agent: AppAgent) -> None:
        try:
            if agent.queue is not None:
                await agent.queue.aclose()
        finally:
            await agent.runtime.aclose()

    @asynccontextmanager
    async def open(self) -> AsyncIterator[AppAgent]:
        """The app's agent outside a FastAPI app (a script, a one-off job): opened on entry,
        closed on exit::

            async with plugin.open() as agent:
                await agent.enqueue("Summarise this week's tickets", session="reports")
        """
        agent = await self._open()
        try:
            yield agent
        finally:
            await self._close(agent)

    @asynccontextmanager
    async def lifespan(self, app: FastAPI) -> AsyncIterator[None]:
        """Start the agent for ``app`` and stop it afterwards: ``FastAPI(lifespan=...)``.

        Entered again for an app it already runs for (a lifespan given to ``FastAPI`` and
        composed by :meth:`install`), it does nothing.
        """
        if app in self._running:
            yield
            return
        agent = await self._open()
        runtime = agent.runtime
        self._running[app] = agent
        setattr(app.state, STATE_KEY, agent)
        self.health.attach(runtime, agent.queue)
        logger.info("agent plugin started: %s", self._started_line(agent))
        try:
            yield
        finally:
            self.health.detach(runtime)
            setattr(app.state, STATE_KEY, None)
            del self._running[app]
            await self._close(agent)
            logger.info("agent plugin stopped")

    def _started_line(self, agent: AppAgent) -> str:
        """What the start-up log line says: the runtime, the queue, where the settings came
        from (passwords masked, never a key)."""
        line = agent.runtime.describe()
        if agent.queue is not None:
            line += f" queue={agent.queue.options.queue_name}"
        return f"{line} settings={self._sources()}"

    def _sources(self) -> str:
        """Where this plugin's settings come from (:func:`~agent_plugin.config.config_sources`)."""
        if self._settings is not None:
            return "given in code"
        return config_sources(self._environ, self._config_file)

    def agent(self, app: FastAPI) -> AppAgent:
        """The agent running for ``app``, for code outside a request (startup tasks, scheduled
        jobs); an ``unavailable`` error before the app started or after it stopped."""
        agent = self._running.get(app)
        if agent is None:
            raise AgentError(
                ErrorKind.UNAVAILABLE, "agent plugin is not installed or has not started"
            )
        return agent

    def runtime(self, app: FastAPI) -> AgentRuntime | None:
        """The runtime running for ``app``, if it started."""
        agent = self._running.get(app)
        return agent.runtime if agent is not None else None

    # --- background runs -----------------------------------------------------------------

    def worker_settings(self, **overrides: Any) -> type[Any]:
        """arq ``WorkerSettings`` that run this plugin's background jobs.

        Put it in a module and start the standard arq CLI on it::

            # yourapp/worker.py
            from yourapp.main import plugin
            WorkerSettings = plugin.worker_settings()

            $ arq yourapp.worker.WorkerSettings

        The worker opens the same runtime as the app (:meth:`start`) and closes it at
        shutdown. ``overrides`` set any other arq worker setting. The settings and the
        always-on options are read when this is called: a bad configuration fails here.
        """
        self.check_always_on()
        options = self.job_options()
        if options is None:
            raise AgentError.config(
                "background runs are off for this plugin (jobs=False, or in-memory stores "
                "only): pass jobs=True to AgentPlugin to keep run records in database_url"
            )
        from agent_plugin.jobs.worker import worker_settings

        return worker_settings(
            self.start,
            self.load_settings(),
            options,
            heartbeat=self.heartbeat,
            sources=self._sources(),
            **overrides,
        )

    # --- installing ----------------------------------------------------------------------

    def install(
        self,
        app: FastAPI,
        *,
        dependencies: Sequence[DependsParam] = (),
        health_route: bool | None = None,
        runs_route: bool = False,
        console: bool = False,
        allow_anonymous: bool = False,
    ) -> None:
        """Add the routes, the error handler and the health route; wrap the app's lifespan.

        ``dependencies`` (e.g. ``[Depends(require_user)]``) guard the agent routes; the
        health routes stay open. Without ``dependencies`` the routes are open to anyone who
        reaches the app, and a warning says so unless ``allow_anonymous=True`` says that is
        meant (a demo, a service behind its own gateway). ``health_route=None`` adds the
        health routes unless the app already has a route at the health path.
        ``runs_route=True`` adds ``POST {prefix}/runs`` and ``console=True`` the run console
        page (see :meth:`router`). The plugin starts before the app's own lifespan and stops
        after it, so the app's startup code can use the agent.
        """
        if getattr(app.state, "agent_plugin", None) is not None:
            raise AgentError.config("an agent plugin is already installed in this app")
        app.state.agent_plugin = self
        prefix, health_path, body_limit = self._layout()
        if not dependencies and not allow_anonymous:
            logger.warning(
                "the agent routes under %s are installed without dependencies: anyone who "
                "reaches the app can list, read%s and cancel runs. Pass dependencies=[...] "
                "(your authentication) to install, or allow_anonymous=True if that is meant",
                prefix,
                ", start" if runs_route else "",
            )
        app.add_exception_handler(AgentError, agent_error_handler)
        app.include_router(
            self.router(
                prefix,
                dependencies=dependencies,
                runs_route=runs_route,
                console=console,
                body_limit=body_limit,
            )
        )
        if health_route is None:
            health_route = not any(
                getattr(route, "path", None) == health_path for route in app.router.routes
            )
            if not health_route:
                logger.warning(
                    "the app has its own route at %s, so the plugin adds no health routes: "
                    "include plugin.health.check (the agent component) in it, and "
                    "plugin.health.readiness() (database, Redis) in a readiness route",
                    health_path,
                )
        if health_route:
            app.include_router(health_router(self.health, health_path))
        original = app.router.lifespan_context

        @asynccontextmanager
        async def lifespan(inner: FastAPI) -> AsyncIterator[Any]:
            async with self.lifespan(inner), original(inner) as state:
                yield state

        app.router.lifespan_context = lifespan

    def _layout(self) -> tuple[str, str, int]:
        """The route prefix, health path and body limit; defaults when the settings do not
        load yet."""
        try:
            settings = self.load_settings()
        except AgentError:  # reported at startup, where every configuration error surfaces
            settings = AgentSettings.model_construct()
        return settings.route_prefix, settings.health_path, settings.max_request_bytes

    def router(
        self,
        prefix: str = "/agent",
        *,
        dependencies: Sequence[DependsParam] = (),
        runs_route: bool = False,
        console: bool = False,
        body_limit: int = DEFAULT_BODY_LIMIT,
    ) -> APIRouter:
        """The agent routes under ``prefix``, all behind ``dependencies``: the tools, and with
        background runs on the run routes (see :func:`~agent_plugin.web.routes.agent_router`).
        Their errors are problem details; a body over ``body_limit`` bytes is a 413.

        Run ids are unguessable (128 random bits), but every caller that passes
        ``dependencies`` can read any run it knows the id of: scope the ids per user in your
        own routes if users must not share them.
        """
        return agent_router(
            prefix,
            dependencies=dependencies,
            background=self.job_options() is not None,
            runs_route=runs_route,
            console=console,
            body_limit=body_limit,
            outputs=self._outputs,
        )

"""The library's logging: which loggers it writes to, the run a record belongs to, and the
filters that put that run on every record and keep secrets out of it.

While a run goes on (in a route or in a worker), :func:`current_run` names it; a
:class:`RunContextFilter` gives each record ``run_id`` and ``session_id`` attributes (``None``
outside a run), so a format can say ``%(run_id)s``. :func:`install` puts that filter and
redaction's :class:`~agent_plugin.redaction.RedactingFilter` on every logger of the library;
the plugin and its workers call it at startup. ``docs/operations/deployment.md`` lists what
each logger reports.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Final

from agent_plugin.redaction import redact_logs

__all__ = ["LOGGERS", "RunContext", "RunContextFilter", "current_run", "install", "run_context"]

LOGGERS: Final = (
    "agent_plugin",
    "agent_plugin.jobs",
    "agent_plugin.live",
    "agent_plugin.proactive",
    "agent_plugin.delivery",
    "agent_plugin.mcp",
    "agent_plugin.sessions",
    "agent_plugin.pricing",
)
"""Every logger the library writes to (each must be listed: :func:`install` filters these
loggers, and a logger's filters do not see the records of its children)."""


@dataclass(frozen=True, slots=True)
class RunContext:
    """The run a piece of work belongs to."""

    run_id: str
    session_id: str | None = None


_CURRENT: ContextVar[RunContext | None] = ContextVar("agent_plugin_run", default=None)


def current_run() -> RunContext | None:
    """The run the calling code works for, or ``None`` outside a run."""
    return _CURRENT.get()


@contextmanager
def run_context(run_id: str, session_id: str | None = None) -> Iterator[RunContext]:
    """Inside, :func:`current_run` is this run (and the tasks started inside inherit it)."""
    context = RunContext(run_id, session_id)
    token = _CURRENT.set(context)
    try:
        yield context
    finally:
        _CURRENT.reset(token)


class RunContextFilter(logging.Filter):
    """Gives each record ``run_id`` and ``session_id`` (the current run's, or ``None``),
    unless the record has them already (``extra=``). Lets every record through."""

    def filter(self, record: logging.LogRecord) -> bool:
        context = _CURRENT.get()
        if not hasattr(record, "run_id"):
            record.run_id = context.run_id if context is not None else None
        if not hasattr(record, "session_id"):
            record.session_id = context.session_id if context is not None else None
        return True


def install(loggers: Iterable[str | logging.Logger] = LOGGERS) -> None:
    """Put a :class:`RunContextFilter` and a redacting filter on each of ``loggers`` (the
    library's by default). Installing twice adds nothing."""
    for target in loggers:
        logger = logging.getLogger(target) if isinstance(target, str) else target
        if not any(isinstance(f, RunContextFilter) for f in logger.filters):
            logger.addFilter(RunContextFilter())
        redact_logs(logger)

"""The worker of ``tests/test_telemetry_jobs.py``: the background-run tests' worker
(:mod:`tests.jobs_app`) with the OpenTelemetry SDK configured globally, as a service would.

Spans go to the file ``OTEL_TEST_SPANS`` as they end, one JSON object a line; metrics go to
``OTEL_TEST_METRICS`` every 200 ms (cumulative, so the last line holds the totals).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricsData,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from tests import jobs_app


class FileSpanExporter(SpanExporter):
    def __init__(self, path: Path) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self.path.open("a", encoding="utf-8") as out:
            for span in spans:
                out.write(json.dumps(json.loads(span.to_json())) + "\n")
        return SpanExportResult.SUCCESS


class FileMetricExporter(MetricExporter):
    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        with self.path.open("a", encoding="utf-8") as out:
            out.write(json.dumps(json.loads(metrics_data.to_json())) + "\n")
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        return None


def _configure() -> None:
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(
        SimpleSpanProcessor(FileSpanExporter(Path(os.environ["OTEL_TEST_SPANS"])))
    )
    trace.set_tracer_provider(tracer_provider)
    reader = PeriodicExportingMetricReader(
        FileMetricExporter(Path(os.environ["OTEL_TEST_METRICS"])), export_interval_millis=200
    )
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))


def __getattr__(name: str) -> Any:
    """``WorkerSettings`` is built when the worker asks for it (not when a test imports)."""
    if name == "WorkerSettings":
        _configure()
        return jobs_app.worker_settings()
    raise AttributeError(name)

"""Render one trace of a span file (one JSON span a line, as the OpenTelemetry SDK's
``ReadableSpan.to_json()`` writes them; ``tests/otel_worker.py`` writes such a file) as an
SVG waterfall, with nothing but the standard library::

    python docs/assets/render_trace.py spans.jsonl "execute_tool effect" trace.svg

The trace drawn is the one holding a span of the given name.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

_SHOWN = (
    "agent_plugin.run.origin",
    "agent_plugin.run.status",
    "gen_ai.usage.input_tokens",
    "gen_ai.usage.output_tokens",
    "gen_ai.response.finish_reasons",
    "agent_plugin.approval.tools",
)
_ROW, _NAMES, _LANE, _TOP = 30, 560, 560, 62


def _time(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def _attributes(span: dict[str, Any]) -> str:
    shown = []
    for key, value in span["attributes"].items():
        if key in _SHOWN:
            text = ",".join(map(str, value)) if isinstance(value, list) else str(value)
            shown.append(f"{key.rsplit('.', 1)[-1]}={text}")
    return " ".join(shown)


def svg(spans: list[dict[str, Any]]) -> str:
    start = min(_time(s["start_time"]) for s in spans)
    total = max(max(_time(s["end_time"]) for s in spans) - start, 1e-6)
    ids = {s["context"]["span_id"] for s in spans}
    children: dict[str | None, list[dict[str, Any]]] = {}
    for span in sorted(spans, key=lambda s: s["start_time"]):
        parent = span["parent_id"] if span["parent_id"] in ids else None
        children.setdefault(parent, []).append(span)
    ordered: list[tuple[int, dict[str, Any]]] = []

    def walk(parent: str | None, depth: int) -> None:
        for span in children.get(parent, []):
            ordered.append((depth, span))
            walk(span["context"]["span_id"], depth + 1)

    walk(None, 0)
    width = _NAMES + _LANE + 90
    height = _TOP + _ROW * len(ordered) + 16
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        'font-family="system-ui, sans-serif" font-size="13">',
        f'<rect width="{width}" height="{height}" fill="#fff"/>',
        f'<text x="12" y="24" font-size="15" font-weight="bold">trace '
        f"{escape(spans[0]['context']['trace_id'])}</text>",
        f'<text x="12" y="44" fill="#666" font-size="12">{len(spans)} spans of the worker, '
        f"{total * 1000:.1f} ms; the top span's parent is the enqueueing request's span, in the "
        "app process</text>",
    ]
    for row, (depth, span) in enumerate(ordered):
        y = _TOP + row * _ROW
        began = _time(span["start_time"]) - start
        lasted = _time(span["end_time"]) - _time(span["start_time"])
        x = _NAMES + began / total * _LANE
        bar = max(lasted / total * _LANE, 2)
        colour = "#d9534f" if span["status"]["status_code"] == "ERROR" else "#4f8edc"
        out += [
            f'<line x1="0" x2="{width}" y1="{y + _ROW}" y2="{y + _ROW}" stroke="#eee"/>',
            f'<text x="{12 + depth * 18}" y="{y + 19}">{escape(span["name"])}'
            f'<tspan fill="#888" font-size="11" dx="8">{escape(_attributes(span))}</tspan></text>',
            f'<rect x="{x:.1f}" y="{y + 9}" width="{bar:.1f}" height="12" rx="2" fill="{colour}"/>',
            f'<text x="{x + bar + 5:.1f}" y="{y + 19}" fill="#555" font-size="11">'
            f"{lasted * 1000:.1f} ms</text>",
        ]
    out.append("</svg>")
    return "\n".join(out)


def main(path: str, holding: str, target: str) -> None:
    spans = [json.loads(line) for line in Path(path).read_text().splitlines() if line]
    (wanted,) = {s["context"]["trace_id"] for s in spans if s["name"] == holding}
    Path(target).write_text(svg([s for s in spans if s["context"]["trace_id"] == wanted]))


if __name__ == "__main__":
    main(*sys.argv[1:4])

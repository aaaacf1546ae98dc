"""The run console: one HTML page that shows a run live and decides its approvals.

No build step and no dependency: plain HTML, a little CSS and a small script that follows
``GET {prefix}/runs/{run_id}/events?follow=true`` with ``EventSource`` and posts decisions to
``POST {prefix}/runs/{run_id}/decisions``. Every piece of run data reaches the page through
``textContent`` (never ``innerHTML``), and the two values put in the page (run id and route
prefix) are HTML-escaped attributes, so nothing a model or a tool writes can run as script.

The page needs the browser to be allowed through the routes' auth dependencies with what it
sends by itself (cookies, or HTTP auth), as ``EventSource`` cannot add headers.
"""

from __future__ import annotations

import base64
import hashlib
import html
from typing import Final

__all__ = ["CONSOLE_HEADERS", "CONSOLE_SCRIPT", "console_page"]

CONSOLE_SCRIPT: Final = r"""
(() => {
  "use strict";
  const body = document.body;
  const runId = body.dataset.runId;
  const base = body.dataset.prefix + "/runs/" + encodeURIComponent(runId);
  const $ = (id) => document.getElementById(id);
  const statusEl = $("status"), logEl = $("log"), approvalsEl = $("approvals");
  const outcomeEl = $("outcome");
  let current = null;        // the text node receiving text deltas of the current reply
  let streamed = false;      // whether the current reply came as deltas
  let finished = false;
  let pending = [];          // calls awaiting a decision
  const choices = new Map(); // call_id -> approval

  function el(tag, cls, text) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }
  function entry(cls, label, text) {
    const row = el("div", "entry " + cls);
    if (label) row.append(el("span", "label", label));
    if (text !== undefined) row.append(el("span", "body", text));
    logEl.append(row);
    row.scrollIntoView({block: "end"});
    return row;
  }
  function setStatus(text, cls) {
    statusEl.textContent = text;
    statusEl.className = "status " + (cls || "");
  }
  function short(text, limit) {
    text = String(text);
    return text.length > limit ? text.slice(0, limit) + "\u2026" : text;
  }
  function json(value) {
    try { return JSON.stringify(value); } catch (e) { return String(value); }
  }

  function renderApprovals(calls) {
    pending = calls || [];
    choices.clear();
    approvalsEl.replaceChildren();
    if (!pending.length) { approvalsEl.hidden = true; return; }
    approvalsEl.hidden = false;
    approvalsEl.append(el("h2", "", "Waiting for your decision"));
    for (const call of pending) {
      const box = el("div", "call");
      box.dataset.callId = call.call_id;
      box.append(el("div", "name", call.name));
      box.append(el("div", "reason", call.reason));
      box.append(el("pre", "args", JSON.stringify(call.arguments, null, 2)));
      const reason = el("input", "reject-reason");
      reason.type = "text";
      reason.placeholder = "reason for rejecting";
      reason.value = "rejected in the console";
      const approve = el("button", "approve", "Approve");
      const reject = el("button", "reject", "Reject");
      approve.type = reject.type = "button";
      approve.addEventListener("click", () => choose(box, call.call_id, {verdict: "approve"}));
      reject.addEventListener("click", () => choose(box, call.call_id,
        {verdict: "reject", reason: reason.value || "rejected in the console"}));
      box.append(approve, reject, reason);
      approvalsEl.append(box);
    }
  }

  function choose(box, callId, approval) {
    choices.set(callId, approval);
    box.classList.add("decided");
    for (const b of box.querySelectorAll("button, input")) b.disabled = true;
    box.append(el("div", "choice", approval.verdict === "approve" ? "approved" : "rejected"));
    if (pending.every((c) => choices.has(c.call_id))) submit();
  }

  async function submit() {
    const decisions = pending.map((c) => ({call_id: c.call_id, approval: choices.get(c.call_id)}));
    setStatus("sending decisions\u2026", "busy");
    try {
      const response = await fetch(base + "/decisions", {
        method: "POST",
        credentials: "same-origin",
        headers: {"content-type": "application/json", "accept": "application/json"},
        body: JSON.stringify(decisions),
      });
      if (!response.ok) {
        let detail = response.statusText;
        try { const problem = await response.json(); detail = problem.detail || detail; }
        catch (e) { /* not JSON */ }
        throw new Error(response.status + " " + detail);
      }
      renderApprovals([]);
      setStatus("resuming\u2026", "busy");
      entry("note", "decided", decisions.map((d) => d.approval.verdict).join(", "));
    } catch (error) {
      setStatus("the decisions were not accepted: " + error.message, "error");
      renderApprovals(pending);
    }
  }

  function endReply() { current = null; }

  const handlers = {
    run_start(e) {
      setStatus(e.resumed ? "resumed" : "running", "busy");
      entry("note", e.resumed ? "resumed" : "started");
    },
    turn_start(e) { setStatus("running: step " + e.step, "busy"); },
    model_request() { streamed = false; endReply(); },
    text_delta(e) {
      streamed = true;
      if (current === null) {
        const row = entry("text", "assistant");
        current = document.createTextNode("");
        row.append(el("span", "body"));
        row.lastChild.append(current);
      }
      current.appendData(e.text);
    },
    thinking_delta(e) { entry("thinking", "thinking", e.text); },
    tool_call_delta(e) { endReply(); },
    retry(e) {
      entry("note", "retry", "attempt " + e.attempt + " of " + e.max_attempts +
        " in " + e.wait_seconds + " s: " + (e.error && e.error.message));
    },
    retry_succeeded(e) { entry("note", "retry", "succeeded after " + e.attempts + " attempts"); },
    retry_exhausted(e) {
      entry("note", "retry", "gave up after " + e.attempts + " failed attempts (" + e.reason + ")");
    },
    model_response(e) {
      if (!streamed && e.message) {
        const text = (e.message.content || []).filter((p) => typeof p.text === "string")
          .map((p) => p.text).join("");
        if (text) entry("text", "assistant", text);
      }
      endReply();
      streamed = false;
    },
    tool_start(e) { entry("tool", "\u2192 " + e.name, short(json(e.arguments), 2000)); },
    tool_end(e) {
      entry(e.is_error ? "tool error" : "tool result", "\u2190 " + e.name, short(e.content, 4000));
    },
    approval_required(e) { setStatus("awaiting approval", "paused"); renderApprovals(e.calls); },
    steered(e) { for (const m of e.messages || []) entry("user", "you", m); },
    compaction(e) {
      entry("note", "compaction", e.reason + ": " + e.summarized_messages + " messages folded");
    },
    turn_end() { endReply(); },
    run_end(e) {
      endReply();
      if (e.error) {
        setStatus("failed", "error");
        outcomeEl.textContent = e.error.kind + ": " + e.error.message;
        return stop();
      }
      const summary = e.summary || {};
      if (summary.status === "awaiting_approval") {
        setStatus("awaiting approval", "paused");
        renderApprovals(summary.awaiting);
        return;
      }
      if (summary.status === "paused") {
        setStatus("paused: " + (summary.reason || ""), "paused");
        return;
      }
      setStatus(summary.status || "ended", summary.status === "completed" ? "done" : "ended");
      const parts = [];
      if (summary.text) parts.push(summary.text);
      if (summary.reason) parts.push(summary.reason);
      if (summary.tool) parts.push(summary.tool + " repeated " + summary.repeats + " times");
      outcomeEl.textContent = parts.join("\n");
      stop();
    },
  };

  let source = null;
  function stop() {
    finished = true;
    renderApprovals([]);
    if (source) source.close();
  }

  function connect() {
    source = new EventSource(base + "/events?follow=true");
    source.onopen = () => { if (!finished) setStatus(statusEl.textContent || "connected"); };
    for (const type of Object.keys(handlers)) {
      source.addEventListener(type, (message) => {
        let data;
        try { data = JSON.parse(message.data); } catch (e) { return; }
        handlers[type](data);
      });
    }
    source.addEventListener("error", (message) => {
      if (message.data) {  // an error event sent by the server
        let info = {};
        try { info = JSON.parse(message.data); } catch (e) { /* keep empty */ }
        setStatus("stream error: " + (info.message || "unknown"), "error");
      } else if (!finished && source.readyState === EventSource.CONNECTING) {
        setStatus("reconnecting\u2026", "busy");
      } else if (!finished && source.readyState === EventSource.CLOSED) {
        setStatus("disconnected", "error");
      }
    });
  }

  setStatus("connecting\u2026", "busy");
  connect();
})();
"""

_STYLE: Final = """
body { font: 15px/1.45 system-ui, sans-serif; margin: 0 auto; max-width: 60rem; padding: 1rem; }
header { display: flex; gap: 1rem; align-items: baseline; flex-wrap: wrap; }
h1 { font-size: 1.2rem; margin: 0; }
code { font-size: .9rem; }
.status { padding: .1rem .6rem; border-radius: 1rem; background: #eee; }
.status.busy { background: #e7f0ff; } .status.paused { background: #fff3cd; }
.status.done { background: #d9f2dc; } .status.error { background: #f8d7da; }
#log { margin: 1rem 0; border-top: 1px solid #ddd; }
.entry { padding: .35rem 0; border-bottom: 1px solid #eee; white-space: pre-wrap;
  overflow-wrap: anywhere; }
.entry .label { font-weight: 600; margin-right: .6rem; color: #555; }
.entry.tool .body, .entry.result .body { font-family: ui-monospace, monospace; font-size: .85rem; }
.entry.error .body { color: #a00; } .entry.thinking { color: #777; font-style: italic; }
.entry.user .label { color: #06c; } .entry.note { color: #777; font-size: .85rem; }
#approvals { border: 2px solid #e0a800; border-radius: .5rem; padding: .5rem 1rem; }
#approvals h2 { font-size: 1rem; margin: .3rem 0; }
.call { padding: .5rem 0; border-top: 1px solid #eee; }
.call .name { font-weight: 600; } .call .reason { color: #555; }
.call pre { background: #f6f6f6; padding: .4rem; overflow: auto; max-height: 12rem; }
.call button { margin-right: .5rem; } .call input { width: 16rem; }
#outcome { white-space: pre-wrap; font-size: 1.05rem; margin-top: 1rem; }
"""

_PAGE: Final = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="robots" content="noindex">
<title>{title}</title>
<style>{style}</style>
</head>
<body data-run-id="{run_id}" data-prefix="{prefix}">
<header><h1>{title}</h1><code>{run_id}</code>
<span id="status" class="status" role="status" aria-live="polite"></span></header>
<section id="approvals" hidden></section>
<main id="log" aria-live="polite"></main>
<section id="outcome"></section>
<script>{script}</script>
</body>
</html>
"""


def _csp_hash(text: str) -> str:
    digest = hashlib.sha256(text.encode()).digest()
    return "'sha256-" + base64.b64encode(digest).decode() + "'"


CONSOLE_HEADERS: Final = {
    "content-security-policy": (
        f"default-src 'none'; script-src {_csp_hash(CONSOLE_SCRIPT)}; "
        f"style-src {_csp_hash(_STYLE)}; connect-src 'self'; base-uri 'none'; "
        "form-action 'none'; frame-ancestors 'none'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
}
"""Headers to serve the page with: a Content Security Policy that lets only the page's own
script and style run (by hash) and the page talk only to its own origin."""


def console_page(run_id: str, *, prefix: str = "/agent", title: str = "Agent run") -> str:
    """The console page of ``run_id`` for the routes under ``prefix`` (e.g. ``/agent``)."""

    def attr(value: str) -> str:
        return html.escape(value, quote=True)

    return _PAGE.format(
        title=attr(title),
        style=_STYLE,
        run_id=attr(run_id),
        prefix=attr(prefix.rstrip("/")),
        script=CONSOLE_SCRIPT,
    )

"""S5's second half: the first request of a freshly started app, in a fresh interpreter.

Times, from the top of this script: importing FastAPI and the plugin, building the app (an
:class:`AgentPlugin` with an in-memory session store and an OpenAI-compatible client pointed at
the model server), running its startup, then its first request (``POST /ask``, which runs the
agent for one tool round: two model calls) and a second one, each through
``httpx.ASGITransport`` (the app's own latency, no HTTP server in front). Also lists the modules
the first request imported: optional backends must not be among them.

    python benchmarks/fresh_app.py http://127.0.0.1:PORT   # prints one JSON line
"""

import time

START = time.perf_counter()

import asyncio  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from typing import Any  # noqa: E402

import httpx  # noqa: E402
from fastapi import FastAPI  # noqa: E402

from agent_plugin.config import AgentSettings  # noqa: E402
from agent_plugin.providers.openai import OpenAICompatibleClient  # noqa: E402
from agent_plugin.sessions import InMemorySessionStore  # noqa: E402
from agent_plugin.tools import FnTool  # noqa: E402
from agent_plugin.web import AgentHandle, AgentPlugin  # noqa: E402

IMPORTED = time.perf_counter()

SCHEMA = {"type": "object", "properties": {"i": {"type": "integer"}}, "required": ["i"]}


async def lookup(arguments: Any) -> Any:
    return {"value": arguments["i"]}


def build_app(model_url: str) -> FastAPI:
    plugin = AgentPlugin(
        tools=[FnTool("lookup", "Looks a number up.", SCHEMA, lookup)],
        model=OpenAICompatibleClient(model="bench-model", base_url=model_url + "/v1"),
        session_store=InMemorySessionStore(),
        settings=AgentSettings(system_prompt="You look numbers up.", max_steps=5),
    )
    app = FastAPI()
    plugin.install(app)

    @app.post("/ask")
    async def ask(body: dict[str, str], agent: AgentHandle) -> dict[str, Any]:
        outcome = (await agent.run(body["prompt"])).outcome
        return {"status": outcome.status, "steps": outcome.steps_used}

    return app


def _top_modules() -> set[str]:
    return {name.partition(".")[0] for name in sys.modules}


async def measure(model_url: str) -> dict[str, Any]:
    app = build_app(model_url)
    built = time.perf_counter()
    async with app.router.lifespan_context(app):
        started = time.perf_counter()
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
            before = _top_modules()
            t0 = time.perf_counter()
            first = await client.post("/ask", json={"prompt": "STEPS=1"})
            t1 = time.perf_counter()
            imported = sorted(_top_modules() - before)
            second = await client.post("/ask", json={"prompt": "STEPS=1"})
            t2 = time.perf_counter()
    for response in (first, second):
        response.raise_for_status()
        if response.json() != {"status": "completed", "steps": 1}:
            raise RuntimeError(f"unexpected answer: {response.text}")
    return {
        "import_s": IMPORTED - START,
        "build_s": built - IMPORTED,
        "startup_s": started - built,
        "first_request_s": t1 - t0,
        "second_request_s": t2 - t1,
        "imported_by_first_request": imported,
    }


if __name__ == "__main__":
    print(json.dumps(asyncio.run(measure(sys.argv[1]))))

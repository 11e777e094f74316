#!/usr/bin/env python3
"""fastmcp 3.4.11 task server (2025-11-25 tasks through fastmcp's Docket backend, in memory).

    python fastmcp_task_server.py [--port N]

Prints one line ``{"listening":"http://127.0.0.1:PORT/mcp","port":PORT,"server":"fastmcp",...}``
on stdout once bound (port 0 = any free port). Stateful streamable HTTP (one session per
Mcp-Session-Id), endpoint /mcp.

``GET /received`` (ours, outside MCP) answers ``{"tasks/cancel": {taskId: count}, ...}``: every
``tasks/*`` request that reached this process, by method and taskId, counted before fastmcp sees
it. It shows whether a gateway forwarded a request (fastmcp's own store cannot: see below).

Tools:
  quick_task  task=True (taskSupport optional)  args {text="quick"}: completes after ~50 ms with
              "quick_task: <text>"
  slow_task   task=True (taskSupport optional)  args {duration_ms=2000}: completes after duration_ms

fastmcp departs from the spec here (the reason this peer is in the harness): tasks/cancel of a
task that already completed is accepted (the spec asks for -32602) and answered
``{"status": "cancelled", "statusMessage": "Task cancelled"}``, as often as it is sent. With the
pinned pydocket 0.27.0 its store keeps ``completed`` (docket's cancel script leaves a terminal run
alone): a later tasks/get says ``completed`` and tasks/result still returns the result, so the
reply contradicts the store. Tasks are not bound to a session (no auth: one anonymous scope), so
any session can tasks/get them; tasks/list answers an empty list.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import socket
import sys

from collections import defaultdict

import uvicorn
from fastmcp import FastMCP

mcp = FastMCP("taskgate-fastmcp-task-fixture")


@mcp.tool(task=True)
async def quick_task(text: str = "quick") -> str:
    """Completes after ~50 ms, echoing text (task optional)."""
    await asyncio.sleep(0.05)
    return f"quick_task: {text}"


@mcp.tool(task=True)
async def slow_task(duration_ms: int = 2000) -> str:
    """Completes after duration_ms (task optional)."""
    await asyncio.sleep(duration_ms / 1000)
    return f"slow_task done after {duration_ms} ms"


RECEIVED: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))


def _note(body: bytes) -> None:
    try:
        msg = json.loads(body)
    except ValueError:
        return
    for m in msg if isinstance(msg, list) else [msg]:
        if isinstance(m, dict) and str(m.get("method", "")).startswith("tasks/"):
            task_id = (m.get("params") or {}).get("taskId", "")
            RECEIVED[m["method"]][str(task_id)] += 1


def with_received_log(app):
    """ASGI wrapper: counts tasks/* requests (see the module docs) and serves GET /received."""

    async def wrapped(scope, receive, send):
        if scope["type"] != "http":
            return await app(scope, receive, send)
        if scope["method"] == "GET" and scope["path"] == "/received":
            body = json.dumps(RECEIVED).encode()
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": body})
            return
        if scope["method"] != "POST":
            return await app(scope, receive, send)
        chunks = []
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        _note(body)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return await app(scope, replay, send)

    return wrapped


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    port = sock.getsockname()[1]

    app = mcp.http_app(path="/mcp", stateless_http=False)
    server = uvicorn.Server(uvicorn.Config(with_received_log(app), log_level="warning", lifespan="on", timeout_graceful_shutdown=1))

    async def announce() -> None:
        while not server.started:
            await asyncio.sleep(0.05)
        print(
            json.dumps(
                {
                    "listening": f"http://127.0.0.1:{port}/mcp",
                    "port": port,
                    "received": f"http://127.0.0.1:{port}/received",
                    "server": "fastmcp",
                    "version": _version(),
                }
            ),
            flush=True,
        )

    # uvicorn handles SIGTERM/SIGINT itself (graceful stop, open SSE streams closed after 1 s).
    announcer = asyncio.create_task(announce())
    await server.serve(sockets=[sock])
    announcer.cancel()


def _version() -> str:
    import fastmcp

    return fastmcp.__version__


if __name__ == "__main__":
    asyncio.run(main())

#!/usr/bin/env python3
"""Task-capable MCP server (2025-11-25 experimental tasks) built with the Python SDK, mcp==1.30.0.

    python py_task_server.py [--port N]     (0 or absent: any free port)
    python py_task_server.py --stdio        (one client on stdin/stdout)

Prints one line {"listening": "http://127.0.0.1:PORT/mcp", "port": PORT, ...} on stdout once the
socket listens. Same tools as task-server.mjs, so task-client.mjs and py_task_client.py both
drive it:

    slow_task     taskSupport required  {duration_ms=1500, steps=5}: progress each step, then completes
    fast_task     taskSupport optional  {text="fast"}: completes after ~50 ms
    failing_task  taskSupport optional  ends `failed` (statusMessage set), tasks/result gives the
                                        stored CallToolResult {isError: true}
    plain_echo    no taskSupport        {text}: answers at once

Low-level Server with server.experimental.enable_tasks() (InMemoryTaskStore, InMemoryTaskMessageQueue)
and ctx.experimental.run_task(work); StreamableHTTPSessionManager in stateful mode (the stateless
mode ends a session's task group, and so its background work, with the request). SSE responses,
DNS-rebinding protection on (Host must be 127.0.0.1/localhost/[::1] with any port), as FastMCP
sets it for a localhost server.

Peculiarities of the SDK worth knowing (seen through the client):
- task ids embed the session scope and contain ':'; tasks/get|result|cancel from another session
  answer -32602 and tasks/list shows only the caller's session's tasks, in one page.
- a required tool called without `task` (and a forbidden one with it) answers a CallToolResult
  {isError: true} whose text comes from the -32601 McpError, not a JSON-RPC error.
- tasks/result on a cancelled task answers an empty result (only the related-task _meta).
- progress: #0 goes on the tools/call POST stream before CreateTaskResult, the later steps and
  notifications/tasks/status go on the session's GET stream.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import socket
import sys
import warnings
from collections.abc import AsyncIterator
from typing import Any

import anyio
import mcp.types as types
import uvicorn
from mcp.server.experimental.task_context import ServerTaskContext
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.experimental.tasks.helpers import is_terminal
from starlette.applications import Starlette
from starlette.routing import Route

# server.experimental warns that the tasks API goes away in mcp 2.0; that is why 1.30.0 is pinned.
warnings.filterwarnings("ignore", category=DeprecationWarning)
log = logging.getLogger("py_task_server")

server: Server[Any, Any] = Server("taskgate-py-task-fixture")
support = server.experimental.enable_tasks()

TOOLS = [
    types.Tool(
        name="slow_task",
        description="Works for duration_ms, reporting progress each of `steps` steps, then completes (task required)",
        inputSchema={
            "type": "object",
            "properties": {
                "duration_ms": {"type": "integer", "minimum": 0, "maximum": 120000, "default": 1500},
                "steps": {"type": "integer", "minimum": 1, "maximum": 100, "default": 5},
            },
        },
        execution=types.ToolExecution(taskSupport=types.TASK_REQUIRED),
    ),
    types.Tool(
        name="fast_task",
        description="Completes after ~50 ms, echoing text (task optional)",
        inputSchema={"type": "object", "properties": {"text": {"type": "string", "default": "fast"}}},
        execution=types.ToolExecution(taskSupport=types.TASK_OPTIONAL),
    ),
    types.Tool(
        name="failing_task",
        description="Ends failed with an isError tool result after ~50 ms (task optional)",
        inputSchema={"type": "object", "properties": {}},
        execution=types.ToolExecution(taskSupport=types.TASK_OPTIONAL),
    ),
    types.Tool(
        name="plain_echo",
        description="Echoes text at once (no task support)",
        inputSchema={"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    ),
]
TASK_MODE = {t.name: (t.execution.taskSupport if t.execution else None) for t in TOOLS}


def text_result(text: str, is_error: bool = False) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], isError=is_error)


@server.list_tools()
async def list_tools() -> list[types.Tool]:
    return TOOLS


async def stopped_by_cancel(task: ServerTaskContext) -> bool:
    """True once the task is terminal in the store (tasks/cancel).

    run_task() completes a task whose work returned unless the context's own snapshot of the task is
    terminal; the snapshot is refreshed here so that a cancelled task is left alone (completing it
    would raise inside the SDK's task group).
    """
    current = await support.store.get_task(task.task_id)
    if current is not None and is_terminal(current.status):
        task._ctx._task = current  # noqa: SLF001 - the SDK offers no public refresh
        return True
    return False


@server.call_tool()
async def call_tool(name: str, arguments: dict[str, Any]) -> types.CallToolResult | types.CreateTaskResult:
    ctx = server.request_context
    if name not in TASK_MODE:
        raise ValueError(f"unknown tool {name}")
    # Raises McpError(-32601) for required-without-task and forbidden-with-task; the SDK's
    # call_tool wrapper turns it into a CallToolResult {isError: true}.
    ctx.experimental.validate_task_mode(TASK_MODE[name])

    if name == "plain_echo":
        return text_result(f"echo: {arguments['text']}")

    if name == "fast_task":
        result = text_result(f"fast_task: {arguments.get('text', 'fast')}")
        if not ctx.experimental.is_task:
            await anyio.sleep(0.05)
            return result

        async def fast_work(task: ServerTaskContext) -> types.CallToolResult:
            await anyio.sleep(0.05)
            await stopped_by_cancel(task)
            return result

        return await ctx.experimental.run_task(fast_work)

    if name == "failing_task":
        failure = text_result("failing_task failed on purpose", is_error=True)
        if not ctx.experimental.is_task:
            return failure

        async def failing_work(task: ServerTaskContext) -> types.CallToolResult:
            await anyio.sleep(0.05)
            if not await stopped_by_cancel(task):
                # Keep the isError result for tasks/result, and end the task `failed`.
                await support.store.store_result(task.task_id, failure)
                await task.fail("failing_task failed on purpose")
            return failure

        return await ctx.experimental.run_task(failing_work)

    # slow_task (always a task here)
    duration_ms = int(arguments.get("duration_ms", 1500))
    steps = int(arguments.get("steps", 5))
    session = ctx.session
    token = ctx.meta.progressToken if ctx.meta is not None else None
    if token is not None:
        # Step 0 rides on this POST's SSE stream, before the CreateTaskResult.
        await session.send_progress_notification(token, 0, steps, f"step 0/{steps}", related_request_id=ctx.request_id)

    async def slow_work(task: ServerTaskContext) -> types.CallToolResult:
        for step in range(1, steps + 1):
            await anyio.sleep(duration_ms / steps / 1000)
            if await stopped_by_cancel(task):
                log.info("task %s cancelled: work stopped at step %d/%d", task.task_id, step, steps)
                return text_result("cancelled")
            if token is not None:
                # Later steps: no related request any more, so they go to the GET stream.
                with contextlib.suppress(Exception):
                    await session.send_progress_notification(token, step, steps, f"step {step}/{steps}")
        return text_result(f"slow_task done after {duration_ms} ms in {steps} steps")

    return await ctx.experimental.run_task(slow_work)


class McpEndpoint:
    """ASGI endpoint handing every /mcp request to the session manager (a Route, not a Mount: no /mcp/ redirect)."""

    def __init__(self, manager: StreamableHTTPSessionManager) -> None:
        self.manager = manager

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.manager.handle_request(scope, receive, send)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--stdio", action="store_true", help="serve one client on stdin/stdout instead (stdio.sh)")
    parser.add_argument("--tls-cert", help="serve https:// with this PEM certificate (and --tls-key): taskgate's https upstreams")
    parser.add_argument("--tls-key", help="the PEM private key of --tls-cert")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="[py-task-server] %(levelname)s %(name)s: %(message)s")

    if args.stdio:
        # One client on stdin/stdout (what taskgate's `command` upstreams start); stdout carries
        # only JSON-RPC, logs go to stderr.
        from mcp.server.stdio import stdio_server

        async def serve_stdio() -> None:
            async with stdio_server() as (read, write):
                await server.run(read, write, server.create_initialization_options())

        anyio.run(serve_stdio)
        return

    manager = StreamableHTTPSessionManager(
        app=server,
        stateless=False,
        json_response=False,
        security_settings=TransportSecuritySettings(
            enable_dns_rebinding_protection=True,
            allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"],
            allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
        ),
    )

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    sock.listen(128)  # connections queue from now on, before uvicorn accepts them
    port = sock.getsockname()[1]

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        async with manager.run():
            scheme = "https" if args.tls_cert else "http"
            print(json.dumps({"listening": f"{scheme}://127.0.0.1:{port}/mcp", "port": port, "server": "py-task-fixture", "mode": "stateful"}), flush=True)
            yield

    app = Starlette(routes=[Route("/mcp", endpoint=McpEndpoint(manager), methods=["GET", "POST", "DELETE"])], lifespan=lifespan)
    tls = {"ssl_certfile": args.tls_cert, "ssl_keyfile": args.tls_key} if args.tls_cert else {}
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2, **tls)
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()

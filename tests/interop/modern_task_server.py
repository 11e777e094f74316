#!/usr/bin/env python3
"""FastMCP 4.1.4 + fastmcp-tasks 4.1.4 fixture: a 2026-07-28 server with the tasks extension.

    python modern_task_server.py [--port N]       (or MODERN_PORT=N; 0 = any free port)

Runs in .venv-modern (requirements-modern.txt). Prints one line
``{"listening":"http://127.0.0.1:PORT/mcp","port":PORT,"received":...,"server":"fastmcp4",...}`` on
stdout once bound. Streamable HTTP on /mcp, both eras on one endpoint (2025 ``initialize`` sessions
and stateless 2026-07-28 requests). Tasks run in pydocket's in-memory backend (``memory://``).

It implements the fixture tools of the conformance suite 0.2.0-alpha.12 server scenarios (the
tasks-* ones in full; the names and behaviour come from the scenarios' descriptions, the code is
ours):

  greet(name)                 sync only: "Hello, {name}!"
  slow_compute(seconds,label) task optional: sleeps `seconds`, then "slow_compute(label) done after
                              Ns"; a tasks/cancel while it runs ends it `cancelled`
  failing_job()               task required (-32021 without the extension): after ~1 s a tool error
                              (the task ends `completed` with isError)
  protocol_error_job()        task optional: raises a JSON-RPC error (the task ends `failed`)
  confirm_delete(filename)    task optional: asks one elicitation/create (input_required, answered
                              through tasks/update), then completes
  multi_input()               task optional: asks two elicitations at once, completes when both are
                              answered (partial answers keep it input_required)
  test_tool_with_task()       MRTR, then task: without inputResponses an InputRequiredResult asking
                              for user_name; with them a task whose result names the user

and, ours (not the suite's):

  slow_required(seconds)      task required (-32021 without the extension): sleeps `seconds` (default
                              30); a tasks/cancel while it runs ends it `cancelled` (the bridge
                              clients' cancel of an upgraded plain call)

plus the plain tools/resources/prompts of the suite's everything-server (test_simple_text,
test_image_content, ..., test://static-text, test_simple_prompt, ...). What this fixture does not
implement fails direct and is listed in conformance-next-expected-failures.txt.

``GET /received`` (ours, outside MCP): ``{"tasks/cancel": {taskId: count}, ...}``, every ``tasks/*``
request that reached this process, counted before FastMCP sees it. ``GET /requests`` (ours): every
JSON-RPC request or notification that reached this process, in order, as ``{"method", "name"
(params.name, uri or taskId), "arguments", "mcpMethod", "mcpName"}`` (the last two: the
``Mcp-Method`` and ``Mcp-Name`` headers it came with, as sent, or null), for the routing-header
checks (routing-headers.mjs).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import logging
import os
import socket
import sys
import threading
from collections import defaultdict
from datetime import timedelta
from typing import Any

import mcp_types
import uvicorn
from fastmcp import Context, FastMCP
from fastmcp.exceptions import ToolError
from fastmcp.prompts import Message
from fastmcp.utilities.tasks import TaskConfig
from fastmcp_tasks import TasksExtension
from fastmcp_tasks.creation import create_task
from mcp.shared.exceptions import MCPError

# 1x1 red PNG and a tiny WAV header, for the content-type tools.
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
WAV = base64.b64encode(
    b"RIFF$\x00\x00\x00WAVEfmt \x10\x00\x00\x00\x01\x00\x01\x00\x44\xac\x00\x00\x88X\x01\x00\x02\x00\x10\x00data\x00\x00\x00\x00"
).decode()


class FixtureTasks(TasksExtension):
    """The tasks extension, plus MRTR-then-task for test_tool_with_task: its first round (no
    inputResponses) runs in the foreground and returns an InputRequiredResult; the round that
    carries the answers becomes a task."""

    async def intercept_tool_call(self, params, context, call_next):
        if params.name == "test_tool_with_task":
            if not params.input_responses:
                return await call_next()
            tool = await context.fastmcp.get_tool(params.name)
            args = dict(params.arguments or {})
            args["user_name"] = _answer_text(params.input_responses, "user_name")
            return await create_task(tool, args, context)
        return await super().intercept_tool_call(params, context, call_next)


mcp = FastMCP("taskgate-modern-task-fixture")
# Up to 50 tasks at once: a gateway that loses a cancel leaves 60 s slow_compute runs behind, which
# must not starve the checks that follow.
mcp.add_extension(FixtureTasks(concurrency=50))
# Clients are told to poll every 500 ms (fastmcp-tasks says 5 s by default), which keeps runs short.
POLL = timedelta(milliseconds=500)


def _elicit(message: str, props: dict[str, Any], required: list[str]) -> mcp_types.ElicitRequest:
    return mcp_types.ElicitRequest.model_validate(
        {
            "method": "elicitation/create",
            "params": {
                "mode": "form",
                "message": message,
                "requestedSchema": {"type": "object", "properties": props, "required": required},
            },
        }
    )


def _answer_text(responses: Any, key: str | None = None) -> str:
    """A readable rendering of one answer (the given key, else the first)."""
    if not responses:
        return ""
    items = dict(responses)
    value = items.get(key) if key in items else next(iter(items.values()))
    if hasattr(value, "model_dump"):
        value = value.model_dump(by_alias=True, mode="json", exclude_none=True)
    content = value.get("content") if isinstance(value, dict) else None
    if isinstance(content, dict):
        for field in ("name", "user_name", "value", "input"):
            if field in content:
                return str(content[field])
        return json.dumps(content, sort_keys=True)
    return json.dumps(value, sort_keys=True)


# ---- the tasks-* fixture tools ------------------------------------------------------------------


@mcp.tool
async def greet(name: str = "World") -> str:
    """Sync only: Hello, {name}!"""
    return f"Hello, {name}!"


@mcp.tool(task=TaskConfig(mode="optional", poll_interval=POLL))
async def slow_compute(seconds: float = 1, label: str = "") -> str:
    """Sleeps `seconds`, then returns; runs as a task when the request declares the extension."""
    await asyncio.sleep(seconds)
    return f"slow_compute({label}) done after {seconds}s"


@mcp.tool(task=TaskConfig(mode="required", poll_interval=POLL))
async def failing_job() -> str:
    """Task only; after ~1 s a tool execution error (completed + isError)."""
    await asyncio.sleep(1)
    raise ToolError("failing_job: the job failed on purpose")


@mcp.tool(task=TaskConfig(mode="required", poll_interval=POLL))
async def slow_required(seconds: float = 30) -> str:
    """Task only; sleeps `seconds`, then returns (a tasks/cancel ends it cancelled)."""
    await asyncio.sleep(seconds)
    return f"slow_required done after {seconds}s"


@mcp.tool(task=TaskConfig(mode="optional", poll_interval=POLL))
async def protocol_error_job() -> str:
    """Raises a JSON-RPC error: the task ends failed with error {code, message}."""
    await asyncio.sleep(0.1)
    raise MCPError(code=-32603, message="protocol_error_job: internal failure on purpose")


@mcp.tool(task=TaskConfig(mode="optional", poll_interval=POLL))
async def confirm_delete(ctx: Context, filename: str = "file.txt"):
    """Asks one confirmation (elicitation/create), then completes with what was answered."""
    answers = ctx.input_responses
    if not answers:
        return mcp_types.InputRequiredResult(
            input_requests={
                "confirm": _elicit(f"Delete {filename}?", {"confirm": {"type": "boolean"}}, ["confirm"])
            }
        )
    return f"confirm_delete({filename}): {_answer_text(answers, 'confirm')}"


@mcp.tool(task=TaskConfig(mode="optional", poll_interval=POLL))
async def multi_input(ctx: Context):
    """Asks two elicitations at once; completes when both are answered."""
    answers = dict(ctx.input_responses or {})
    missing = {
        key: _elicit(f"Input {key}?", {"name": {"type": "string"}, "confirm": {"type": "boolean"}}, ["name"])
        for key in ("first", "second")
        if key not in answers
    }
    if missing:
        return mcp_types.InputRequiredResult(input_requests=missing)
    return f"multi_input: {_answer_text(answers, 'first')}, {_answer_text(answers, 'second')}"


@mcp.tool(task=TaskConfig(mode="optional", poll_interval=POLL))
async def test_tool_with_task(ctx: Context, user_name: str = ""):
    """MRTR, then a task (see FixtureTasks): asks user_name, the task's result names the user."""
    if not user_name:
        return mcp_types.InputRequiredResult(
            input_requests={"user_name": _elicit("Your name?", {"name": {"type": "string"}}, ["name"])}
        )
    await asyncio.sleep(0.2)
    return f"Hello from the task, {user_name}!"


# ---- the plain tools, resources and prompts of the suite -----------------------------------------


@mcp.tool
async def test_simple_text() -> str:
    """Simple text content."""
    return "This is a simple text response for testing."


@mcp.tool
async def test_image_content() -> list:
    """Image content (PNG)."""
    return [mcp_types.ImageContent(type="image", data=PNG, mime_type="image/png")]


@mcp.tool
async def test_audio_content() -> list:
    """Audio content (WAV)."""
    return [mcp_types.AudioContent(type="audio", data=WAV, mime_type="audio/wav")]


@mcp.tool
async def test_embedded_resource() -> list:
    """An embedded text resource."""
    return [
        mcp_types.EmbeddedResource(
            type="resource",
            resource=mcp_types.TextResourceContents(
                uri="test://embedded-resource", mime_type="text/plain", text="This is an embedded resource content."
            ),
        )
    ]


@mcp.tool
async def test_multiple_content_types() -> list:
    """Text, image and resource content."""
    return [
        mcp_types.TextContent(type="text", text="Multiple content types test:"),
        mcp_types.ImageContent(type="image", data=PNG, mime_type="image/png"),
        mcp_types.EmbeddedResource(
            type="resource",
            resource=mcp_types.TextResourceContents(
                uri="test://mixed-content-resource", mime_type="application/json", text='{"test":"data","value":123}'
            ),
        ),
    ]


@mcp.tool
async def test_tool_with_logging(ctx: Context) -> str:
    """Logs three messages while it runs."""
    for text in ("Tool execution started", "Tool processing data", "Tool execution completed"):
        await ctx.info(text)
        await asyncio.sleep(0.05)
    return "Tool with logging executed successfully"


@mcp.tool
async def test_tool_with_progress(ctx: Context) -> str:
    """Reports progress 0, 50, 100."""
    for step in (0, 50, 100):
        await ctx.report_progress(step, 100, f"step {step}")
        await asyncio.sleep(0.05)
    return "Tool with progress executed successfully"


@mcp.tool
async def test_error_handling() -> str:
    """Always a tool error."""
    raise ToolError("This tool intentionally returns an error for testing")


@mcp.resource("test://static-text", mime_type="text/plain")
def static_text() -> str:
    return "This is the content of the static text resource."


@mcp.resource("test://static-binary", mime_type="image/png")
def static_binary() -> bytes:
    return base64.b64decode(PNG)


@mcp.resource("test://template/{id}/data", mime_type="application/json")
def template_data(id: str) -> str:
    return json.dumps({"id": id, "templateTest": True, "data": f"Data for ID: {id}"})


@mcp.resource("test://watched-resource", mime_type="text/plain")
def watched() -> str:
    return "Watched resource content"


@mcp.prompt
def test_simple_prompt() -> str:
    """A prompt without arguments."""
    return "This is a simple prompt for testing."


@mcp.prompt
def test_prompt_with_arguments(arg1: str, arg2: str) -> str:
    """A prompt with two arguments."""
    return f"Prompt with arguments: arg1='{arg1}', arg2='{arg2}'"


@mcp.prompt
def test_prompt_with_embedded_resource(resourceUri: str) -> list:
    """A prompt embedding a resource."""
    return [
        Message(
            mcp_types.EmbeddedResource(
                type="resource",
                resource=mcp_types.TextResourceContents(
                    uri=resourceUri, mime_type="text/plain", text="Embedded resource content for testing."
                ),
            )
        ),
        Message("Please process the embedded resource above."),
    ]


@mcp.prompt
def test_prompt_with_image() -> list:
    """A prompt with an image."""
    return [
        Message(mcp_types.ImageContent(type="image", data=PNG, mime_type="image/png")),
        Message("Please analyze the image above."),
    ]


# ---- transport -----------------------------------------------------------------------------------

RECEIVED: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
REQUESTS: list[dict[str, Any]] = []


def _note(body: bytes, headers: dict[bytes, bytes]) -> None:
    try:
        msg = json.loads(body)
    except ValueError:
        return

    def header(name: bytes) -> str | None:
        return headers[name].decode("latin-1") if name in headers else None

    for m in msg if isinstance(msg, list) else [msg]:
        if not isinstance(m, dict) or "method" not in m:
            continue
        params = m.get("params") if isinstance(m.get("params"), dict) else {}
        if str(m["method"]).startswith("tasks/"):
            RECEIVED[m["method"]][str(params.get("taskId", ""))] += 1
        REQUESTS.append(
            {
                "method": m["method"],
                "name": params.get("name", params.get("uri", params.get("taskId"))),
                "arguments": params.get("arguments"),
                "mcpMethod": header(b"mcp-method"),
                "mcpName": header(b"mcp-name"),
            }
        )


def with_received_log(app):
    """ASGI wrapper: counts tasks/* requests and logs every request; serves GET /received and
    GET /requests."""

    async def wrapped(scope, receive, send):
        if scope["type"] != "http":
            return await app(scope, receive, send)
        if scope["method"] == "GET" and scope["path"] in ("/received", "/requests"):
            body = json.dumps(RECEIVED if scope["path"] == "/received" else REQUESTS).encode()
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
        _note(body, dict(scope["headers"]))
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return await app(scope, replay, send)

    return wrapped


class QuickExitServer(uvicorn.Server):
    """uvicorn, but a stop signal ends the process within ~2 s even while tasks still run (the
    worker's shutdown would otherwise wait for, say, a 60 s slow_compute nobody cancelled)."""

    def handle_exit(self, sig, frame):
        threading.Timer(2.0, os._exit, args=(0,)).start()
        super().handle_exit(sig, frame)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=int(os.environ.get("MODERN_PORT", "0")))
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    port = sock.getsockname()[1]

    app = mcp.http_app(path="/mcp")
    server = QuickExitServer(
        uvicorn.Config(with_received_log(app), log_level="warning", lifespan="on", timeout_graceful_shutdown=1)
    )

    async def announce() -> None:
        while not server.started:
            await asyncio.sleep(0.05)
        import fastmcp

        print(
            json.dumps(
                {
                    "listening": f"http://127.0.0.1:{port}/mcp",
                    "port": port,
                    "received": f"http://127.0.0.1:{port}/received",
                    "requests": f"http://127.0.0.1:{port}/requests",
                    "server": "fastmcp4",
                    "version": fastmcp.__version__,
                }
            ),
            flush=True,
        )

    announcer = asyncio.create_task(announce())
    await server.serve(sockets=[sock])
    announcer.cancel()


if __name__ == "__main__":
    asyncio.run(main())

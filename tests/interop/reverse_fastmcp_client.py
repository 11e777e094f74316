#!/usr/bin/env python3
"""fastmcp.Client 4.1.4 (with fastmcp-tasks' client extension), a 2026-07-28 client, driving a
2025-11-25 task server's tools (task-server.mjs or py_task_server.py), direct or through taskgate
(issue 33, the reverse bridge).

    python reverse_fastmcp_client.py URL [--label L] [--json FILE]

Runs in .venv-modern. The client picks the era itself: it asks server/discover and speaks
2026-07-28 when 2026-07-28 is among the supported versions (through taskgate), else falls back to
a 2025-11-25 initialize session (directly against a 1.x server), where its task API has no
2025 form. Steps, one check each:

    era-2026               the session speaks 2026-07-28 (server/discover answered)
    list-tools             slow_task, fast_task, failing_task, plain_echo listed
    plain-call             plain_echo answers its text
    task-transparent       call_tool on slow_task (taskSupport required) runs it as a task and
                           returns its result
    task-handle-created    call_tool_task: a task id, status working
    task-handle-wait       the task reaches completed
    task-handle-result     its CallToolResult
    failed-keeps-content   failing_task as a task: isError with the tool's own text
    cancel-created         a 60 s slow_task as a task
    cancel-ack             tasks/cancel acknowledged
    cancel-settles         the task then reads cancelled

Prints `PASS`/`FAIL` per check and `N/M passed`; exit 0 only when all passed. --json FILE:
{label, ok, passed, total, checks, ms}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

from fastmcp import Client
from fastmcp.exceptions import ToolError
from fastmcp_tasks.client import call_tool_task

CHECKS: list[dict] = []


def check(name: str, ok: bool, detail: object = "") -> None:
    CHECKS.append({"name": name, "ok": bool(ok), "detail": "" if ok else str(detail)[:400]})
    print(f"PASS {name}" if ok else f"FAIL {name}: {str(detail)[:400]}", flush=True)


def skipped(*names: str) -> None:
    for name in names:
        check(name, False, "skipped: no task was created")


def text_of(result) -> str:
    for block in getattr(result, "content", None) or []:
        if getattr(block, "text", None):
            return block.text
    return ""


async def attempt(name: str, coro, verify):
    try:
        value = await asyncio.wait_for(coro, 30)
    except Exception as error:  # noqa: BLE001: a failed check names what went wrong
        check(name, False, f"{type(error).__name__}: {error}")
        return None
    try:
        ok, detail = verify(value)
    except Exception as error:  # noqa: BLE001
        ok, detail = False, f"{type(error).__name__}: {error}"
    check(name, ok, detail)
    return value


def negotiated(client) -> str:
    """The protocol version the client's session speaks, as far as fastmcp shows it."""
    session = getattr(client, "session", None)
    for holder in (client, session):
        for attr in ("protocol_version", "negotiated_version", "_protocol_version"):
            v = getattr(holder, attr, None)
            if isinstance(v, str):
                return v
    init = getattr(client, "initialize_result", None)
    return str(getattr(init, "protocolVersion", "") or getattr(init, "protocol_version", "") or "")


async def run(url: str) -> None:
    async with Client(url, timeout=30) as client:
        version = negotiated(client)
        check("era-2026", version >= "2026-07-28", version or "unknown")
        tools = await client.list_tools()
        names = {t.name for t in tools}
        check("list-tools", {"slow_task", "fast_task", "failing_task", "plain_echo"} <= names, sorted(names))

        await attempt("plain-call", client.call_tool("plain_echo", {"text": "fastmcp"}), lambda r: ("fastmcp" in text_of(r), r))
        await attempt(
            "task-transparent",
            client.call_tool("slow_task", {"duration_ms": 400, "steps": 2}, raise_on_error=False),
            lambda r: ("slow_task done" in text_of(r) and not r.is_error, r),
        )

        task = await attempt(
            "task-handle-created",
            call_tool_task(client, "slow_task", {"duration_ms": 800, "steps": 2}),
            lambda t: (bool(t.task_id) and t.create_result.status == "working", t.create_result),
        )
        if task is not None:
            await attempt("task-handle-wait", task.wait(timeout=20), lambda s: (s.status == "completed", s))
            await attempt("task-handle-result", task.result(), lambda r: ("slow_task done" in text_of(r), r))
        else:
            skipped("task-handle-wait", "task-handle-result")

        async def failed():
            t = await call_tool_task(client, "failing_task", {})
            await t.wait(timeout=20)
            try:
                r = await t.result()
                return ("result", bool(getattr(r, "is_error", False)), text_of(r))
            except ToolError as e:
                return ("raised", True, str(e))

        await attempt("failed-keeps-content", failed(), lambda v: (v[1] and "failed on purpose" in v[2], v))

        long = await attempt(
            "cancel-created",
            call_tool_task(client, "slow_task", {"duration_ms": 60000, "steps": 60}),
            lambda t: (bool(t.task_id), t.create_result),
        )
        if long is not None:
            await attempt("cancel-ack", long.cancel(), lambda _: (True, ""))
            await attempt("cancel-settles", long.wait(timeout=15), lambda s: (s.status == "cancelled", s))
        else:
            skipped("cancel-ack", "cancel-settles")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--label", default="reverse-fastmcp")
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    t0 = time.monotonic()
    try:
        asyncio.run(asyncio.wait_for(run(args.url), 150))
    except Exception as error:  # noqa: BLE001
        check("client-session", False, f"{type(error).__name__}: {error}")
    passed = sum(c["ok"] for c in CHECKS)
    print(f"{args.label}: {passed}/{len(CHECKS)} passed", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"label": args.label, "ok": passed == len(CHECKS), "passed": passed, "total": len(CHECKS), "checks": CHECKS, "ms": int((time.monotonic() - t0) * 1000)},
                f,
                indent=1,
            )
    sys.exit(0 if passed == len(CHECKS) else 1)


if __name__ == "__main__":
    main()

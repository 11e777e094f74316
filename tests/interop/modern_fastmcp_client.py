#!/usr/bin/env python3
"""fastmcp.Client 4.1.4 (with fastmcp-tasks' client extension) driving modern_task_server.py's tasks.

    python modern_fastmcp_client.py URL [--label L] [--json FILE]

Runs in .venv-modern. The client picks the era itself (2026-07-28 against FastMCP 4) and declares
the tasks extension on every request. Checks: transparent polling through `call_tool`, an explicit
`ToolTask` (status, wait, result), a task asking for input answered through the client's
elicitation handler (tasks/update), cancel, tool error and protocol error. Prints `PASS`/`FAIL` per
check and `N/M passed`; exit 0 only when all passed. --json FILE: {label, ok, checks, ms}.
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
ELICITATIONS: list[str] = []


def check(name: str, ok: bool, detail: object = "") -> None:
    CHECKS.append({"name": name, "ok": bool(ok), "detail": "" if ok else str(detail)[:400]})
    print(f"PASS {name}" if ok else f"FAIL {name}: {str(detail)[:400]}", flush=True)


def text_of(result) -> str:
    for block in getattr(result, "content", None) or []:
        if getattr(block, "text", None):
            return block.text
    return ""


async def on_elicit(message, response_type, params, context):
    ELICITATIONS.append(message)
    return {"confirm": True}


async def attempt(name: str, coro, verify):
    try:
        value = await asyncio.wait_for(coro, 30)
    except Exception as error:  # noqa: BLE001: a failed check names what went wrong
        check(name, False, f"{type(error).__name__}: {error}")
        return None
    ok, detail = verify(value)
    check(name, ok, detail)
    return value


async def run(url: str) -> None:
    async with Client(url, elicitation_handler=on_elicit, timeout=30) as client:
        tools = await client.list_tools()
        names = {t.name for t in tools}
        check("list-tools", {"greet", "slow_compute", "confirm_delete"} <= names, sorted(names))

        await attempt("sync-call", client.call_tool("greet", {"name": "fastmcp"}), lambda r: (text_of(r) == "Hello, fastmcp!", r))
        await attempt(
            "task-transparent-polling",
            client.call_tool("slow_compute", {"seconds": 0.5, "label": "transparent"}),
            lambda r: ("transparent" in text_of(r) and not r.is_error, r),
        )

        task = await attempt(
            "task-handle-created",
            call_tool_task(client, "slow_compute", {"seconds": 1, "label": "handle"}),
            lambda t: (bool(t.task_id) and t.create_result.status == "working", t.create_result),
        )
        if task is not None:
            await attempt("task-handle-status", task.status(), lambda s: (s.status in ("working", "completed"), s))
            await attempt("task-handle-wait-completed", task.wait(timeout=20), lambda s: (s.status == "completed", s))
            await attempt("task-handle-result", task.result(), lambda r: ("handle" in text_of(r), r))

        before = len(ELICITATIONS)
        await attempt(
            "task-input-answered-via-tasks-update",
            client.call_tool("confirm_delete", {"filename": "fastmcp.txt"}),
            lambda r: ("confirm" in text_of(r) and len(ELICITATIONS) == before + 1, (r, ELICITATIONS)),
        )

        long = await attempt(
            "cancel-task-created",
            call_tool_task(client, "slow_compute", {"seconds": 60, "label": "cancel"}),
            lambda t: (bool(t.task_id), t.create_result),
        )
        if long is not None:
            await attempt("cancel-ack", long.cancel(), lambda _: (True, ""))
            await attempt("cancel-settles-cancelled", long.wait(timeout=15), lambda s: (s.status == "cancelled", s))

        async def tool_error():
            try:
                r = await client.call_tool("failing_job", {}, raise_on_error=False)
                return ("result", r.is_error, text_of(r))
            except ToolError as e:
                return ("raised", True, str(e))

        await attempt("tool-error-is-error", tool_error(), lambda v: (v[1] and "failed on purpose" in v[2], v))

        async def protocol_error():
            try:
                r = await client.call_tool("protocol_error_job", {})
                return ("result", text_of(r))
            except ToolError as e:
                return ("raised", str(e))

        await attempt("protocol-error-raises", protocol_error(), lambda v: (v[0] == "raised" and "internal failure" in v[1], v))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--label", default="fastmcp-client")
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
            json.dump({"label": args.label, "ok": passed == len(CHECKS), "checks": CHECKS, "ms": int((time.monotonic() - t0) * 1000)}, f, indent=1)
    sys.exit(0 if passed == len(CHECKS) else 1)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""fastmcp.Client 4.1.4 with fastmcp-tasks 4.1.4's client extension, a 2026-07-28 task client,
against a server WITHOUT task support (gateway-task-server.mjs, TypeScript SDK 2025-11-25)
through taskgate with `tasks = "gateway"` (issue 32): taskgate runs the tasks itself, and the
reverse bridge carries the plain calls to the 2025-11-25 server.

    python gateway_task_fastmcp_client.py URL [--label L] [--json FILE]

Runs in .venv-modern. Steps, one check each:

    era-2026            the session speaks 2026-07-28 (server/discover answered)
    list-tools          slow, fail, oops, stats, ask listed
    plain-call          stats answers (a plain call passes through)
    task-created        call_tool_task(slow): a gateway task (tgt-...), working
    task-completed      it reaches completed
    task-result         its CallToolResult ("slow done")
    rpc-error-failed    fail (a JSON-RPC error) ends failed
    input-answered      ask: the server's elicitation/create is the task's inputRequests, the
                        client's elicitation_handler answers it (tasks/update), the server gets
                        the answer and the result carries it
    cancel-ack          tasks/cancel of a working slow acknowledged
    cancel-settles      the task then reads cancelled
    server-saw-cancel   the server's handler was aborted (stats.aborted grew)

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
from fastmcp_tasks.client import call_tool_task

CHECKS: list[dict] = []
ASKED: list[str] = []


def check(name: str, ok: bool, detail: object = "") -> None:
    CHECKS.append({"name": name, "ok": bool(ok), "detail": "" if ok else str(detail)[:400]})
    print(f"PASS {name}" if ok else f"FAIL {name}: {str(detail)[:400]}", flush=True)


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


async def elicit(message, response_type, params, context):
    ASKED.append(message)
    return {"ok": True}


def negotiated(client) -> str:
    session = getattr(client, "session", None)
    for holder in (client, session):
        for attr in ("protocol_version", "negotiated_version", "_protocol_version"):
            v = getattr(holder, attr, None)
            if isinstance(v, str):
                return v
    init = getattr(client, "initialize_result", None)
    return str(getattr(init, "protocolVersion", "") or getattr(init, "protocol_version", "") or "")


async def stats(client) -> dict:
    return json.loads(text_of(await client.call_tool("stats", {})))


async def run(url: str) -> None:
    async with Client(url, timeout=30, elicitation_handler=elicit) as client:
        version = negotiated(client)
        check("era-2026", version >= "2026-07-28", version or "unknown")
        names = {t.name for t in await client.list_tools()}
        check("list-tools", {"slow", "fail", "oops", "stats", "ask"} <= names, sorted(names))
        await attempt("plain-call", stats(client), lambda s: (isinstance(s.get("started"), int), s))

        task = await attempt(
            "task-created",
            call_tool_task(client, "slow", {"duration_ms": 800, "steps": 2}),
            lambda t: (t.task_id.startswith("tgt-") and t.create_result.status == "working", t.create_result),
        )
        if task is not None:
            await attempt("task-completed", task.wait(timeout=20), lambda s: (s.status == "completed", s))
            await attempt("task-result", task.result(), lambda r: (text_of(r) == "slow done", r))

        async def failed():
            t = await call_tool_task(client, "fail", {})
            return await t.wait(timeout=20)

        await attempt("rpc-error-failed", failed(), lambda s: (s.status == "failed", s))

        async def ask():
            t = await call_tool_task(client, "ask", {})
            return await t.result()

        await attempt(
            "input-answered",
            ask(),
            lambda r: (text_of(r) == 'ask: accept {"ok":true}' and ASKED == ["Proceed?"], (r, ASKED)),
        )

        before = await stats(client)
        long = await attempt(
            "cancel-created",
            call_tool_task(client, "slow", {"duration_ms": 10000, "steps": 10}),
            lambda t: (bool(t.task_id), t.create_result),
        )
        if long is not None:
            for _ in range(50):
                if (await stats(client))["started"] > before["started"]:
                    break
                await asyncio.sleep(0.1)
            await attempt("cancel-ack", long.cancel(), lambda _: (True, ""))
            await attempt("cancel-settles", long.wait(timeout=15), lambda s: (s.status == "cancelled", s))
            after = await stats(client)
            for _ in range(50):
                if after["aborted"] > before["aborted"]:
                    break
                await asyncio.sleep(0.1)
                after = await stats(client)
            check("server-saw-cancel", after["aborted"] == before["aborted"] + 1, (before, after))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--label", default="gateway-fastmcp")
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

#!/usr/bin/env python3
"""The 2025-11-25 task lifecycle with the Python SDK client (mcp==1.30.0) against a server WITHOUT
task support (gateway-task-server.mjs) through taskgate with `tasks = "gateway"` (issue 32).

    python py_gateway_task_client.py URL [--label NAME] [--timeout-ms 60000]

A sibling of py_task_client.py for that case, with the checks of gateway-task-client.mjs under the
same names. Prints one JSON summary {label, url, ok, failed, checks} on stdout; exit 0 only when
every check passed (the failed names also go to stderr).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import warnings
from datetime import timedelta
from typing import Any

import anyio
import mcp.types as types
from mcp.client.experimental.task_handlers import ExperimentalTaskHandlers
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import McpError

warnings.filterwarnings("ignore", category=DeprecationWarning)

RELATED_TASK = "io.modelcontextprotocol/related-task"
TERMINAL = ("completed", "failed", "cancelled")
checks: list[dict[str, Any]] = []


def check(name: str, ok: Any, detail: Any = None) -> bool:
    entry: dict[str, Any] = {"name": name, "ok": bool(ok)}
    if detail is not None:
        entry["detail"] = detail
    checks.append(entry)
    return bool(ok)


def describe(error: BaseException) -> dict[str, Any]:
    if isinstance(error, McpError):
        return {"code": error.error.code, "message": error.error.message}
    return {"message": f"{type(error).__name__}: {error}"}


def dump(model: Any) -> Any:
    return model.model_dump(by_alias=True, mode="json") if hasattr(model, "model_dump") else model


async def step(name: str, fn: Any) -> Any:
    try:
        return await fn()
    except Exception as error:  # noqa: BLE001 - every failure is reported, the lifecycle goes on
        check(name, False, {"error": describe(error)})
        return None


async def expect_error(name: str, coro: Any, codes: list[int]) -> bool:
    try:
        result = await coro
        return check(name, False, {"expected": codes, "got": {"result": dump(result)}})
    except McpError as error:
        return check(name, error.error.code in codes, {"expected": codes, "got": describe(error)})
    except Exception as error:  # noqa: BLE001
        return check(name, False, {"expected": codes, "got": describe(error)})


async def not_served(_context: Any, _params: Any) -> types.ErrorData:
    return types.ErrorData(code=types.INVALID_PARAMS, message="this client holds no tasks")


async def poll(session: ClientSession, task_id: str, until: Any, max_s: float = 15.0) -> tuple[dict[str, Any], list[str]]:
    deadline = time.monotonic() + max_s
    statuses: list[str] = []
    while True:
        task = dump(await session.experimental.get_task(task_id))
        if not statuses or statuses[-1] != task["status"]:
            statuses.append(task["status"])
        if until(task) or time.monotonic() > deadline:
            return task, statuses
        await anyio.sleep(0.2)


async def stats(session: ClientSession) -> dict[str, int]:
    result = await session.call_tool("stats", {})
    return json.loads(result.content[0].text)


async def lifecycle(session: ClientSession) -> None:
    init = await session.initialize()
    caps = dump(init.capabilities.tasks) if init.capabilities.tasks else None
    check(
        "server-capabilities-tasks",
        caps is not None and caps.get("cancel") is not None and "call" in ((caps.get("requests") or {}).get("tools") or {}),
        {"tasks": caps},
    )

    async def tools_list() -> None:
        tools = (await session.list_tools()).tools
        support = {t.name: (t.execution.taskSupport if t.execution and t.execution.taskSupport else "absent") for t in tools}
        check("tools-list-optional", all(s == "optional" for s in support.values()), {"support": support})

    await step("tools-list-optional", tools_list)

    async def plain_call() -> None:
        s = await stats(session)
        check("plain-call", isinstance(s.get("started"), int), {"stats": s})

    await step("plain-call", plain_call)

    async def create() -> str:
        created = await session.experimental.call_tool_as_task("slow", {"duration_ms": 2000, "steps": 4}, ttl=60000)
        task = dump(created.task)
        check("task-create", task["status"] == "working" and task.get("ttl") == 60000, {"task": task})
        return task["taskId"]

    slow_id = await step("task-create", create)
    if slow_id:

        async def get_working() -> None:
            task = dump(await session.experimental.get_task(slow_id))
            check("tasks-get-working", task["status"] == "working", {"task": task})

        await step("tasks-get-working", get_working)

        async def progress_message() -> None:
            pattern = re.compile(r"^step \d/4$")
            task, _ = await poll(session, slow_id, lambda t: pattern.match(t.get("statusMessage") or "") or t["status"] in TERMINAL, 5)
            check("status-message-from-progress", pattern.match(task.get("statusMessage") or ""), {"task": task})

        await step("status-message-from-progress", progress_message)

        async def listed() -> None:
            page = await session.experimental.list_tasks()
            check("tasks-list-contains", any(t.taskId == slow_id for t in page.tasks), {"listed": len(page.tasks)})

        await step("tasks-list-contains", listed)

        async def result_blocks() -> None:
            started = time.monotonic()
            result = dump(await session.experimental.get_task_result(slow_id, types.CallToolResult))
            waited = (time.monotonic() - started) * 1000
            meta = (result.get("_meta") or {}).get(RELATED_TASK) or {}
            ok = result["content"][0]["text"] == "slow done" and meta.get("taskId") == slow_id and waited > 300
            check("tasks-result-blocks", ok, {"waitedMs": waited, "result": result})

        await step("tasks-result-blocks", result_blocks)

        async def completed() -> None:
            task = dump(await session.experimental.get_task(slow_id))
            check("tasks-get-completed", task["status"] == "completed", {"task": task})

        await step("tasks-get-completed", completed)

    async def rpc_error() -> None:
        created = await session.experimental.call_tool_as_task("fail", {}, ttl=60000)
        task, statuses = await poll(session, created.task.taskId, lambda t: t["status"] in TERMINAL)
        check("rpc-error-failed", task["status"] == "failed" and "fail: it broke" in (task.get("statusMessage") or ""), {"statuses": statuses, "task": task})
        await expect_error("rpc-error-result", session.experimental.get_task_result(created.task.taskId, types.CallToolResult), [-32000])

    await step("rpc-error-failed", rpc_error)

    async def is_error() -> None:
        created = await session.experimental.call_tool_as_task("oops", {}, ttl=60000)
        task, _ = await poll(session, created.task.taskId, lambda t: t["status"] in TERMINAL)
        result = dump(await session.experimental.get_task_result(created.task.taskId, types.CallToolResult))
        check("is-error-completed", task["status"] == "completed" and result.get("isError") is True, {"task": task, "result": result})

    await step("is-error-completed", is_error)

    async def cancel_working() -> None:
        before = await stats(session)
        created = await session.experimental.call_tool_as_task("slow", {"duration_ms": 10000, "steps": 10}, ttl=60000)
        task_id = created.task.taskId
        for _ in range(50):
            if (await stats(session))["started"] != before["started"]:
                break
            await anyio.sleep(0.1)
        cancelled = dump(await session.experimental.cancel_task(task_id))
        check("tasks-cancel-working", cancelled["status"] == "cancelled" and cancelled["taskId"] == task_id, {"result": cancelled})
        after = await stats(session)
        for _ in range(50):
            if after["aborted"] != before["aborted"]:
                break
            await anyio.sleep(0.1)
            after = await stats(session)
        check(
            "server-saw-the-cancel",
            after["aborted"] == before["aborted"] + 1 and after["finished"] == before["finished"],
            {"before": before, "after": after},
        )
        later = dump(await session.experimental.get_task(task_id))
        check("tasks-cancelled-stays-cancelled", later["status"] == "cancelled", {"task": later})
        await expect_error("tasks-cancel-cancelled", session.experimental.cancel_task(task_id), [-32602])

    await step("tasks-cancel-working", cancel_working)

    unknown = "no-such-task-0000"
    await expect_error("tasks-get-unknown", session.experimental.get_task(unknown), [-32602])
    await expect_error("tasks-cancel-unknown", session.experimental.cancel_task(unknown), [-32602])


async def main() -> int:
    parser = argparse.ArgumentParser(description="gateway-owned task lifecycle with the Python SDK client")
    parser.add_argument("url")
    parser.add_argument("--label", default="")
    parser.add_argument("--timeout-ms", type=int, default=60000)
    args = parser.parse_args()
    started = time.monotonic()
    try:
        with anyio.fail_after(args.timeout_ms / 1000):
            async with streamable_http_client(args.url) as (read, write, _):
                handlers = ExperimentalTaskHandlers(list_tasks=not_served, cancel_task=not_served)
                async with ClientSession(
                    read,
                    write,
                    read_timeout_seconds=timedelta(seconds=15),
                    client_info=types.Implementation(name="taskgate-interop-py-gateway-task-client", version="1.0.0"),
                    experimental_task_handlers=handlers,
                ) as session:
                    await lifecycle(session)
    except BaseException as error:  # noqa: BLE001 - includes ExceptionGroup from the transport's task group
        check("lifecycle-finished", False, {"error": describe(error)})
    failed = [c["name"] for c in checks if not c["ok"]]
    summary = {
        "label": args.label or None,
        "url": args.url,
        "ok": not failed and bool(checks),
        "passed": len(checks) - len(failed),
        "failed": failed,
        "ms": int((time.monotonic() - started) * 1000),
        "checks": checks,
    }
    print(json.dumps(summary, indent=2, default=str))
    if not summary["ok"]:
        print(f"py_gateway_task_client{f' [{args.label}]' if args.label else ''}: FAILED checks: {', '.join(failed)}", file=sys.stderr)
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(anyio.run(main))

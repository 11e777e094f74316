#!/usr/bin/env python3
"""Issue 12: the Python SDK client (mcp==1.30.0, 2025-11-25 tasks) against a 2026-07-28 task
server (modern_task_server.py: FastMCP 4.1.4 + fastmcp-tasks 4.1.4), directly or through taskgate's
bridge. The same 17 checks (18 with --mrtr-plain), under the same names, as bridge-client.mjs (the
task lifecycle, an input_required task answered through elicitation, MRTR: input asked within the
request before a task exists, and with --mrtr-plain in a plain call, a plain client calling
task-only tools: the real result with progress first, and its cancel reaching the upstream as
exactly one tasks/cancel).

    python py_bridge_client.py URL [--label NAME] [--timeout-ms 90000] [--received SPEC] [--mrtr-plain] [--listen]

--listen adds get-stream-listen: the SDK's GET stream gets the server's
notifications/tools/list_changed (see bridge-client.mjs).

SPEC: the fixture's `/received` URL, or a file of `{"received":"tasks/cancel","taskId":ID}` lines
(see bridge-client.mjs). The SDK has no cancel of its own for a request: the client sends
notifications/cancelled for its call's id and stops waiting (a cancel scope).

Prints one JSON summary {label, url, ok, passed, total, failed, checks}; exit 0 only when every
check passed. Runs in .venv (requirements.txt).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from datetime import timedelta
from typing import Any

import anyio
import httpx
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
    checks.append({"name": name, "ok": bool(ok), **({} if detail is None else {"detail": detail})})
    return bool(ok)


def describe(error: BaseException) -> dict[str, Any]:
    if isinstance(error, McpError):
        return {"code": error.error.code, "message": error.error.message}
    return {"message": f"{type(error).__name__}: {error}"}


def dump(model: Any) -> Any:
    return model.model_dump(by_alias=True, mode="json", exclude_none=True) if hasattr(model, "model_dump") else model


async def step(name: str, fn: Any) -> Any:
    try:
        return await fn()
    except Exception as error:  # noqa: BLE001 - every failure is reported, the lifecycle goes on
        check(name, False, {"error": describe(error)})
        return None


async def expect_error(name: str, coro: Any, codes: list[int]) -> bool:
    try:
        return check(name, False, {"expected": codes, "got": {"result": dump(await coro)}})
    except McpError as error:
        return check(name, error.error.code in codes, {"expected": codes, "got": describe(error)})
    except Exception as error:  # noqa: BLE001
        return check(name, False, {"expected": codes, "got": describe(error)})


def first_text(result: dict[str, Any]) -> str:
    content = result.get("content") or []
    return (content[0].get("text") or "") if content else ""


async def not_served(_context: Any, _params: Any) -> types.ErrorData:
    return types.ErrorData(code=types.INVALID_PARAMS, message="this client holds no tasks")


ELICITED: list[dict[str, Any]] = []
MRTR_PLAIN = False
LISTEN = False
LIST_CHANGED = anyio.Event()


async def on_message(message: Any) -> None:
    root = getattr(message, "root", message)
    if isinstance(root, types.ToolListChangedNotification):
        LIST_CHANGED.set()


async def on_elicit(_context: Any, params: Any) -> types.ElicitResult:
    meta = getattr(params, "meta", None)
    related = None
    if meta is not None:
        extra = meta.model_dump(by_alias=True) if hasattr(meta, "model_dump") else dict(meta)
        related = (extra.get(RELATED_TASK) or {}).get("taskId")
    message = getattr(params, "message", None)
    ELICITED.append({"message": message, "related": related})
    if message == "Your name?":
        return types.ElicitResult(action="accept", content={"name": "Luca"})
    return types.ElicitResult(action="accept", content={"confirm": True})


async def plain_call(url: str) -> None:
    """A client without the tasks capability calls the task-only failing_job."""
    progress: list[Any] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append({"progress": value, "message": message})

    async with httpx.AsyncClient(timeout=httpx.Timeout(30, read=300)) as http:
        async with streamable_http_client(url, http_client=http) as (read, write, _sid):
            async with ClientSession(read, write, read_timeout_seconds=timedelta(seconds=20)) as session:
                await session.initialize()
                result = dump(await session.call_tool("failing_job", {}, progress_callback=on_progress))
                check("upgrade-plain-call", result.get("isError") is True and "failed on purpose" in first_text(result), {"result": result})
                # Progress first: the callback ran for messages before the answer.
                check("upgrade-progress-first", len(progress) >= 1, {"progress": progress})


RECEIVED = ""


async def received_cancels() -> dict[str, int]:
    """taskId -> tasks/cancel requests the upstream received (see --received)."""
    if RECEIVED.startswith("http"):
        async with httpx.AsyncClient() as http:
            return dict((await http.get(RECEIVED)).json().get("tasks/cancel", {}))
    counts: dict[str, int] = {}
    with open(RECEIVED, encoding="utf8") as f:
        for line in f:
            if '"received"' not in line:
                continue
            try:
                m = json.loads(line)
            except ValueError:
                continue
            if m.get("received") == "tasks/cancel":
                counts[m["taskId"]] = counts.get(m["taskId"], 0) + 1
    return counts


def fresh_cancels(before: dict[str, int], now: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in now.items() if v != before.get(k, 0)}


async def plain_cancel(url: str) -> None:
    """A client without the tasks capability cancels its call of the task-only slow_required
    (notifications/cancelled for the call's id): the upstream gets exactly one tasks/cancel."""
    if not RECEIVED:
        check("upgrade-cancel-once", False, {"error": "no --received"})
        return
    before = await received_cancels()
    started = anyio.Event()

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        started.set()

    async with httpx.AsyncClient(timeout=httpx.Timeout(30, read=300)) as http:
        async with streamable_http_client(url, http_client=http) as (read, write, _sid):
            async with ClientSession(read, write, read_timeout_seconds=timedelta(seconds=60)) as session:
                await session.initialize()
                request_id = session._request_id  # the id call_tool is about to use
                async with anyio.create_task_group() as tg:

                    async def run() -> None:
                        await session.call_tool("slow_required", {"seconds": 30}, progress_callback=on_progress)

                    tg.start_soon(run)
                    with anyio.move_on_after(20):
                        await started.wait()
                    note = types.CancelledNotification(params=types.CancelledNotificationParams(requestId=request_id, reason="the user gave up"))
                    await session.send_notification(types.ClientNotification(note))
                    tg.cancel_scope.cancel()
                fresh: dict[str, int] = {}
                with anyio.move_on_after(15):
                    while not fresh:
                        fresh = fresh_cancels(before, await received_cancels())
                        await anyio.sleep(0.1)
                # Anything more would come soon after the first: look again a little later.
                await anyio.sleep(1.5)
                fresh = fresh_cancels(before, await received_cancels())
    counts = list(fresh.values())
    check("upgrade-cancel-once", started.is_set() and counts == [1], {"started": started.is_set(), "cancels": fresh})


async def poll(session: ClientSession, task_id: str, max_s: float = 15.0) -> dict[str, Any]:
    deadline = time.monotonic() + max_s
    while True:
        task = dump(await session.experimental.get_task(task_id))
        if task["status"] in TERMINAL or time.monotonic() > deadline:
            return task
        await anyio.sleep(min(max((task.get("pollInterval") or 200) / 1000, 0.1), 1.0))


async def lifecycle(url: str) -> None:
    async with httpx.AsyncClient(timeout=httpx.Timeout(30, read=300)) as http:
        async with streamable_http_client(url, http_client=http) as (read, write, _sid):
            handlers = ExperimentalTaskHandlers(list_tasks=not_served, cancel_task=not_served)
            async with ClientSession(
                read,
                write,
                read_timeout_seconds=timedelta(seconds=20),
                client_info=types.Implementation(name="taskgate-py-bridge-client", version="1.0.0"),
                experimental_task_handlers=handlers,
                elicitation_callback=on_elicit,
                message_handler=on_message,
            ) as session:
                await in_session(session)
    await step("upgrade-plain-call", lambda: plain_call(url))
    await step("upgrade-cancel-once", lambda: plain_cancel(url))


async def in_session(session: ClientSession) -> None:
    init = await step("initialize", session.initialize)
    if init is None:
        return
    check("initialize", True)
    if LISTEN:
        # The SDK opens its GET stream after notifications/initialized.
        with anyio.move_on_after(10):
            await LIST_CHANGED.wait()
        check("get-stream-listen", LIST_CHANGED.is_set(), {"seen": LIST_CHANGED.is_set()})
    caps = dump(init.capabilities.tasks) if init.capabilities.tasks else None
    check("server-capabilities-tasks", caps and "cancel" in caps and "call" in (caps.get("requests", {}).get("tools") or {}), {"tasks": caps})

    async def tools_list() -> None:
        tools = (await session.list_tools()).tools
        support = {t.name: (t.execution.taskSupport if t.execution and t.execution.taskSupport else "absent") for t in tools}
        ok = support.get("slow_compute") in ("optional", "required") and support.get("failing_job") in ("optional", "required")
        check("tools-list-task-support", ok, {"slow_compute": support.get("slow_compute"), "failing_job": support.get("failing_job")})

    await step("tools-list-task-support", tools_list)

    async def create() -> str:
        created = await session.experimental.call_tool_as_task("slow_compute", {"seconds": 1.5, "label": "bridge"}, ttl=60000)
        task = dump(created.task)
        check("task-create", task["status"] == "working", {"task": task})
        return task["taskId"]

    slow_id = await step("task-create", create)
    if slow_id:

        async def get_working() -> None:
            task = dump(await session.experimental.get_task(slow_id))
            check("tasks-get-working", task["status"] == "working" and task["taskId"] == slow_id, {"task": task})

        await step("tasks-get-working", get_working)

        async def list_contains() -> None:
            page = await session.experimental.list_tasks(None)
            check("tasks-list-contains", slow_id in [t.taskId for t in page.tasks], {"listed": len(page.tasks)})

        await step("tasks-list-contains", list_contains)

        async def result_blocks() -> None:
            started = time.monotonic()
            result = dump(await session.experimental.get_task_result(slow_id, types.CallToolResult))
            waited = int((time.monotonic() - started) * 1000)
            related = (result.get("_meta") or {}).get(RELATED_TASK) or {}
            ok = first_text(result).startswith("slow_compute(bridge) done") and not result.get("isError") and related.get("taskId") == slow_id and waited >= 300
            check("tasks-result-blocks", ok, {"waitedMs": waited, "result": result})

        await step("tasks-result-blocks", result_blocks)

        async def get_completed() -> None:
            task = dump(await session.experimental.get_task(slow_id))
            check("tasks-get-completed", task["status"] == "completed", {"task": task})

        await step("tasks-get-completed", get_completed)
    else:
        for name in ("tasks-get-working", "tasks-list-contains", "tasks-result-blocks", "tasks-get-completed"):
            check(name, False, {"error": "no task"})

    async def failing() -> None:
        created = await session.experimental.call_tool_as_task("failing_job", {}, ttl=60000)
        task = await poll(session, created.task.taskId)
        result = dump(await session.experimental.get_task_result(created.task.taskId, types.CallToolResult))
        check("failing-task-failed", task["status"] == "failed" and result.get("isError") is True, {"status": task["status"], "result": result})

    await step("failing-task-failed", failing)

    async def protocol_error() -> None:
        created = await session.experimental.call_tool_as_task("protocol_error_job", {}, ttl=60000)
        await poll(session, created.task.taskId)
        await expect_error("protocol-error-task", session.experimental.get_task_result(created.task.taskId, types.CallToolResult), [-32603])

    await step("protocol-error-task", protocol_error)

    async def cancel_working() -> None:
        created = await session.experimental.call_tool_as_task("slow_compute", {"seconds": 3, "label": "cancel"}, ttl=60000)
        cancelled = dump(await session.experimental.cancel_task(created.task.taskId))
        now = dump(await session.experimental.get_task(created.task.taskId))
        check("tasks-cancel-working", cancelled["status"] == "cancelled" and now["status"] == "cancelled", {"cancel": cancelled, "get": now})

    await step("tasks-cancel-working", cancel_working)
    async def elicitation() -> None:
        created = await session.experimental.call_tool_as_task("confirm_delete", {"filename": "bridge.txt"}, ttl=60000)
        result = dump(await session.experimental.get_task_result(created.task.taskId, types.CallToolResult))
        text = first_text(result)
        ok = text.startswith("confirm_delete(bridge.txt)") and "true" in text and len(ELICITED) == 1 and ELICITED[0]["related"] == created.task.taskId
        check("elicitation-input", ok, {"text": text, "elicited": ELICITED})

    await step("elicitation-input", elicitation)

    async def mrtr_task() -> None:
        before = len(ELICITED)
        created = await session.experimental.call_tool_as_task("test_tool_with_task", {}, ttl=60000)
        result = dump(await session.experimental.get_task_result(created.task.taskId, types.CallToolResult))
        text = first_text(result)
        asked = ELICITED[before:]
        ok = text == "Hello from the task, Luca!" and len(asked) == 1 and asked[0]["related"] is None
        check("mrtr-task-input", ok, {"text": text, "asked": asked})

    await step("mrtr-task-input", mrtr_task)

    async def mrtr_plain() -> None:
        before = len(ELICITED)
        result = dump(await session.call_tool("ask_name", {}))
        text = first_text(result)
        asked = ELICITED[before:]
        check("mrtr-plain-input", text == "Hello, Luca! (state asked:name)" and len(asked) == 1, {"text": text, "asked": asked})

    if MRTR_PLAIN:
        await step("mrtr-plain-input", mrtr_plain)
    if slow_id:
        await expect_error("tasks-cancel-terminal", session.experimental.cancel_task(slow_id), [-32602])
    else:
        check("tasks-cancel-terminal", False, {"error": "no task"})


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("--label", default="")
    ap.add_argument("--timeout-ms", type=int, default=90000)
    ap.add_argument("--received", default="")
    ap.add_argument("--mrtr-plain", action="store_true")
    ap.add_argument("--listen", action="store_true")
    args = ap.parse_args()
    global RECEIVED, MRTR_PLAIN, LISTEN
    RECEIVED = args.received
    MRTR_PLAIN = args.mrtr_plain
    LISTEN = args.listen

    async def run() -> None:
        with anyio.fail_after(args.timeout_ms / 1000):
            await lifecycle(args.url)

    try:
        anyio.run(run)
    except BaseException as error:  # noqa: BLE001 - a crash is a failed check, the summary still prints
        if not checks or checks[-1]["name"] != "lifecycle-finished":
            check("lifecycle-finished", False, {"error": describe(error)})
    failed = [c["name"] for c in checks if not c["ok"]]
    summary = {"label": args.label or None, "url": args.url, "ok": not failed and bool(checks), "passed": len(checks) - len(failed), "total": len(checks), "failed": failed, "checks": checks}
    print(json.dumps(summary, indent=2))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

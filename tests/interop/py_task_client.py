#!/usr/bin/env python3
"""Drives the 2025-11-25 task lifecycle with the Python SDK client (mcp==1.30.0), directly or through a gateway.

    python py_task_client.py URL [--label NAME] [--timeout-ms 60000] [--trace]

The same checks, under the same names, as task-client.mjs (against a server offering slow_task,
fast_task, failing_task and plain_echo: py_task_server.py or task-server.mjs). Prints one JSON
summary {label, url, ok, failed, checks, observed, info} on stdout; exit 0 only when every check
passed, and the failed check names go to stderr.

Python SDK client API used: session.experimental.call_tool_as_task / get_task / get_task_result /
list_tasks / cancel_task; the tasks capability is declared through ExperimentalTaskHandlers.
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
import httpx
import mcp.types as types
from mcp.client.experimental.task_handlers import ExperimentalTaskHandlers
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import McpError

warnings.filterwarnings("ignore", category=DeprecationWarning)

RELATED_TASK = "io.modelcontextprotocol/related-task"
TERMINAL = ("completed", "failed", "cancelled")
PROGRESS_TOKEN = "py-progress-1"

checks: list[dict[str, Any]] = []
observed: dict[str, Any] = {"progressValues": [], "taskStatusNotifications": [], "getStream": None}
info: dict[str, Any] = {}
trace: list[dict[str, Any]] = []


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
    return model.model_dump(by_alias=True, mode="json", exclude_none=True) if hasattr(model, "model_dump") else model


async def step(name: str, fn: Any) -> Any:
    """Runs fn(); an exception becomes a failed check `name`."""
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


ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d")


def task_shape_errors(task: dict[str, Any]) -> list[str]:
    errors = []
    if not isinstance(task.get("taskId"), str) or not task["taskId"]:
        errors.append("taskId not a non-empty string")
    if task.get("status") not in ("working", "input_required", *TERMINAL):
        errors.append(f"bad status {task.get('status')}")
    for key in ("createdAt", "lastUpdatedAt"):
        if not ISO.match(str(task.get(key, ""))):
            errors.append(f"{key} not ISO 8601")
    if "ttl" not in task or not (task["ttl"] is None or isinstance(task["ttl"], (int, float))):
        errors.append("ttl missing or not number|null")
    return errors


def task_dict(model: Any) -> dict[str, Any]:
    # exclude_none would drop ttl: null, which must stay visible
    return model.model_dump(by_alias=True, mode="json")


async def on_message(message: Any) -> None:
    if isinstance(message, types.ServerNotification):
        root = message.root
        if isinstance(root, types.ProgressNotification) and root.params.progressToken == PROGRESS_TOKEN:
            observed["progressValues"].append(root.params.progress)
        elif isinstance(root, types.TaskStatusNotification):
            observed["taskStatusNotifications"].append({"taskId": root.params.taskId, "status": root.params.status})


async def on_response(response: httpx.Response) -> None:
    method = response.request.method
    trace.append({"method": method, "status": response.status_code, "contentType": response.headers.get("content-type")})
    if method == "GET" and observed["getStream"] is None:
        observed["getStream"] = {"status": response.status_code, "contentType": response.headers.get("content-type")}


async def not_served(_context: Any, _params: Any) -> types.ErrorData:
    return types.ErrorData(code=types.INVALID_PARAMS, message="this client holds no tasks")


def new_session(read: Any, write: Any) -> ClientSession:
    # Handlers for tasks/list and tasks/cancel make the client declare capabilities.tasks {list, cancel}.
    handlers = ExperimentalTaskHandlers(list_tasks=not_served, cancel_task=not_served)
    return ClientSession(
        read,
        write,
        read_timeout_seconds=timedelta(seconds=15),
        message_handler=on_message,
        client_info=types.Implementation(name="taskgate-interop-py-task-client", version="1.0.0"),
        experimental_task_handlers=handlers,
    )


async def poll_task(session: ClientSession, task_id: str, max_s: float = 10.0) -> tuple[dict[str, Any], list[str]]:
    deadline = time.monotonic() + max_s
    statuses: list[str] = []
    while True:
        task = task_dict(await session.experimental.get_task(task_id))
        if not statuses or statuses[-1] != task["status"]:
            statuses.append(task["status"])
        if task["status"] in TERMINAL or time.monotonic() > deadline:
            return task, statuses
        await anyio.sleep(min(max((task.get("pollInterval") or 200) / 1000, 0.1), 1.0))


def first_text(result: Any) -> str | None:
    content = result.get("content") or []
    return content[0].get("text") if content else None


async def lifecycle(url: str) -> None:
    async with httpx.AsyncClient(timeout=httpx.Timeout(30, read=300), event_hooks={"response": [on_response]}) as http:
        async with streamable_http_client(url, http_client=http) as (read, write, get_session_id):
            async with new_session(read, write) as session:
                await lifecycle_in_session(url, session, get_session_id)


async def lifecycle_in_session(url: str, session: ClientSession, get_session_id: Any) -> None:
    # 1. initialize, declaring the tasks capability
    init = await step("initialize", session.initialize)
    if init is None:
        return
    check("initialize", True, {"protocolVersion": init.protocolVersion})
    info["protocolVersion"] = init.protocolVersion
    info["sessionId"] = "present" if get_session_id() else "absent"
    caps = dump(init.capabilities.tasks) if init.capabilities.tasks else None
    # tasks.list may be left out on purpose by a receiver that cannot tell requestors apart (see task-client.mjs).
    check(
        "server-capabilities-tasks",
        caps is not None and "cancel" in caps and "call" in (caps.get("requests", {}).get("tools") or {}),
        {"tasks": caps},
    )
    info["tasksList"] = "advertised" if caps is not None and "list" in caps else "not advertised"
    with anyio.move_on_after(5):
        while observed["getStream"] is None:
            await anyio.sleep(0.05)

    # 2. tools/list and taskSupport
    async def tools_list() -> None:
        tools = (await session.list_tools()).tools
        support = {t.name: (t.execution.taskSupport if t.execution and t.execution.taskSupport else "absent") for t in tools}
        want = {"slow_task": "required", "fast_task": "optional", "failing_task": "optional"}
        ok = all(support.get(n) == s for n, s in want.items()) and support.get("plain_echo") in ("absent", "forbidden")
        check("tools-list-task-support", ok, {"taskSupport": support})

    await step("tools-list-task-support", tools_list)

    # 3. plain call
    async def plain_call() -> None:
        result = dump(await session.call_tool("plain_echo", {"text": "hi"}))
        check("plain-call", not result.get("isError") and first_text(result) == "echo: hi", {"result": result})

    await step("plain-call", plain_call)

    # 4. a required tool without params.task must not run as a plain call
    async def required_without_task() -> None:
        try:
            result = dump(await session.call_tool("slow_task", {"duration_ms": 10}))
            check("required-without-task-refused", result.get("isError") is True, {"got": "CallToolResult", "result": result})
            info["requiredWithoutTask"] = {"kind": "CallToolResult", "isError": result.get("isError"), "text": first_text(result)}
        except McpError as error:
            check("required-without-task-refused", error.error.code in (-32601, -32600), {"got": describe(error)})
            info["requiredWithoutTask"] = {"kind": "error", **describe(error)}

    await step("required-without-task-refused", required_without_task)

    # 5. an optional tool without params.task answers with the plain result
    async def optional_without_task() -> None:
        result = dump(await session.call_tool("fast_task", {"text": "plain"}))
        check("optional-without-task", not result.get("isError") and first_text(result) == "fast_task: plain", {"result": result})

    await step("optional-without-task", optional_without_task)

    # 6. task-augmented call of the slow tool with a progress token
    async def task_create() -> str:
        created = await session.experimental.call_tool_as_task(
            "slow_task", {"duration_ms": 1500, "steps": 5}, ttl=60000, meta={"progressToken": PROGRESS_TOKEN}
        )
        task = task_dict(created.task)
        errors = task_shape_errors(task)
        if task["status"] != "working":
            errors.append(f"status {task['status']}, want working")
        check("task-create", not errors, {"task": task, "errors": errors})
        info["ttlRequested"] = 60000
        info["ttlGranted"] = task.get("ttl")
        return task["taskId"]

    slow_id = await step("task-create", task_create)

    if slow_id:

        async def get_working() -> None:
            task = task_dict(await session.experimental.get_task(slow_id))
            errors = task_shape_errors(task)
            if task["taskId"] != slow_id:
                errors.append("taskId differs")
            if task["status"] != "working":
                errors.append(f"status {task['status']}, want working")
            if (task.get("_meta") or {}).get(RELATED_TASK):
                errors.append("related-task _meta on tasks/get result")
            check("tasks-get-working", not errors, {"task": task, "errors": errors})

        await step("tasks-get-working", get_working)

        async def list_contains() -> None:
            ids: list[str] = []
            cursor = None
            for _ in range(20):
                page = await session.experimental.list_tasks(cursor)
                ids += [t.taskId for t in page.tasks]
                cursor = page.nextCursor
                if not cursor:
                    break
            check("tasks-list-contains", slow_id in ids, {"listed": len(ids)})

        if info["tasksList"] == "advertised":
            await step("tasks-list-contains", list_contains)

        async def result_blocks() -> None:
            started = time.monotonic()
            result = dump(await session.experimental.get_task_result(slow_id, types.CallToolResult))
            waited = int((time.monotonic() - started) * 1000)
            errors = []
            if not (first_text(result) or "").startswith("slow_task done"):
                errors.append("unexpected content")
            if result.get("isError"):
                errors.append("isError")
            related = (result.get("_meta") or {}).get(RELATED_TASK) or {}
            if related.get("taskId") != slow_id:
                errors.append(f"related-task _meta {related}")
            if waited < 300:
                errors.append(f"returned after {waited} ms: did not block")
            check("tasks-result-blocks", not errors, {"waitedMs": waited, "errors": errors, "result": result})

        await step("tasks-result-blocks", result_blocks)

        async def get_completed() -> None:
            task = task_dict(await session.experimental.get_task(slow_id))
            check("tasks-get-completed", task["status"] == "completed" and not task_shape_errors(task), {"task": task})

        await step("tasks-get-completed", get_completed)

    # 10. fast task
    async def fast_task() -> str:
        created = await session.experimental.call_tool_as_task("fast_task", {"text": "as task"}, ttl=60000)
        task_id = created.task.taskId
        task, statuses = await poll_task(session, task_id)
        check("fast-task-completed", task["status"] == "completed", {"statuses": statuses})
        result = dump(await session.experimental.get_task_result(task_id, types.CallToolResult))
        related = (result.get("_meta") or {}).get(RELATED_TASK) or {}
        check("fast-task-result", first_text(result) == "fast_task: as task" and related.get("taskId") == task_id, {"result": result})
        return task_id

    fast_id = await step("fast-task-completed", fast_task)

    # 11. failing task
    async def failing_task() -> None:
        created = await session.experimental.call_tool_as_task("failing_task", {}, ttl=60000)
        task_id = created.task.taskId
        task, statuses = await poll_task(session, task_id)
        check("failing-task-failed", task["status"] == "failed", {"statuses": statuses, "statusMessage": task.get("statusMessage")})
        result = dump(await session.experimental.get_task_result(task_id, types.CallToolResult))
        related = (result.get("_meta") or {}).get(RELATED_TASK) or {}
        check("failing-task-result-iserror", result.get("isError") is True and related.get("taskId") == task_id, {"result": result})

    await step("failing-task-failed", failing_task)

    # 12. cancel a working task
    async def cancel_working() -> None:
        created = await session.experimental.call_tool_as_task("slow_task", {"duration_ms": 1000, "steps": 4}, ttl=60000)
        task_id = created.task.taskId
        cancelled = task_dict(await session.experimental.cancel_task(task_id))
        check(
            "tasks-cancel-working",
            cancelled["status"] == "cancelled" and cancelled["taskId"] == task_id and not task_shape_errors(cancelled),
            {"result": cancelled},
        )
        now = task_dict(await session.experimental.get_task(task_id))
        check("tasks-get-after-cancel", now["status"] == "cancelled", {"task": now})
        await anyio.sleep(1.3)
        later = task_dict(await session.experimental.get_task(task_id))
        check("tasks-cancelled-stays-cancelled", later["status"] == "cancelled", {"task": later})
        try:
            # GetTaskPayloadResult, not CallToolResult: the Python SDK answers a cancelled task with {_meta} only.
            payload = await session.experimental.get_task_result(task_id, types.GetTaskPayloadResult)
            info["resultOfCancelled"] = {"kind": "result", "result": dump(payload)}
        except Exception as error:  # noqa: BLE001 - info only
            info["resultOfCancelled"] = {"kind": "error", **describe(error)}
        await expect_error("tasks-cancel-cancelled", session.experimental.cancel_task(task_id), [-32602])

    await step("tasks-cancel-working", cancel_working)

    # 13. cancel a terminal task
    terminal_id = fast_id or slow_id
    if terminal_id:
        await expect_error("tasks-cancel-terminal", session.experimental.cancel_task(terminal_id), [-32602])
    else:
        check("tasks-cancel-terminal", False, {"error": "no completed task to cancel"})

    # 14. unknown ids
    unknown = "no-such-task-0000"
    await expect_error("tasks-get-unknown", session.experimental.get_task(unknown), [-32602])
    await expect_error("tasks-result-unknown", session.experimental.get_task_result(unknown, types.CallToolResult), [-32602])
    await expect_error("tasks-cancel-unknown", session.experimental.cancel_task(unknown), [-32602])

    # 15. info: visible from another session?
    if slow_id and get_session_id():
        try:
            async with streamable_http_client(url) as (read2, write2, _):
                async with new_session(read2, write2) as other:
                    await other.initialize()
                    try:
                        task = await other.experimental.get_task(slow_id)
                        info["crossSessionGet"] = {"kind": "result", "status": task.status}
                    except McpError as error:
                        info["crossSessionGet"] = {"kind": "error", **describe(error)}
        except Exception as error:  # noqa: BLE001
            info["crossSessionGet"] = {"kind": "connect-failed", **describe(error)}

    await anyio.sleep(0.3)
    # The session is DELETEd when streamable_http_client exits (terminate_on_close).


async def main() -> int:
    parser = argparse.ArgumentParser(description="task lifecycle with the Python SDK client")
    parser.add_argument("url")
    parser.add_argument("--label", default="")
    parser.add_argument("--timeout-ms", type=int, default=60000)
    parser.add_argument("--trace", action="store_true")
    args = parser.parse_args()

    started = time.monotonic()
    crashed = None
    try:
        with anyio.fail_after(args.timeout_ms / 1000):
            await lifecycle(args.url)
    except BaseException as error:  # noqa: BLE001 - includes ExceptionGroup from the transport's task group
        crashed = error
        check("lifecycle-finished", False, {"error": describe(error)})
    failed = [c["name"] for c in checks if not c["ok"]]
    summary = {
        "label": args.label or None,
        "url": args.url,
        "ok": not failed and bool(checks),
        "passed": len(checks) - len(failed),
        "failed": failed,
        "ms": int((time.monotonic() - started) * 1000),
        "observed": observed,
        "info": info,
        "checks": checks,
    }
    if args.trace:
        summary["trace"] = trace
    print(json.dumps(summary, indent=2, default=str))
    if not summary["ok"]:
        suffix = f" ({crashed})" if crashed else ""
        print(f"py_task_client{f' [{args.label}]' if args.label else ''}: FAILED checks: {', '.join(failed) or '(none ran)'}{suffix}", file=sys.stderr)
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(anyio.run(main))

#!/usr/bin/env python3
"""A client WITHOUT capabilities.tasks calls a tool whose taskSupport is "required", with the Python
SDK (mcp==1.30.0) `session.call_tool` (no params.task), and reports what it got.

    python py_upgrade_client.py URL TOOL ARGS_JSON [--expect result|error] [--elicit accept|none]
        [--list=true|false] [--min-progress N] [--min-elicitations N] [--text REGEX]
        [--error-text REGEX] [--label L]

Same options and summary as upgrade-client.mjs: --list true (default) calls tools/list first and
records the taskSupport it saw (the Python SDK does not refuse on its own, so the call is sent
either way); --elicit accept declares capabilities.elicitation (by giving an elicitation callback)
and accepts with the first enum/oneOf value of each property. Prints one JSON line
{label, ok, problems, isError, text, taskSupportSeen, progress, elicitations, ms, firstProgressMs,
error?}; exit 0 when the outcome matches --expect (and the --min-* / --text conditions hold).
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
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import McpError

warnings.filterwarnings("ignore", category=DeprecationWarning)


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("url")
    p.add_argument("tool")
    p.add_argument("args_json", nargs="?", default="{}")
    p.add_argument("--expect", choices=["result", "error"], default="result")
    p.add_argument("--elicit", choices=["accept", "none"], default="none")
    p.add_argument("--list", choices=["true", "false"], default="true")
    p.add_argument("--min-progress", type=int, default=0)
    p.add_argument("--min-elicitations", type=int, default=0)
    p.add_argument("--text", default="")
    p.add_argument("--error-text", default="")
    p.add_argument("--label", default="")
    return p.parse_args()


def first_value(schema: dict[str, Any]) -> Any:
    if schema.get("enum"):
        return schema["enum"][0]
    if schema.get("oneOf"):
        return schema["oneOf"][0].get("const")
    kind = schema.get("type")
    if kind == "boolean":
        return True
    if kind in ("number", "integer"):
        return 1
    return "x"


def first_leaf(error: BaseException) -> BaseException:
    """The first non-group exception inside (nested) exception groups, McpError preferred."""
    if isinstance(error, BaseExceptionGroup):
        leaves = [first_leaf(e) for e in error.exceptions]
        return next((e for e in leaves if isinstance(e, McpError)), leaves[0] if leaves else error)
    return error


async def main(opts: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"label": opts.label, "url": opts.url, "tool": opts.tool}
    progress: list[str] = []
    elicitations = 0
    start = time.monotonic()
    first_progress: list[int] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        if not first_progress:
            first_progress.append(int((time.monotonic() - start) * 1000))
        progress.append(f"{value:g}{'' if total is None else f'/{total:g}'}{'' if not message else f' {message}'}")

    async def on_elicit(_context: Any, params: Any) -> types.ElicitResult:
        nonlocal elicitations
        elicitations += 1
        props = (getattr(params, "requestedSchema", None) or {}).get("properties", {})
        return types.ElicitResult(action="accept", content={k: first_value(s) for k, s in props.items()})

    kwargs: dict[str, Any] = {}
    if opts.elicit == "accept":
        kwargs["elicitation_callback"] = on_elicit
    out["capabilities"] = {"elicitation": {}} if opts.elicit == "accept" else {}
    try:
        async with streamable_http_client(opts.url) as (read, write, _):
            async with ClientSession(
                read,
                write,
                read_timeout_seconds=timedelta(seconds=120),
                client_info=types.Implementation(name="taskgate-interop-py-upgrade-client", version="1.0.0"),
                **kwargs,
            ) as session:
                await session.initialize()
                if opts.list == "true":
                    tools = (await session.list_tools()).tools
                    seen = next((t for t in tools if t.name == opts.tool), None)
                    execution = getattr(seen, "execution", None) if seen else None
                    out["taskSupportSeen"] = getattr(execution, "taskSupport", None) if execution else None
                result = await session.call_tool(
                    opts.tool,
                    json.loads(opts.args_json),
                    read_timeout_seconds=timedelta(seconds=120),
                    progress_callback=on_progress,
                )
                out["isError"] = bool(result.isError)
                out["text"] = "\n".join(getattr(c, "text", "") for c in result.content)[:400]
    except BaseException as error:  # noqa: BLE001 - reported, never raised
        # An McpError raised inside the session leaves the transport's task group as an ExceptionGroup.
        leaf = first_leaf(error)
        if isinstance(leaf, McpError):
            out["error"] = {"code": leaf.error.code, "message": leaf.error.message}
        else:
            out["error"] = {"message": f"{type(leaf).__name__}: {leaf}"}
    out["ms"] = int((time.monotonic() - start) * 1000)
    out["firstProgressMs"] = first_progress[0] if first_progress else None
    out["progress"] = progress
    out["elicitations"] = elicitations
    problems: list[str] = []
    got_result = "error" not in out and not out.get("isError")
    if opts.expect == "result":
        if not got_result:
            got = f"error {json.dumps(out['error'])}" if "error" in out else f"isError: {out.get('text')}"
            problems.append(f"expected a result, got {got}")
        if len(progress) < opts.min_progress:
            problems.append(f"expected at least {opts.min_progress} progress notifications, got {len(progress)}")
        if elicitations < opts.min_elicitations:
            problems.append(f"expected at least {opts.min_elicitations} elicitations, got {elicitations}")
        if opts.text and not re.search(opts.text, out.get("text") or ""):
            problems.append(f"result text does not match /{opts.text}/")
    elif got_result:
        problems.append(f"expected the call to fail, got a result: {out.get('text')}")
    elif opts.error_text and not re.search(opts.error_text, (out.get("error") or {}).get("message") or out.get("text") or ""):
        problems.append(f"the failure does not match /{opts.error_text}/")
    out["problems"] = problems
    out["ok"] = not problems
    return out


if __name__ == "__main__":
    summary = anyio.run(main, parse())
    print(json.dumps(summary))
    sys.exit(0 if summary["ok"] else 1)

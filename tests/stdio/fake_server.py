#!/usr/bin/env python3
"""A scripted MCP stdio server (2025-11-25 tasks) for taskgate's stdio tests.

Newline-delimited JSON-RPC on stdin/stdout. Every line it reads is appended to $STDIO_LOG (one
JSON line each, so a test can count what reached the child); its pid is appended to $STDIO_PIDS
at start. Tools:
  echo {text, delay_ms, progress_message, progress_value}
                                answers after delay_ms; with a progressToken, one progress first
                                (with progress_message as its message; progress_value, any
                                JSON, as its progress, with no total)
  later {delay_ms}              answers, then after delay_ms sends a roots/list request (outside
                                any call); the answer to it is logged like any line read
  log {text, cr}                sends notifications/message (data: text; with cr, a bare \r
                                between its JSON tokens), then answers
  slow {}                       as a task (params.task): stays `working` until cancelled
  any tool as a task with {complete_ms}: the task is `completed` after complete_ms (with
  {"notify": true} also a notifications/tasks/status saying so; its
                                tasks/result then has a text content naming the task)
  hush {}                       closes its stdout (no answer) and runs on
  deafen {}                     answers, then closes its stdin and runs on
  stall {resume_ms, trickle_ms} answers, then stops reading its stdin (open) and runs on; with
                                resume_ms, reads again after that long; with trickle_ms, a slow
                                reader instead of a deaf one: reads one line every trickle_ms
                                meanwhile (and handles it); with resume_ms and chatter_ms, sends
                                a notifications/message every chatter_ms while it reads nothing
  fail {code}                   answers a JSON-RPC error with that code
  both {}                       answers with both a result and an error (an invalid answer)
tasks/result of a `working` task is never answered (its caller waits).
Behaviour switches (environment): STDIO_NO_TASKS=1 declares no tasks capability (gateway-owned
tasks, issue 32); STDIO_NOISE=1 prints a non-JSON line first; STDIO_CRASH_INIT=1
exits on initialize; STDIO_ROOTS_ON_INIT=1 sends a roots/list request (id "roots-init") on
initialize and waits for its answer (at most 4 s) before it answers the initialize; STDIO_IGNORE_EOF=1 keeps running after stdin closes (only a signal ends
it); STDIO_CANCEL_DELAY_MS delays tasks/cancel answers; STDIO_START_MS sleeps that long before it
reads its stdin at all (a slow start: a cold `npx -y`); STDIO_ASK=1 sends an
elicitation request (tool `ask`) and answers with what came back.
`server/discover` (taskgate's era probe) is answered -32601 like any unknown method, unless:
STDIO_MODERN=only answers it as a 2026-07-28-only server (supportedVersions ["2026-07-28"]) and,
as rmcp 3.11's stdio server does, answers `initialize` with -32022 and exits; STDIO_MODERN=dual
answers it with ["2025-11-25", "2026-07-28"]; STDIO_DISCOVER=silent never answers it;
STDIO_DISCOVER=crash exits on it. `subscriptions/listen` (2026-07-28) is acknowledged and sends
one notifications/tools/list_changed (both with `_meta` subscriptionId = its id), never answered.
"""
import json
import os
import sys
import threading
import time

out_lock = threading.Lock()
tasks = {}
tasks_lock = threading.Lock()
asked = {}
next_task = [0]
next_ask = [0]
roots_init_answered = threading.Event()
# (seconds between lines, until when) while the `stall` tool makes it a slow reader.
slow = [None]


def log(line):
    path = os.environ.get("STDIO_LOG")
    if path:
        with open(path, "a") as f:
            f.write(line.rstrip("\n") + "\n")


def send(msg):
    with out_lock:
        sys.stdout.write(json.dumps(msg) + "\n")
        sys.stdout.flush()


def answer(mid, result):
    send({"jsonrpc": "2.0", "id": mid, "result": result})


def task_obj(tid):
    t = tasks[tid]
    return {"taskId": tid, "status": t["status"], "createdAt": "2026-01-01T00:00:00Z",
            "lastUpdatedAt": "2026-01-01T00:00:00Z", "ttl": 60000, "pollInterval": 100}


def handle(msg):
    method = msg.get("method")
    mid = msg.get("id")
    params = msg.get("params") or {}
    modern = os.environ.get("STDIO_MODERN")
    if method == "server/discover":
        probe = os.environ.get("STDIO_DISCOVER")
        if probe == "crash":
            os._exit(4)
        if probe == "silent":
            return
        if modern:
            versions = ["2026-07-28"] if modern == "only" else ["2025-11-25", "2026-07-28"]
            answer(mid, {"resultType": "complete", "supportedVersions": versions,
                         "capabilities": {"tools": {}, "extensions": {"io.modelcontextprotocol/tasks": {}}},
                         "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "fake-stdio", "version": "1"}}})
            return
    if method == "initialize" and modern == "only":
        send({"jsonrpc": "2.0", "id": mid, "error": {"code": -32022, "message": "Unsupported protocol version",
                                                    "data": {"requested": params.get("protocolVersion"),
                                                             "supported": ["2026-07-28"]}}})
        sys.stdout.flush()
        os._exit(1)
    if method == "initialize":
        if os.environ.get("STDIO_CRASH_INIT"):
            os._exit(3)
        if os.environ.get("STDIO_ROOTS_ON_INIT"):
            # Before the client could answer (MCP lifecycle: a server SHOULD NOT).
            send({"jsonrpc": "2.0", "id": "roots-init", "method": "roots/list", "params": {}})
            roots_init_answered.wait(4.0)
        caps = {"tools": {}, "tasks": {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}}
        if os.environ.get("STDIO_NO_TASKS"):
            del caps["tasks"]
        answer(mid, {"protocolVersion": "2025-11-25", "capabilities": caps,
                     "serverInfo": {"name": "fake-stdio", "version": "1", "pid": os.getpid()}})
    elif method == "tools/list":
        answer(mid, {"tools": [
            {"name": "echo", "inputSchema": {"type": "object"}, "execution": {"taskSupport": "optional"}},
            {"name": "slow", "inputSchema": {"type": "object"}, "execution": {"taskSupport": "optional"}},
            {"name": "ask", "inputSchema": {"type": "object"}}]})
    elif method == "tools/call":
        name = params.get("name")
        args = params.get("arguments") or {}
        if "task" in params:
            with tasks_lock:
                next_task[0] += 1
                tid = "task-%d-%d" % (os.getpid(), next_task[0])
                tasks[tid] = {"status": "working"}
                answer(mid, {"task": task_obj(tid)})
            if "complete_ms" in args:
                def complete(tid=tid, delay=float(args["complete_ms"]) / 1000.0):
                    time.sleep(delay)
                    with tasks_lock:
                        if tasks[tid]["status"] == "working":
                            tasks[tid]["status"] = "completed"
                            tasks[tid]["text"] = "done " + tid
                            if args.get("notify"):
                                send({"jsonrpc": "2.0", "method": "notifications/tasks/status",
                                      "params": task_obj(tid)})
                threading.Thread(target=complete, daemon=True).start()
            return
        if name == "both":
            send({"jsonrpc": "2.0", "id": mid, "result": {"content": []},
                  "error": {"code": -32000, "message": "and an error"}})
            return
        if name == "fail":
            send({"jsonrpc": "2.0", "id": mid, "error": {"code": int(args.get("code", -32603)), "message": "failed on purpose"}})
            return
        if name == "later":
            answer(mid, {"content": [{"type": "text", "text": "later"}], "pid": os.getpid()})
            time.sleep(float(args.get("delay_ms", 0)) / 1000.0)
            send({"jsonrpc": "2.0", "id": "roots-1", "method": "roots/list", "params": {}})
            return
        if name == "log":
            note = json.dumps({"jsonrpc": "2.0", "method": "notifications/message",
                               "params": {"level": "info", "data": str(args.get("text", ""))}})
            if args.get("cr"):
                # JSON whitespace, so still one JSON-RPC message (its line ends at \n only).
                note = note.replace(', ', ',\r', 1)
            with out_lock:
                sys.stdout.write(note + "\n")
                sys.stdout.flush()
            answer(mid, {"content": [{"type": "text", "text": "logged"}], "pid": os.getpid()})
            return
        if name == "hush":
            # Closes its stdout and keeps running (reading stdin).
            with out_lock:
                sys.stdout.flush()
                os.close(1)
            return
        if name == "ask":
            next_ask[0] += 1
            aid = "ask-%d" % next_ask[0]
            asked[aid] = mid
            send({"jsonrpc": "2.0", "id": aid, "method": "elicitation/create",
                  "params": {"message": "ok?", "requestedSchema": {"type": "object", "properties": {}}}})
            return
        token = (params.get("_meta") or {}).get("progressToken")
        if token is not None:
            progress = {"progressToken": token, "progress": 1, "total": 2}
            if "progress_message" in args:
                progress["message"] = str(args["progress_message"])
            if "progress_value" in args:
                progress = {"progressToken": token, "progress": args["progress_value"]}
            send({"jsonrpc": "2.0", "method": "notifications/progress", "params": progress})
        time.sleep(float(args.get("delay_ms", 0)) / 1000.0)
        answer(mid, {"content": [{"type": "text", "text": str(args.get("text", ""))}],
                     "pid": os.getpid()})
    elif method == "tasks/get":
        tid = params.get("taskId")
        with tasks_lock:
            if tid not in tasks:
                send({"jsonrpc": "2.0", "id": mid, "error": {"code": -32602, "message": "Task not found"}})
                return
            answer(mid, task_obj(tid))
    elif method == "tasks/cancel":
        delay = float(os.environ.get("STDIO_CANCEL_DELAY_MS", "0")) / 1000.0
        time.sleep(delay)
        tid = params.get("taskId")
        with tasks_lock:
            t = tasks.get(tid)
            if t is None or t["status"] != "working":
                send({"jsonrpc": "2.0", "id": mid, "error": {"code": -32602, "message": "Cannot cancel task"}})
                return
            t["status"] = "cancelled"
            answer(mid, task_obj(tid))
    elif method == "tasks/result":
        # Answered only for a task no longer working (a working one's caller waits on).
        tid = params.get("taskId")
        with tasks_lock:
            t = tasks.get(tid)
            if t is None:
                send({"jsonrpc": "2.0", "id": mid, "error": {"code": -32602, "message": "Task not found"}})
            elif t["status"] != "working":
                content = [{"type": "text", "text": t["text"]}] if "text" in t else []
                answer(mid, {"content": content, "isError": t["status"] != "completed"})
    elif method == "subscriptions/listen":
        # 2026-07-28: acknowledged, one list_changed, then open until cancelled (never answered).
        meta = {"io.modelcontextprotocol/subscriptionId": mid}
        send({"jsonrpc": "2.0", "method": "notifications/subscriptions/acknowledged",
              "params": {"_meta": meta, "notifications": params.get("notifications") or {}}})
        send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed", "params": {"_meta": meta}})
    elif method == "ping":
        answer(mid, {})
    elif mid == "roots-init" and method is None:
        roots_init_answered.set()
    elif mid is not None and method is None:
        # An answer to our elicitation.
        call = asked.pop(mid, None)
        if call is not None:
            answer(call, {"content": [{"type": "text", "text": json.dumps(msg.get("result"))}]})
    elif mid is not None:
        send({"jsonrpc": "2.0", "id": mid, "error": {"code": -32601, "message": "Method not found"}})


def main():
    pids = os.environ.get("STDIO_PIDS")
    if pids:
        with open(pids, "a") as f:
            f.write("%d\n" % os.getpid())
    if os.environ.get("STDIO_NOISE"):
        sys.stdout.write("this line is not JSON-RPC\n")
        sys.stdout.flush()
    sys.stderr.write("fake stdio server started\n")
    sys.stderr.flush()
    time.sleep(float(os.environ.get("STDIO_START_MS", "0")) / 1000.0)
    try:
        for line in sys.stdin:
            if slow[0] is not None:
                pause, until = slow[0]
                if time.time() < until:
                    time.sleep(pause)
                else:
                    slow[0] = None
            log(line)
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if msg.get("method") == "tools/call" and (msg.get("params") or {}).get("name") == "deafen":
                # Answers, then closes its stdin (here, where it reads) and runs on, deaf.
                answer(msg.get("id"), {"content": [{"type": "text", "text": "deaf"}], "pid": os.getpid()})
                os.close(0)
                while True:
                    time.sleep(3600)
            if msg.get("method") == "tools/call" and (msg.get("params") or {}).get("name") == "stall":
                # Answers, then never reads its stdin again (a hung server: the pipe fills).
                answer(msg.get("id"), {"content": [{"type": "text", "text": "stalled"}], "pid": os.getpid()})
                args = (msg.get("params") or {}).get("arguments") or {}
                resume = args.get("resume_ms")
                trickle = args.get("trickle_ms")
                if trickle is not None:
                    until = time.time() + float(resume if resume is not None else 3600000) / 1000.0
                    slow[0] = (float(trickle) / 1000.0, until)
                    continue
                if resume is not None:
                    chatter = args.get("chatter_ms")
                    until = time.time() + float(resume) / 1000.0
                    while chatter is not None and time.time() < until:
                        # Busy, not deaf: a long call's progress on stdout.
                        send({"jsonrpc": "2.0", "method": "notifications/message",
                              "params": {"level": "info", "data": "working"}})
                        time.sleep(float(chatter) / 1000.0)
                    time.sleep(max(0.0, until - time.time()))
                    continue
                while True:
                    time.sleep(3600)
            threading.Thread(target=handle, args=(msg,), daemon=True).start()
    except (OSError, ValueError):
        pass
    if os.environ.get("STDIO_IGNORE_EOF"):
        while True:
            time.sleep(3600)


if __name__ == "__main__":
    main()

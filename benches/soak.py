#!/usr/bin/env python3
"""Soak: many SSE streams through taskgate for minutes, RSS sampled (issue 16).

Starts a scripted upstream (asyncio, 127.0.0.1) whose GET stream sends one small event a second
and whose POST answers are short SSE streams, and taskgate (TASKGATE_BIN, default
target/release/taskgate, else target/debug/taskgate), then:
  - STREAMS clients (default 1000) each initialize a session and hold its GET stream open;
  - every client also POSTs a tools/call answered as SSE every few seconds;
  - taskgate's VmRSS is sampled every 10 s; at the end: RSS first/max/last, events received,
    errors. Everything stops by itself after DURATION seconds (default 300).

    python3 benches/soak.py [--streams 1000] [--duration 300]

Raise the open-file limit first for 1,000 streams (`ulimit -n 8192`); the script tries itself.
"""
import argparse, asyncio, json, os, resource, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


async def upstream(reader, writer):
    counter = upstream.counter = getattr(upstream, "counter", 0)
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin1").split("\r\n")
            method = lines[0].split(" ")[0]
            headers = {l.split(":", 1)[0].lower(): l.split(":", 1)[1].strip() for l in lines[1:] if ":" in l}
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            if method == "GET":
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
                n = 0
                while True:
                    n += 1
                    ev = f'data: {{"jsonrpc":"2.0","method":"notifications/message","params":{{"level":"info","data":"tick {n}"}}}}\n\n'.encode()
                    writer.write(b"%x\r\n%s\r\n" % (len(ev), ev))
                    await writer.drain()
                    await asyncio.sleep(1)
            msg = json.loads(body) if body else {}
            extra = b""
            if msg.get("method") == "initialize":
                upstream.counter = getattr(upstream, "counter", 0) + 1
                extra = f"mcp-session-id: soak-{upstream.counter}\r\n".encode()
                out = json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": {
                    "protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
                    "serverInfo": {"name": "soak", "version": "1"}}}).encode()
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n" + extra +
                             b"content-length: %d\r\n\r\n%s" % (len(out), out))
            elif "id" in msg:
                evs = [json.dumps({"jsonrpc": "2.0", "method": "notifications/progress", "params": {
                    "progressToken": 1, "progress": i}}) for i in range(3)]
                evs.append(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": {"content": []}}))
                data = b"".join(f"data: {e}\n\n".encode() for e in evs)
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: %d\r\n\r\n%s"
                             % (len(data), data))
            else:
                writer.write(b"HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


async def request(port, method, body, sid, stats, read_events=None):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        head = (f"{method} /mcp HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\naccept: application/json, text/event-stream\r\n"
                f"content-type: application/json\r\nmcp-protocol-version: 2025-11-25\r\n")
        if sid:
            head += f"mcp-session-id: {sid}\r\n"
        data = body.encode() if body else b""
        head += f"content-length: {len(data)}\r\n\r\n"
        writer.write(head.encode() + data)
        await writer.drain()
        resp_head = (await reader.readuntil(b"\r\n\r\n")).decode("latin1")
        status = int(resp_head.split(" ")[1])
        if status >= 400:
            stats["errors"] += 1
            stats.setdefault("statuses", {}).setdefault(status, 0)
            stats["statuses"][status] += 1
        if read_events is not None:
            while True:
                line = await reader.readline()
                if not line:
                    stats["stream_ends"] += 1
                    return resp_head
                if line.startswith(b"data:"):
                    stats["events"] += 1
        low = resp_head.lower()
        if "content-length:" in low:
            n = int(low.split("content-length:")[1].split("\r\n")[0])
            payload = await reader.readexactly(n)
            stats["events"] += payload.count(b"data:")
        else:
            # Chunked: until the last chunk (a keep-alive connection does not close).
            while True:
                line = await reader.readline()
                if not line or line == b"0\r\n":
                    break
                if line.startswith(b"data:"):
                    stats["events"] += 1
        return resp_head
    finally:
        writer.close()


async def client(i, port, stop, stats):
    try:
        init = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "soak", "version": "1"}}})
        head = await request(port, "POST", init, None, stats)
        sid = [l.split(":", 1)[1].strip() for l in head.split("\r\n") if l.lower().startswith("mcp-session-id:")][0]
        get = asyncio.create_task(request(port, "GET", None, sid, stats, read_events=True))
        n = 0
        while not stop.is_set():
            await asyncio.sleep(3 + (i % 5))
            n += 1
            call = json.dumps({"jsonrpc": "2.0", "id": n + 1, "method": "tools/call", "params": {"name": "x"}})
            await request(port, "POST", call, sid, stats)
        get.cancel()
    except asyncio.CancelledError:
        pass
    except Exception as e:  # counted, not fatal
        stats["errors"] += 1
        stats.setdefault("first_error", repr(e))


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


async def main(args):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 4 * args.streams + 1024)), hard))
    server = await asyncio.start_server(upstream, "127.0.0.1", 0, backlog=8192)
    up_port = server.sockets[0].getsockname()[1]
    binary = os.environ.get("TASKGATE_BIN") or next(
        p for p in (f"{ROOT}/target/release/taskgate", f"{ROOT}/target/debug/taskgate") if os.path.exists(p))
    with tempfile.TemporaryDirectory() as d:
        cfg = f"{d}/taskgate.toml"
        with open(cfg, "w") as f:
            f.write(f'[gateway]\nlisten = "127.0.0.1:0"\nmax_connections = {4 * args.streams}\n'
                    f'[admin]\nlisten = "127.0.0.1:0"\n[store]\npath = "{d}/store"\n'
                    f'[[upstream]]\nname = "u"\nurl = "http://127.0.0.1:{up_port}/mcp"\n')
        proc = subprocess.Popen([binary, "serve", "--config", cfg], stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True)
        try:
            line = await asyncio.get_running_loop().run_in_executor(None, proc.stdout.readline)
            port = int(json.loads(line)["listening"]["gateway"].rsplit(":", 1)[1])
            stats = {"events": 0, "errors": 0, "stream_ends": 0}
            stop = asyncio.Event()
            tasks = [asyncio.create_task(client(i, port, stop, stats)) for i in range(args.streams)]
            started, samples = time.time(), []
            while time.time() - started < args.duration:
                samples.append(rss_mib(proc.pid))
                print(f"t={time.time() - started:5.0f}s RSS {samples[-1]:6.1f} MiB events {stats['events']} "
                      f"errors {stats['errors']}", flush=True)
                await asyncio.sleep(10)
            stop.set()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            print(f"streams {args.streams}, {args.duration} s, taskgate {binary}")
            print(f"RSS first {samples[0]:.1f} MiB, max {max(samples):.1f} MiB, last {samples[-1]:.1f} MiB; "
                  f"events {stats['events']}, errors {stats['errors']}, GET streams ended early "
                  f"{stats['stream_ends']}, error statuses {stats.get('statuses', {})}" + (f", first error {stats['first_error']}" if 'first_error' in stats else ""))
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            server.close()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--streams", type=int, default=1000)
    p.add_argument("--duration", type=int, default=300)
    asyncio.run(main(p.parse_args()))

#!/usr/bin/env python3
"""RSS of taskgate under client-chosen and upstream-issued session ids (issue 16, item 3).

Starts a scripted upstream (Python, on 127.0.0.1) and taskgate (`TASKGATE_BIN`, default
target/release/taskgate, else target/debug/taskgate), then sends
  1. N `tools/list` with a random `Mcp-Session-Id` each, and
  2. N `initialize` (the upstream issues a new session id on each),
printing taskgate's VmRSS before and after each phase. Everything stops by itself.

    python3 benches/session_rss.py [N]        # N defaults to 100000
    PHASES=init python3 benches/session_rss.py   # only the initialize phase
"""
import http.client, http.server, json, os, socket, subprocess, sys, tempfile, threading, time, uuid

N = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
THREADS = 8
PHASES = os.environ.get("PHASES", "list,init")  # which phases run
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOLS = {"tools": [{"name": f"tool-{i}", "inputSchema": {"type": "object"},
                    "execution": {"taskSupport": "optional"}} for i in range(20)]}


class Upstream(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    counter = [0]
    lock = threading.Lock()

    def log_message(self, *a):
        pass

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        msg = json.loads(body)
        extra = {}
        if msg.get("method") == "initialize":
            with self.lock:
                self.counter[0] += 1
                extra["mcp-session-id"] = f"up-{self.counter[0]}-{uuid.uuid4().hex}"
            result = {"protocolVersion": "2025-11-25", "serverInfo": {"name": "rss", "version": "1"},
                      "capabilities": {"tools": {}, "tasks": {"requests": {"tools": {"call": {}}}}}}
        elif msg.get("method") == "tools/list":
            result = TOOLS
        else:
            result = {}
        out = json.dumps({"jsonrpc": "2.0", "id": msg.get("id"), "result": result}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(out)))
        for k, v in extra.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(out)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def worker(port, count, body_of, session_of, errors):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    for i in range(count):
        headers = {"content-type": "application/json", "accept": "application/json, text/event-stream",
                   "mcp-protocol-version": "2025-11-25"}
        sid = session_of(i)
        if sid:
            headers["mcp-session-id"] = sid
        try:
            conn.request("POST", "/mcp", body_of(i), headers)
            r = conn.getresponse()
            r.read()
            if r.status != 200:
                errors.append(r.status)
        except Exception as e:  # connection closed: reconnect
            errors.append(str(e))
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)


def phase(port, body_of, session_of):
    errors, threads = [], []
    for t in range(THREADS):
        th = threading.Thread(target=worker, args=(port, N // THREADS, body_of, session_of, errors))
        th.start()
        threads.append(th)
    for th in threads:
        th.join()
    return errors


def main():
    up_port = free_port()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", up_port), Upstream)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    binary = os.environ.get("TASKGATE_BIN") or next(
        p for p in (f"{ROOT}/target/release/taskgate", f"{ROOT}/target/debug/taskgate") if os.path.exists(p))
    with tempfile.TemporaryDirectory() as d:
        cfg = f"{d}/taskgate.toml"
        with open(cfg, "w") as f:
            f.write(f'[gateway]\nlisten = "127.0.0.1:0"\n[admin]\nlisten = "127.0.0.1:0"\n'
                    f'[store]\npath = "{d}/store"\n[[upstream]]\nname = "u"\nurl = "http://127.0.0.1:{up_port}/mcp"\n')
        proc = subprocess.Popen([binary, "serve", "--config", cfg], stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True)
        try:
            line = proc.stdout.readline()
            port = int(json.loads(line)["listening"]["gateway"].rsplit(":", 1)[1])
            print(f"taskgate {binary}, N = {N}")
            print(f"start:                          RSS {rss_kib(proc.pid) / 1024:7.1f} MiB")
            t = time.time()
            if "list" in PHASES:
                errs = phase(port, lambda i: json.dumps({"jsonrpc": "2.0", "id": i, "method": "tools/list"}),
                             lambda i: uuid.uuid4().hex)
                print(f"after {N} tools/list, random ids: RSS {rss_kib(proc.pid) / 1024:7.1f} MiB "
                      f"({time.time() - t:.0f} s, {len(errs)} non-200)")
            t = time.time()
            init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {"tasks": {}},
                "clientInfo": {"name": "rss", "version": "1"}}}
            if "init" not in PHASES:
                return
            errs = phase(port, lambda i: json.dumps(init), lambda i: None)
            print(f"after {N} initialize:            RSS {rss_kib(proc.pid) / 1024:7.1f} MiB "
                  f"({time.time() - t:.0f} s, {len(errs)} non-200)")
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            server.shutdown()


if __name__ == "__main__":
    main()

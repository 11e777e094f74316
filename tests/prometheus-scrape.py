#!/usr/bin/env python3
"""A real Prometheus server scrapes taskgate's admin listener (issue 4's proof).

Starts taskgate (target/debug/taskgate) on ephemeral ports, checks the exposition with
`promtool check metrics`, starts `prometheus` with a 1 s scrape of the admin listener, and asks
Prometheus's HTTP query API for `taskgate_tasks_cancelled_total`. Exits 0 only when the series
comes back with a value for the configured upstream. Everything listens on 127.0.0.1 and is
stopped on exit.
"""
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    procs = []
    with tempfile.TemporaryDirectory() as d:
        try:
            cfg = os.path.join(d, "taskgate.toml")
            with open(cfg, "w") as f:
                f.write(
                    '[gateway]\nlisten = "127.0.0.1:0"\n[admin]\nlisten = "127.0.0.1:0"\n'
                    f'[store]\npath = "{d}/store"\n[[upstream]]\nname = "up1"\n'
                    'url = "http://127.0.0.1:9/mcp"\n'
                )
            tg = subprocess.Popen(
                ["target/debug/taskgate", "serve", "--config", cfg],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            )
            procs.append(tg)
            admin = json.loads(tg.stdout.readline())["listening"]["admin"]
            exposition = urllib.request.urlopen(f"http://{admin}/metrics", timeout=10).read()
            check = subprocess.run(["promtool", "check", "metrics"], input=exposition,
                                   capture_output=True)
            if check.returncode != 0:
                print("promtool check metrics failed:", check.stdout.decode(), check.stderr.decode())
                return 1
            print("promtool check metrics: ok")

            prom_port = free_port()
            prom_cfg = os.path.join(d, "prometheus.yml")
            with open(prom_cfg, "w") as f:
                f.write(
                    "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                    "scrape_configs:\n  - job_name: taskgate\n"
                    f"    static_configs:\n      - targets: ['{admin}']\n"
                )
            prom = subprocess.Popen(
                ["prometheus", f"--config.file={prom_cfg}", f"--storage.tsdb.path={d}/tsdb",
                 f"--web.listen-address=127.0.0.1:{prom_port}"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            procs.append(prom)
            query = urllib.parse.urlencode({"query": "taskgate_tasks_cancelled_total"})
            url = f"http://127.0.0.1:{prom_port}/api/v1/query?{query}"
            deadline = time.time() + 60
            last = None
            while time.time() < deadline:
                try:
                    last = json.load(urllib.request.urlopen(url, timeout=5))
                    results = last.get("data", {}).get("result", [])
                    if any(r["metric"].get("upstream") == "up1" and r["metric"].get("job") == "taskgate"
                           for r in results):
                        print("prometheus query taskgate_tasks_cancelled_total:", json.dumps(results))
                        return 0
                except OSError:
                    pass
                time.sleep(0.5)
            print("prometheus never returned taskgate_tasks_cancelled_total; last answer:", last)
            return 1
        finally:
            for p in procs:
                p.terminate()
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    p.kill()


if __name__ == "__main__":
    sys.exit(main())

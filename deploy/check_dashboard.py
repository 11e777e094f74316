#!/usr/bin/env python3
"""Checks deploy/grafana/taskgate.json (or the file given) as a Grafana dashboard.

    python3 deploy/check_dashboard.py [DASHBOARD] [--promtool PATH]

* JSON that parses, with title, uid, schemaVersion, panels and templating;
* every panel: a unique id, a type, a title, a gridPos inside the 24-column grid that overlaps
  no other panel; every non-row panel takes its data source from the `${datasource}` variable
  and has targets with a PromQL `expr` and unique refIds;
* every `$variable` used in a query is defined in templating, and a query variable's
  `definition` (what Grafana's editor shows) is its query;
* required panels are there (tasks by status, creation by origin, cancel outcomes, the two
  cancellation latencies, cancelled-unreleased, upstream latency and errors, request rate, SSE);
* every query is valid PromQL: each is written (Grafana variables replaced) as a recording rule
  into a temporary rule file that `promtool check rules` must accept.
Standard library only; promtool from the Debian package `prometheus`.
"""
import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

DEPLOY = Path(__file__).resolve().parent
sys.path.insert(0, str(DEPLOY))
from metric_names import grafana_vars  # noqa: E402

REQUIRED = {  # what a panel's queries must contain -> what the panel shows
    "taskgate_tasks{": "tasks by status",
    "taskgate_tasks_created_total": "creation rate by origin",
    "taskgate_cancel_requests_total": "cancel outcomes",
    "taskgate_cancel_to_cancelled_seconds_bucket": "cancel→cancelled latency",
    "taskgate_cancelled_to_released_seconds_bucket": "cancelled→released latency",
    "taskgate_tasks_cancelled_unreleased": "cancelled-unreleased gauge",
    "taskgate_request_duration_seconds_bucket": "upstream latency",
    "taskgate_upstream_errors_total": "upstream errors",
    "taskgate_requests_total": "request rate",
    "taskgate_sse_streams_open": "open SSE streams",
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dashboard", type=Path, nargs="?", default=DEPLOY / "grafana/taskgate.json")
    ap.add_argument("--promtool", default="promtool")
    a = ap.parse_args()
    errors = []

    try:
        dash = json.loads(a.dashboard.read_text())
    except (OSError, json.JSONDecodeError) as e:
        print(f"check_dashboard: FAIL: {a.dashboard}: {e}", file=sys.stderr)
        return 1
    for key in ("title", "uid", "schemaVersion", "panels", "templating"):
        if key not in dash:
            errors.append(f"top-level key {key!r} missing")
    variables = {v.get("name") for v in dash.get("templating", {}).get("list", [])}
    if "datasource" not in variables:
        errors.append("no `datasource` template variable")

    panels, ids, boxes, exprs = [], set(), [], []

    def walk(ps):
        for p in ps:
            panels.append(p)
            walk(p.get("panels", []))

    walk(dash.get("panels", []))
    for p in panels:
        name = f"panel {p.get('id')} {p.get('title')!r}"
        for key in ("id", "type", "title", "gridPos"):
            if key not in p:
                errors.append(f"{name}: no {key}")
        if p.get("id") in ids:
            errors.append(f"{name}: duplicate id")
        ids.add(p.get("id"))
        g = p.get("gridPos", {})
        if not all(isinstance(g.get(k), int) for k in ("x", "y", "w", "h")):
            errors.append(f"{name}: gridPos needs integer x, y, w, h")
            continue
        if g["x"] < 0 or g["w"] <= 0 or g["x"] + g["w"] > 24 or g["h"] <= 0:
            errors.append(f"{name}: gridPos {g} is outside the 24-column grid")
        for other_name, o in boxes:
            if g["x"] < o["x"] + o["w"] and o["x"] < g["x"] + g["w"] and g["y"] < o["y"] + o["h"] and o["y"] < g["y"] + g["h"]:
                errors.append(f"{name}: overlaps {other_name}")
        boxes.append((name, g))
        if p.get("type") == "row":
            continue
        if p.get("datasource", {}).get("uid") != "${datasource}":
            errors.append(f"{name}: datasource is not ${{datasource}}")
        targets = p.get("targets", [])
        if not targets:
            errors.append(f"{name}: no targets")
        refids = [t.get("refId") for t in targets]
        if len(set(refids)) != len(refids) or None in refids:
            errors.append(f"{name}: refIds {refids} are not unique")
        for t in targets:
            expr = t.get("expr")
            if not expr:
                errors.append(f"{name} {t.get('refId')}: no expr")
                continue
            exprs.append((f"{name} {t.get('refId')}", expr))
    for v in dash.get("templating", {}).get("list", []):
        q = v.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        if v.get("type") == "query" and isinstance(q, str):
            if v.get("definition") not in (None, q):
                errors.append(f"variable ${v.get('name')}: definition {v['definition']!r} differs from its query {q!r}")
            m = re.fullmatch(r"\s*label_values\((.*),\s*[a-zA-Z_][a-zA-Z0-9_]*\)\s*", q)
            exprs.append((f"variable ${v.get('name')}", m.group(1) if m else q))

    builtin = {"__rate_interval", "__interval", "__range", "__interval_ms", "__range_s"}
    for where, expr in exprs:
        for var in re.findall(r"\$\{?([a-zA-Z_][a-zA-Z0-9_]*)", expr):
            if var not in variables and var not in builtin:
                errors.append(f"{where}: uses undefined variable ${var}")
    all_exprs = "\n".join(e for _, e in exprs)
    for needle, what in REQUIRED.items():
        if needle not in all_exprs:
            errors.append(f"no panel shows {what} ({needle})")

    # PromQL syntax, through promtool
    with tempfile.TemporaryDirectory() as tmp:
        rules = Path(tmp) / "dashboard-queries.yml"
        lines = ["groups:", "  - name: dashboard", "    rules:"]
        for i, (where, expr) in enumerate(exprs):
            lines += [f"      - record: dashboard:query_{i}", f"        expr: {json.dumps(grafana_vars(expr))}"]
        rules.write_text("\n".join(lines) + "\n")
        try:
            r = subprocess.run([a.promtool, "check", "rules", str(rules)], capture_output=True, text=True)
        except FileNotFoundError:
            errors.append(f"{a.promtool} not found (Debian package prometheus)")
        else:
            if r.returncode != 0:
                out = (r.stdout + r.stderr).strip()
                for m in re.finditer(r"query_(\d+)", out):
                    errors.append(f"{exprs[int(m.group(1))][0]}: PromQL rejected by promtool")
                errors.append("promtool check rules on the dashboard's queries: " + out.replace("\n", " | "))

    for e in errors:
        print(f"check_dashboard: FAIL: {e}", file=sys.stderr)
    if not errors:
        print(f"check_dashboard: ok: {len(panels)} panels, {len(exprs)} queries valid PromQL (promtool), layout and variables consistent")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

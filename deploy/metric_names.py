#!/usr/bin/env python3
"""Checks that every metric the alert rules and the dashboard use is one taskgate exposes.

    python3 deploy/metric_names.py METRICS_FILE [--rules FILE]... [--dashboard FILE]... [--list]

METRICS_FILE is a /metrics scrape in the Prometheus text format (`curl http://ADMIN/metrics`).
Defaults: deploy/prometheus/taskgate-rules.yml and deploy/grafana/taskgate.json.

From every PromQL expression (rule `expr`, dashboard target `expr`, template variable queries)
it takes the metric names and checks each against the exposition:
  * a name must be a metric family there (`# TYPE`) or a sample name;
  * `X_bucket` needs X to be a histogram, `X_sum`/`X_count` a histogram or summary;
  * a histogram family used bare (no suffix) is an error: such a series does not exist;
  * label names in selectors (`name{label="..."}`) and in `by (...)` must be labels of the metric
    (as seen in the exposition) or target labels Prometheus adds (job, instance, namespace, pod);
  * names not starting with `taskgate_` must be series Prometheus makes itself (`up`).
Exit 0 when everything is found, 1 with one line per problem otherwise. Standard library only.
"""
import argparse
import json
import re
import sys
from pathlib import Path

DEPLOY = Path(__file__).resolve().parent
TARGET_LABELS = {"job", "instance", "namespace", "pod"}
SYNTHETIC = {"up": set()}  # series Prometheus records for every target, with their own labels
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
            "offset", "inf", "nan", "start", "end", "atan2"}
SUFFIXES = ("_bucket", "_sum", "_count")


# --- exposition -----------------------------------------------------------------------------------
def parse_exposition(text):
    """Returns (types: family -> type, labels: sample name -> set of label names)."""
    types, labels = {}, {}
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        if line.startswith("#"):
            m = re.match(r"#\s*TYPE\s+([a-zA-Z_:][a-zA-Z0-9_:]*)\s+(\w+)", line)
            if m:
                types[m.group(1)] = m.group(2)
            continue
        m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s", line)
        if not m:
            raise ValueError(f"not a sample line: {line!r}")
        names = set(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"', m.group(3) or ""))
        labels.setdefault(m.group(1), set()).update(names)
    return types, labels


# --- PromQL ---------------------------------------------------------------------------------------
def strip_strings(expr):
    return re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)


def metric_uses(expr):
    """Yields (name, selector label names, grouping label names of the whole expression)."""
    e = strip_strings(expr)
    e = re.sub(r"\[[^\]]*\]", "", e)                      # range and subquery brackets
    groupings = set()
    for m in re.finditer(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", e):
        if m.group(1) in ("by", "on"):
            groupings.update(x.strip() for x in m.group(2).split(",") if x.strip())
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    uses = []
    for m in re.finditer(r"([a-zA-Z_:][a-zA-Z0-9_:]*)?\s*\{([^}]*)\}", e):
        sel = set(re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", m.group(2)))
        name = m.group(1)
        if name is None:
            nm = re.search(r"__name__", m.group(2))
            if nm:
                raise ValueError(f"selector by __name__ is not checked: {expr!r}")
            continue
        uses.append((name, sel))
    e_wo_sel = re.sub(r"\{[^}]*\}", " ", e)
    for m in re.finditer(r"(?<![a-zA-Z0-9_:.])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![a-zA-Z0-9_:])(?!\s*\()", e_wo_sel):
        name = m.group(1)
        if name.lower() in KEYWORDS or re.fullmatch(r"\d+[smhdwy]", name):
            continue
        uses.append((name, set()))
    return uses, groupings


def grafana_vars(expr):
    """Replaces Grafana's variables with PromQL that parses."""
    e = expr.replace("$__rate_interval", "5m").replace("$__interval", "1m").replace("$__range", "1h")
    return re.sub(r"\$\{?[a-zA-Z_]+\}?", ".*", e)


# --- sources --------------------------------------------------------------------------------------
def rule_exprs(path):
    import_yaml = None
    try:
        import yaml  # noqa: F401
        import_yaml = yaml
    except ImportError:
        pass
    text = path.read_text()
    if import_yaml:
        doc = import_yaml.safe_load(text)
        for g in doc.get("groups", []):
            for r in g.get("rules", []):
                yield f"{path.name}: {r.get('alert') or r.get('record')}", str(r["expr"])
        return
    # Without PyYAML: `expr:` scalars and `|` blocks of the rule files written here.
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^(\s*)expr:\s*(.*)$", lines[i])
        if m:
            indent, rest = len(m.group(1)), m.group(2).strip()
            if rest in ("|", ">", "|-", ">-"):
                block = []
                i += 1
                while i < len(lines) and (not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > indent):
                    block.append(lines[i].strip())
                    i += 1
                yield f"{path.name}: line {i}", " ".join(block)
                continue
            yield f"{path.name}: line {i + 1}", rest
        i += 1


def dashboard_exprs(path):
    dash = json.loads(path.read_text())

    def walk(panels):
        for p in panels:
            for t in p.get("targets", []):
                if t.get("expr"):
                    yield f"{path.name}: panel {p.get('title')!r} {t.get('refId')}", grafana_vars(t["expr"])
            yield from walk(p.get("panels", []))

    yield from walk(dash.get("panels", []))
    for v in dash.get("templating", {}).get("list", []):
        q = v.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        if v.get("type") == "query" and isinstance(q, str):
            m = re.fullmatch(r"\s*label_values\((.*),\s*([a-zA-Z_][a-zA-Z0-9_]*)\)\s*", q)
            if m:  # label_values(selector, label): the label must exist on the metric
                yield f"{path.name}: variable ${v['name']}", f"sum by ({m.group(2)}) ({grafana_vars(m.group(1))})"
            else:
                yield f"{path.name}: variable ${v['name']}", grafana_vars(q)


# --- check ----------------------------------------------------------------------------------------
def check(exprs, types, labels):
    problems, used = [], {}
    for where, expr in exprs:
        uses, groupings = metric_uses(expr)
        expr_labels, missing = set(), False
        for name, sel in uses:
            used.setdefault(name, set()).add(where)
            if name in SYNTHETIC:
                known = TARGET_LABELS | SYNTHETIC[name]
            elif not name.startswith("taskgate_"):
                problems.append(f"{where}: {name} is not a taskgate metric")
                continue
            else:
                base = next((name[: -len(s)] for s in SUFFIXES if name.endswith(s)), None)
                if name in types and types[name] in ("histogram", "summary"):
                    problems.append(f"{where}: {name} is a {types[name]}: use {name}_bucket, _sum or _count")
                    continue
                if name in types or name in labels:
                    pass
                elif base and types.get(base) == "histogram" or (base and name.endswith(("_sum", "_count")) and types.get(base) == "summary"):
                    pass
                else:
                    problems.append(f"{where}: {name} is not exposed by /metrics")
                    missing = True
                    continue
                known = TARGET_LABELS | labels.get(name, set())
            expr_labels |= known
            for lab in sorted(sel - known):
                problems.append(f"{where}: {name} has no label {lab!r} (it has {sorted(known - TARGET_LABELS) or 'none'})")
        if any(n.endswith("_bucket") for n, _ in uses):
            expr_labels.add("le")
        for lab in sorted(groupings - expr_labels):
            if uses and not missing:
                problems.append(f"{where}: grouping label {lab!r} is on none of {sorted({n for n, _ in uses})}")
    return list(dict.fromkeys(problems)), used


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("metrics", type=Path, help="a /metrics scrape (Prometheus text format)")
    ap.add_argument("--rules", type=Path, action="append")
    ap.add_argument("--dashboard", type=Path, action="append")
    ap.add_argument("--list", action="store_true", help="print every metric name used and where")
    a = ap.parse_args()
    rules = a.rules or [DEPLOY / "prometheus/taskgate-rules.yml"]
    dashboards = a.dashboard or [DEPLOY / "grafana/taskgate.json"]
    types, labels = parse_exposition(a.metrics.read_text())
    exprs = [x for r in rules for x in rule_exprs(r)] + [x for d in dashboards for x in dashboard_exprs(d)]
    problems, used = check(exprs, types, labels)
    if a.list:
        for name in sorted(used):
            print(f"{name}\t{len(used[name])} use(s)")
    for p in problems:
        print(f"metric_names: FAIL: {p}", file=sys.stderr)
    if not problems:
        print(f"metric_names: ok: {len(used)} metric names in {len(exprs)} expressions "
              f"({', '.join(p.name for p in rules + dashboards)}) are exposed by {a.metrics}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Compares conformance-next tasks-* runs for reverse.sh (standard library only).

    python3 reverse-conformance-compare.py WORK DIFFERENCES SCENARIO...

Reads WORK/conformance-{direct,via}-SCENARIO.log (the `[check-id] STATUS` lines the suite prints)
and DIFFERENCES (`check-id  # why` per line). Every check must have its direct status through
taskgate, except the listed ones, which must fail through taskgate (listed and passing: stale).
Prints each difference and the totals; exit 0 only when nothing else differs.
"""

import re
import sys


def main() -> int:
    work, explained_file, scenarios = sys.argv[1], sys.argv[2], sys.argv[3:]
    explained = {}
    for line in open(explained_file):
        line = line.strip()
        if line and not line.startswith("#"):
            check, _, why = line.partition("#")
            explained[check.strip()] = why.strip()
    mark = re.compile(r"\[([A-Za-z0-9_.:-]+) *\] (SUCCESS|FAILURE|WARNING|SKIPPED|INFO)")

    def run(route: str) -> dict:
        out = {}
        for s in scenarios:
            try:
                text = open(f"{work}/conformance-{route}-{s}.log").read()
            except OSError:
                text = ""
            text = re.sub(r"\x1b\[[0-9;]*m", "", text)
            for m in mark.finditer(text):
                out[f"{s}/{m.group(1)}"] = m.group(2)
        return out

    direct, via = run("direct"), run("via")
    ok = bool(scenarios) and bool(direct)
    print(
        f"conformance-next tasks-* ({len(scenarios)} scenarios): direct = the 2026 fixture (FastMCP 4.1.4), "
        "via = taskgate + the 2025 fixture (TS SDK 1.32.2)"
    )
    for key in sorted(set(direct) | set(via)):
        d, v = direct.get(key, "-"), via.get(key, "-")
        check = key.split("/", 1)[1]
        if check in explained:
            good = v == "FAILURE"
            print(f"  {'explained' if good else 'STALE'}  {key}: direct {d}, via {v}  # {explained[check]}")
            ok &= good
        elif d != v:
            print(f"  DIFFERS  {key}: direct {d}, via {v}")
            ok = False

    def count(r: dict) -> str:
        return f"{sum(s == 'SUCCESS' for s in r.values())}/{sum(s in ('SUCCESS', 'FAILURE') for s in r.values())}"

    print(f"  checks passed: direct {count(direct)}, via taskgate {count(via)}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

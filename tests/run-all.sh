#!/usr/bin/env bash
# taskgate's whole test suite, as README.md gives it: `bash tests/run-all.sh`.
#
# 1. installs what the tests need when it is missing (Debian packages with apt-get when run as
#    root; npm packages with exact versions by `npm ci`; PyPI packages into venvs by pip);
# 2. cargo test (unit tests, integration tests against scripted upstreams, crash/restart tests),
#    with a throwaway PostgreSQL (tests/pg/cluster.sh) for the PostgreSQL store and tier tests;
# 3. tests/interop/run.sh: real peers (MCP conformance suite, TypeScript SDK, Python SDK) direct
#    and through taskgate; tests/oauth/run.sh: a real oidc-provider issuing JWT access tokens and
#    the TypeScript SDK's OAuth client reaching a task server through taskgate in oauth mode;
# 4. a real Prometheus server scraping taskgate; deploy/check.sh: Kubernetes schemas, promtool
#    rules/tests, dashboard and metric names against a real /metrics scrape, container image.
#    The deploy checks start with 3. and run in the background beside it (their image build is
#    CPU, the interop suite mostly waits); their output is printed whole after the Prometheus part.
# Exit 0 only when every part passed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

need_apt=()
command -v promtool >/dev/null 2>&1 || need_apt+=(prometheus)
command -v node >/dev/null 2>&1 || need_apt+=(nodejs npm)
python3 -c 'import venv' >/dev/null 2>&1 || need_apt+=(python3-venv)
# The container image check builds for musl; ring (rustls) compiles C with x86_64-linux-musl-gcc.
command -v musl-gcc >/dev/null 2>&1 || need_apt+=(musl-tools)
# The PostgreSQL store's tests (a throwaway cluster, tests/pg/cluster.sh) and the tier test's
# load balancer.
compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || need_apt+=(postgresql)
[[ -x /usr/sbin/nginx ]] || need_apt+=(nginx)
# tests/tier.rs: 2025-11-25 sessions under authentication behind HAProxy's session stickiness.
[[ -x /usr/sbin/haproxy ]] || need_apt+=(haproxy)
# The interop suite's real HTTP proxy in front of an https:// upstream (upstream.proxy).
command -v tinyproxy >/dev/null 2>&1 || need_apt+=(tinyproxy)
if ((${#need_apt[@]})); then
    if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
        echo "== installing Debian packages: ${need_apt[*]}"
        DEBIAN_FRONTEND=noninteractive apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
    else
        echo "missing: ${need_apt[*]} (install them, or run this as root on Debian)" >&2
        exit 1
    fi
fi
if [[ ! -d tests/interop/node_modules ]]; then
    echo "== npm ci (tests/interop)"
    (cd tests/interop && npm ci --no-audit --no-fund --loglevel=error)
fi

status=0
# Wall time of each part, printed at the end (README gives the totals).
parts=()
part_name="" part_start=$SECONDS
part() {
    local short="${part_name%%:*}"
    if [[ -n $part_name ]]; then parts+=("${short%% (*} $((SECONDS - part_start)) s"); fi
    part_name="$1" part_start=$SECONDS
    if [[ -n $1 ]]; then echo "== $1"; fi
}
# A throwaway PostgreSQL for the whole run; the PostgreSQL tests must run, never skip.
source tests/pg/cluster.sh
deploy_pid=""
# On the way out: the deploy checks, if still running (they stop their own containers), then PostgreSQL.
finish() {
    if [[ -n $deploy_pid ]]; then
        kill -TERM -- "-$deploy_pid" 2>/dev/null
        wait "$deploy_pid" 2>/dev/null
    fi
    pg_stop
}
trap finish EXIT
part "cargo test"
cargo test --locked --no-fail-fast || status=1

part "API docs (cargo doc, warnings are errors: no broken link, no public doc naming a private item)"
RUSTDOCFLAGS="-D warnings" cargo doc --locked --no-deps --lib --quiet || status=1

part "interop with real MCP peers (the deploy checks run meanwhile)"
cargo build --locked --quiet
# The deploy checks start now, in the background: their container image check is a musl release
# build (CPU: about 3 minutes on 2 cores), the interop suite mostly waits on its peers (about a
# fifth of 2 cores), so the build fills the idle CPU instead of adding its time to the run's
# (issue 30). Their output is kept and printed whole in their part below.
deploy_log=$(mktemp /tmp/taskgate-deploy.XXXXXX)
deploy_checks() {
    local scrape rc=0
    scrape=$(mktemp /tmp/taskgate-scrape.XXXXXX)
    python3 - "$scrape" <<'PY' || rc=1
import json, subprocess, sys, tempfile, urllib.request, os
out = sys.argv[1]
with tempfile.TemporaryDirectory() as d:
    cfg = os.path.join(d, "c.toml")
    open(cfg, "w").write(f"""[gateway]\nlisten = "127.0.0.1:0"\n[admin]\nlisten = "127.0.0.1:0"\n[store]\npath = "{d}/store"\n[upgrade]\nenabled = true\n[[upstream]]\nname = "default"\nurl = "http://127.0.0.1:9/mcp"\n""")
    p = subprocess.Popen(["target/debug/taskgate", "serve", "--config", cfg], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        admin = json.loads(p.stdout.readline())["listening"]["admin"]
        body = urllib.request.urlopen(f"http://{admin}/metrics", timeout=10).read()
        open(out, "wb").write(body)
    finally:
        p.terminate(); p.wait(timeout=15)
PY
    TASKGATE_METRICS_FILE="$scrape" bash deploy/check.sh || rc=1
    rm -f "$scrape"
    return $rc
}
deploy_start=$SECONDS
# A process group of their own (set -m), so that `finish` can stop all of it: cargo, podman.
set -m
deploy_checks >"$deploy_log" 2>&1 &
deploy_pid=$!
set +m
bash tests/interop/run.sh target/debug/taskgate || status=1

part "OAuth: a real oidc-provider and the TypeScript SDK client through taskgate"
bash tests/oauth/run.sh target/debug/taskgate || status=1

part "a real Prometheus scrapes taskgate (promtool check metrics, query API)"
python3 tests/prometheus-scrape.py || status=1

part "deploy checks (with the metric names of a real /metrics scrape; started with interop)"
deploy_rc=0
wait "$deploy_pid" || deploy_rc=$?
deploy_pid=""
cat "$deploy_log"
rm -f "$deploy_log"
echo "== deploy checks: $( ((deploy_rc == 0)) && echo passed || echo "FAILED (exit $deploy_rc)") in $((SECONDS - deploy_start)) s since they started"
((deploy_rc == 0)) || status=1

part ""
echo "== wall times: $(IFS=,; echo "${parts[*]}" | sed 's/,/, /g'); total $SECONDS s"
if ((status == 0)); then echo "== all tests passed"; else echo "== SOME TESTS FAILED" >&2; fi
exit $status

#!/usr/bin/env bash
# A gateway tier with real peers (issue 13, "How it is proven"): three taskgate replicas sharing
# one PostgreSQL behind nginx, in front of real task servers of both eras, compared with the
# same runs direct. run.sh calls it as step h (strict); it also runs alone:
#
#   tests/interop/tier.sh TASKGATE_BIN
#
# - 2026-07-28, round-robin, no stickiness (`location /mcp/modern`): conformance 0.2.0-alpha.12
#   (conformance-next, `--suite all`) against the FastMCP 4.1.4 fixture (modern_task_server.py),
#   direct and through the balancer; every tasks-* scenario and each of its checks through the
#   tier must have its direct result (modern-compare.mjs --scenario-prefix tasks-), and the
#   direct failures must be exactly conformance-next-expected-failures.txt.
# - 2025-11-25, round-robin, no stickiness (issue 35; `location /mcp/ts`, and `location /b/`: three
#   more replicas on the same database with bearer auth): the TypeScript SDK 1.32.2 task client's
#   lifecycle (task-client.mjs, with `--token` on /b/) against task-server.mjs (stateful), direct
#   and through the balancer (harness.mjs tasks). Each session's requests spread over the
#   replicas (nginx's access log: every session with more than three requests reached more than
#   one replica). Run ROUNDS times (default 6, TIER_TS_ROUNDS) on each route.
# - Every replica must have served requests of both eras, and still be running at the end.
#
# PostgreSQL: TASKGATE_TEST_DATABASE_URL (tests/run-all.sh sources tests/pg/cluster.sh); when it
# is unset this script starts a throwaway cluster the same way and stops it on exit. A database of
# its own is created in it. nginx: Debian's (/usr/sbin/nginx). Node 22 and the venv of modern.sh
# (.venv-modern) are installed here when missing, as modern.sh does.
# Writes INTEROP_WORK/results.txt (`PASS name` / `FAIL name`, read by run.sh). Exit 0 only when all
# passed.
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
BIN=${1:-}
[[ -n "$BIN" ]] || {
    echo "usage: $0 TASKGATE_BIN" >&2
    exit 2
}
[[ "$BIN" == /* ]] || BIN="$PWD/$BIN"
[[ -x "$BIN" ]] || {
    echo "taskgate binary not found or not executable: $BIN" >&2
    exit 2
}
WORK=${INTEROP_WORK:-$(mktemp -d /tmp/taskgate-tier.XXXXXX)}
mkdir -p "$WORK"
ROUNDS=${TIER_TS_ROUNDS:-6}
NODE22="$HERE/node_modules/node/bin/node"
CONFORMANCE="$HERE/node_modules/conformance-next/dist/index.js"
VENV="$HERE/.venv-modern"
NGINX=/usr/sbin/nginx
: >"$WORK/results.txt"

OWN_PG=0
# shellcheck source=procs.sh
source "$HERE/procs.sh"
cleanup_more() { if [[ $OWN_PG == 1 ]]; then pg_stop; fi; }
free_port() { "$NODE22" "$HERE/harness.mjs" free-port; }

# ---- install ------------------------------------------------------------------------------------
[[ -x $NGINX ]] || {
    echo "nginx is required (apt-get install nginx)" >&2
    exit 1
}
if [[ ! -x "$NODE22" || ! -f "$CONFORMANCE" ]]; then
    log "npm ci in $HERE"
    (cd "$HERE" && npm ci --no-audit --no-fund) >"$WORK/npm-ci.log" 2>&1 || {
        tail -n 30 "$WORK/npm-ci.log" >&2
        exit 1
    }
fi
REQ_SUM=$(sha256sum "$HERE/requirements-modern.txt" | cut -d' ' -f1)
if [[ ! -x "$VENV/bin/python" || "$(cat "$VENV/.requirements.sha256" 2>/dev/null)" != "$REQ_SUM" ]]; then
    log "installing requirements-modern.txt into $VENV"
    { { [[ -x "$VENV/bin/python" ]] || python3 -m venv "$VENV"; } &&
        "$VENV/bin/pip" install --disable-pip-version-check -q -r "$HERE/requirements-modern.txt"; } >"$WORK/pip.log" 2>&1 || {
        tail -n 30 "$WORK/pip.log" >&2
        rm -rf "$VENV"
        exit 1
    }
    echo "$REQ_SUM" >"$VENV/.requirements.sha256"
fi
if [[ -z ${TASKGATE_TEST_DATABASE_URL:-} ]]; then
    # shellcheck source=../pg/cluster.sh
    source "$ROOT/tests/pg/cluster.sh" || exit 1
    OWN_PG=1
fi
PSQL=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)/psql
DB="taskgate_tier_$$"
"$PSQL" -q -v ON_ERROR_STOP=1 "$TASKGATE_TEST_DATABASE_URL" -c "CREATE DATABASE $DB" >"$WORK/psql.log" 2>&1 || {
    echo "creating database $DB failed:" >&2
    cat "$WORK/psql.log" >&2
    exit 1
}
DB_URL="${TASKGATE_TEST_DATABASE_URL%/*}/$DB"
log "tier work dir: $WORK; database $DB_URL; gateway $BIN"

# ---- upstreams ----------------------------------------------------------------------------------
for route in direct tier; do
    start "fixture-$route" "$VENV/bin/python" "$HERE/modern_task_server.py" --port 0
done
start ts-stateful "$NODE22" "$HERE/task-server.mjs" --mode stateful --port 0
for name in fixture-direct fixture-tier; do wait_ready "$name" 90 || exit 1; done
wait_ready ts-stateful 30 || exit 1
MODERN_DIRECT=$(field fixture-direct listening)
MODERN_TIER=$(field fixture-tier listening)
TS_URL=$(field ts-stateful listening)

# ---- three replicas on one PostgreSQL, and three with bearer auth on it too ----------------------
# Fixed gateway ports (nginx names them); the first replica creates the schema, the others find it.
TOKEN=tier-interop-token
TOKEN_SHA=$(printf '%s' "$TOKEN" | sha256sum | cut -d' ' -f1)
declare -a GW=() ADMIN=()
for n in 0 1 2 3 4 5; do
    if ((n < 3)); then
        AUTH='[auth]\nmode = "none"\n\n'
    else
        AUTH='[auth]\nmode = "bearer"\n\n[[auth.token]]\nprincipal = "tier"\nsha256 = "'"$TOKEN_SHA"'"\n\n'
    fi
    port=$(free_port)
    {
        printf '[gateway]\nlisten = "127.0.0.1:%s"\ndrain_timeout_ms = 1000\n\n' "$port"
        printf '[admin]\nlisten = "127.0.0.1:0"\n\n'
        printf '[store]\nbackend = "postgres"\nurl_env = "TASKGATE_DATABASE_URL"\npool_size = 8\n\n'
        printf "$AUTH"
        printf '[upgrade]\nenabled = false\n\n'
        printf '[[upstream]]\nname = "modern"\nurl = "%s"\n\n' "$MODERN_TIER"
        printf '[[upstream]]\nname = "ts"\nurl = "%s"\n' "$TS_URL"
    } >"$WORK/replica$n.toml"
    start "replica$n" env TASKGATE_DATABASE_URL="$DB_URL" RUST_LOG=warn "$BIN" serve --config "$WORK/replica$n.toml"
    wait_ready "replica$n" 60 || exit 1
    GW[n]=$(field "replica$n" listening.gateway)
    ADMIN[n]=$(field "replica$n" listening.admin)
done
log "replicas: ${GW[*]}"

# ---- nginx ----------------------------------------------------------------------------------------
# The config deploy/README.md documents (paths and ports aside).
LB_PORT=$(free_port)
mkdir -p "$WORK/nginx"
servers() { for g in "${GW[@]:$1:3}"; do printf '        server %s max_fails=1 fail_timeout=5s;\n' "$g"; done; }
proxy() {
    printf '            proxy_pass http://%s;\n' "$1"
    printf '            proxy_http_version 1.1;\n            proxy_set_header Connection "";\n            proxy_set_header Host $host;\n'
    printf '            proxy_buffering off;\n            proxy_read_timeout 300s;\n'
    printf '            proxy_next_upstream error timeout;\n'
}
{
    [[ $(id -u) == 0 ]] && printf 'user root root;\n'
    printf 'daemon off;\nworker_processes 1;\npid %s/nginx.pid;\nerror_log %s/error.log warn;\n' "$WORK/nginx" "$WORK/nginx"
    printf 'events { worker_connections 1024; }\nhttp {\n'
    # Which replica served each request of each session (read below).
    printf '    log_format tier "$http_mcp_session_id|$upstream_http_mcp_session_id|$upstream_addr|$request_method|$status";\n'
    printf '    access_log off;\n'
    for t in client_body proxy fastcgi uwsgi scgi; do printf '    %s_temp_path %s/%s;\n' "$t" "$WORK/nginx" "$t"; done
    printf '    upstream taskgate_rr {\n%s\n        keepalive 64;\n    }\n' "$(servers 0)"
    printf '    upstream taskgate_bearer {\n%s\n        keepalive 64;\n    }\n' "$(servers 3)"
    printf '    server {\n        listen 127.0.0.1:%s;\n' "$LB_PORT"
    printf '        location /mcp/ts {\n            access_log %s/access.log tier;\n%s        }\n' "$WORK/nginx" "$(proxy taskgate_rr)"
    printf '        location /b/ {\n            access_log %s/access.log tier;\n%s        }\n' "$WORK/nginx" "$(proxy taskgate_bearer/)"
    printf '        location / {\n%s        }\n    }\n}\n' "$(proxy taskgate_rr)"
} >"$WORK/nginx/nginx.conf"
start nginx "$NGINX" -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" -e "$WORK/nginx/error.log"
for ((i = 0; i < 100; i++)); do
    (exec 3<>"/dev/tcp/127.0.0.1/$LB_PORT") 2>/dev/null && break
    kill -0 "${PID[nginx]}" 2>/dev/null || {
        cat "$WORK/nginx.err" "$WORK/nginx/error.log" >&2
        exit 1
    }
    sleep 0.1
done
LB="http://127.0.0.1:$LB_PORT"
log "nginx: $LB (round-robin; /b/ to the bearer replicas)"

requests() { # requests N UPSTREAM: taskgate_requests_total of replica N for UPSTREAM
    curl -fsS "http://${ADMIN[$1]}/metrics" 2>/dev/null |
        awk -v up="$2" '/^taskgate_requests_total\{/ && index($0, "upstream=\"" up "\"") { s += $NF } END { print s + 0 }'
}

# ---- 2026-07-28: conformance tasks-* through the round-robin balancer = direct -----------------
"$NODE22" "$CONFORMANCE" list --server >"$WORK/conformance-scenarios.txt" 2>&1
# The expected direct failures among the tasks-* scenarios (none today).
grep '^tasks-' "$HERE/conformance-next-expected-failures.txt" >"$WORK/expected-failures-tasks.txt"
declare -A CURL=([direct]="$MODERN_DIRECT" [tier]="$LB/mcp/modern")
for route in direct tier; do
    log "conformance-next server --suite all, $route ${CURL[$route]}"
    run_fg timeout 300 "$NODE22" "$CONFORMANCE" server --url "${CURL[$route]}" --suite all -o "$WORK/conformance-$route" \
        >"$WORK/conformance-$route.log" 2>&1
    [[ $? == 124 ]] && echo "conformance run $route timed out after 300 s" >>"$WORK/conformance-$route.log"
done
"$NODE22" "$HERE/modern-compare.mjs" conformance --scenario-prefix tasks- --scenarios "$WORK/conformance-scenarios.txt" \
    --expected "$WORK/expected-failures-tasks.txt" --level strict \
    --direct-log "$WORK/conformance-direct.log" --direct-dir "$WORK/conformance-direct" \
    --via-log "$WORK/conformance-tier.log" --via-dir "$WORK/conformance-tier" --route "tier (3 replicas, PostgreSQL, nginx round-robin)" |
    tee "$WORK/conformance-report.txt"
rc=${PIPESTATUS[0]}
grep -q 'tasks-' "$WORK/conformance-scenarios.txt" || rc=1
result "tier 2026-07-28: conformance tasks-* direct = through 3 replicas on PostgreSQL behind nginx round-robin" "$rc"

# ---- 2025-11-25: the TS SDK task client through the round-robin balancer, without and with auth ----
log "ts task-client direct $TS_URL"
run_fg timeout 120 "$NODE22" "$HERE/task-client.mjs" "$TS_URL" --label "tier-ts direct" >"$WORK/ts-direct.json" 2>"$WORK/ts-direct.err"
declare -A TS_ROUTE=([none]="$LB/mcp/ts" [bearer]="$LB/b/mcp/ts")
for auth in none bearer; do
    rc=0
    extra=()
    [[ $auth == bearer ]] && extra=(--token "$TOKEN")
    for ((r = 1; r <= ROUNDS; r++)); do
        log "ts task-client through the tier ($auth), round $r/$ROUNDS"
        run_fg timeout 120 "$NODE22" "$HERE/task-client.mjs" "${TS_ROUTE[$auth]}" --label "tier-ts $auth round $r" "${extra[@]}" \
            >"$WORK/ts-tier-$auth-$r.json" 2>"$WORK/ts-tier-$auth-$r.err"
        "$NODE22" "$HERE/harness.mjs" tasks --label "tier-ts $auth round $r" --direct "$WORK/ts-direct.json" --via "$WORK/ts-tier-$auth-$r.json" \
            >"$WORK/ts-report-$auth-$r.txt" || {
            rc=1
            cat "$WORK/ts-report-$auth-$r.txt"
        }
    done
    tail -n 3 "$WORK/ts-report-$auth-$ROUNDS.txt"
    result "tier 2025-11-25: TS SDK task client lifecycle direct = through the tier (nginx round-robin, auth $auth), $ROUNDS sessions" "$rc"
done
# Spread: a session's requests went to several replicas (what stickiness used to forbid).
awk -F'|' '
    $1 != "-" { seen[$1 "|" $3] = 1; reqs[$1]++ }
    END {
        for (k in seen) { split(k, p, "|"); replicas[p[1]]++ }
        for (s in reqs) { if (reqs[s] > 3) { n++; if (replicas[s] > 1) spread++ } }
        printf "  %d sessions with more than 3 requests through nginx; %d of them served by more than one replica\n", n, spread
        exit (n > 0 && spread == n) ? 0 : 1
    }' "$WORK/nginx/access.log"
result "tier 2025-11-25: every session's requests spread over the replicas" "$?"

# ---- every replica took part, and is still running ------------------------------------------------------
rc=0
for n in 0 1 2 3 4 5; do
    m=$(requests "$n" modern)
    t=$(requests "$n" ts)
    echo "  replica$n (${GW[n]}): $m requests for modern, $t for ts"
    if ((n < 3)); then [[ $m -gt 0 && $t -gt 0 ]] || rc=1; else [[ $t -gt 0 ]] || rc=1; fi
    kill -0 "${PID[replica$n]}" 2>/dev/null || {
        echo "  replica$n exited; stderr tail:"
        tail -n 20 "$WORK/replica$n.err"
        rc=1
    }
done
result "tier: every replica served both eras (the bearer ones 2025-11-25) and is still running" "$rc"

echo
echo "== tier summary (logs: $WORK) =="
cat "$WORK/results.txt"
echo "tier: $(grep -c '^PASS' "$WORK/results.txt") passed, $(grep -c '^FAIL' "$WORK/results.txt") failed"
exit $STATUS

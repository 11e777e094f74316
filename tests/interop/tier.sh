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
# - 2025-11-25, session-sticky (`location /mcp/ts`: `hash $http_mcp_session_id consistent`): the
#   TypeScript SDK 1.32.2 task client's lifecycle (task-client.mjs) against task-server.mjs
#   (stateful), direct and through the balancer (harness.mjs tasks). The initialize carries no
#   session id, so nginx places it round-robin; every later request of the session hashes to one
#   replica, which need not be the one that saw the initialize (see deploy/README.md, "Routing").
#   Run ROUNDS times (default 6, TIER_TS_ROUNDS), so sessions land on each replica.
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

# ---- three replicas on one PostgreSQL -------------------------------------------------------------
# Fixed gateway ports (nginx names them); the first replica creates the schema, the others find it.
declare -a GW=() ADMIN=()
for n in 0 1 2; do
    port=$(free_port)
    {
        printf '[gateway]\nlisten = "127.0.0.1:%s"\ndrain_timeout_ms = 1000\n\n' "$port"
        printf '[admin]\nlisten = "127.0.0.1:0"\n\n'
        printf '[store]\nbackend = "postgres"\nurl_env = "TASKGATE_DATABASE_URL"\npool_size = 8\n\n'
        printf '[auth]\nmode = "none"\n\n[upgrade]\nenabled = false\n\n'
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
servers() { for g in "${GW[@]}"; do printf '        server %s max_fails=1 fail_timeout=5s;\n' "$g"; done; }
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
    printf '    upstream taskgate_rr {\n%s\n        keepalive 64;\n    }\n' "$(servers)"
    printf '    upstream taskgate_session {\n        hash $http_mcp_session_id consistent;\n%s\n        keepalive 64;\n    }\n' "$(servers)"
    printf '    server {\n        listen 127.0.0.1:%s;\n' "$LB_PORT"
    printf '        location /mcp/ts {\n            access_log %s/access.log tier;\n%s        }\n' "$WORK/nginx" "$(proxy taskgate_session)"
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
log "nginx: $LB (/mcp/modern round-robin, /mcp/ts hash on Mcp-Session-Id)"

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

# ---- 2025-11-25: the TS SDK task client through the session-hashing balancer -------------------------
log "ts task-client direct $TS_URL"
run_fg timeout 120 "$NODE22" "$HERE/task-client.mjs" "$TS_URL" --label "tier-ts direct" >"$WORK/ts-direct.json" 2>"$WORK/ts-direct.err"
rc=0
for ((r = 1; r <= ROUNDS; r++)); do
    log "ts task-client through the tier, round $r/$ROUNDS"
    run_fg timeout 120 "$NODE22" "$HERE/task-client.mjs" "$LB/mcp/ts" --label "tier-ts round $r" >"$WORK/ts-tier-$r.json" 2>"$WORK/ts-tier-$r.err"
    "$NODE22" "$HERE/harness.mjs" tasks --label "tier-ts round $r" --direct "$WORK/ts-direct.json" --via "$WORK/ts-tier-$r.json" \
        >"$WORK/ts-report-$r.txt" || {
        rc=1
        cat "$WORK/ts-report-$r.txt"
    }
done
tail -n 3 "$WORK/ts-report-$ROUNDS.txt"
# Sticky: every request naming a session went to one replica. Sessions whose initialize nginx
# placed on another replica than the hash picks (served there on the upstream session, which
# taskgate passes through) are counted: that is the case this routing adds.
awk -F'|' '
    $1 == "-" && $2 != "-" { init[$2] = $3 }
    $1 != "-" { if (!($1 in first)) first[$1] = $3; else if (first[$1] != $3) split_[$1] = 1 }
    END {
        for (s in first) { n++; if (s in split_) bad++; if ((s in init) && init[s] != first[s]) moved++ }
        printf "  %d sessions through nginx; %d with requests on more than one replica; %d whose initialize landed on another replica than the rest\n", n, bad, moved
        exit (n > 0 && bad == 0) ? 0 : 1
    }' "$WORK/nginx/access.log" || rc=1
result "tier 2025-11-25: TS SDK task client lifecycle direct = through the tier (nginx hash on Mcp-Session-Id), $ROUNDS sessions" "$rc"

# ---- every replica took part, and is still running ------------------------------------------------------
rc=0
for n in 0 1 2; do
    m=$(requests "$n" modern)
    t=$(requests "$n" ts)
    echo "  replica$n (${GW[n]}): $m requests for modern, $t for ts"
    [[ $m -gt 0 && $t -gt 0 ]] || rc=1
    kill -0 "${PID[replica$n]}" 2>/dev/null || {
        echo "  replica$n exited; stderr tail:"
        tail -n 20 "$WORK/replica$n.err"
        rc=1
    }
done
result "tier: every replica served both eras and is still running" "$rc"

echo
echo "== tier summary (logs: $WORK) =="
cat "$WORK/results.txt"
echo "tier: $(grep -c '^PASS' "$WORK/results.txt") passed, $(grep -c '^FAIL' "$WORK/results.txt") failed"
exit $STATUS

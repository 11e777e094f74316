#!/usr/bin/env bash
# Source this file: starts a throwaway PostgreSQL for the test suite and exports
# TASKGATE_TEST_DATABASE_URL (each Rust test then creates and drops a database of its own in it)
# and TASKGATE_REQUIRE_PG=1 (a test that finds no PostgreSQL fails instead of skipping).
#
# initdb in a temporary directory, a loopback port picked here, the socket directory inside the
# temporary directory, run as the `postgres` user when this runs as root (initdb refuses root);
# `synchronous_commit` stays on (the default). pg_stop (called from the caller's EXIT trap)
# stops it and removes the directory.

pg_bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
if [[ -z $pg_bin || ! -x $pg_bin/initdb ]]; then
    echo "no PostgreSQL server binaries in /usr/lib/postgresql/*/bin (apt-get install postgresql)" >&2
    return 1
fi
PG_DIR=$(mktemp -d /tmp/taskgate-pg.XXXXXX)
as_pg=()
if [[ $(id -u) == 0 ]]; then
    chown postgres: "$PG_DIR"
    as_pg=(runuser -u postgres --)
fi
PG_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"${as_pg[@]}" "$pg_bin/initdb" -D "$PG_DIR/data" -U taskgate -A trust -E UTF8 --no-sync \
    --no-instructions >"$PG_DIR/initdb.log" 2>&1 || { cat "$PG_DIR/initdb.log" >&2; return 1; }
"${as_pg[@]}" "$pg_bin/pg_ctl" -D "$PG_DIR/data" -l "$PG_DIR/postgres.log" -w -t 60 \
    -o "-p $PG_PORT -k $PG_DIR -c listen_addresses=127.0.0.1 -c max_connections=500" start >/dev/null ||
    { cat "$PG_DIR/postgres.log" >&2; return 1; }

pg_stop() {
    if [[ -n ${PG_DIR:-} && -d $PG_DIR ]]; then
        "${as_pg[@]}" "$pg_bin/pg_ctl" -D "$PG_DIR/data" -m immediate stop >/dev/null 2>&1 || true
        rm -rf "$PG_DIR"
    fi
}

export TASKGATE_TEST_DATABASE_URL="postgres://taskgate@127.0.0.1:$PG_PORT/postgres"
export TASKGATE_REQUIRE_PG=1
echo "== PostgreSQL $("$pg_bin/postgres" --version | awk '{print $3}') on 127.0.0.1:$PG_PORT ($PG_DIR)"

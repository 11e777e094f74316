# Processes of an interop script, sourced by run.sh, modern.sh, tier.sh and routing-orphan.sh:
# every process a script starts is in PID and is stopped when the script ends (SIGTERM, then
# SIGKILL after 5 s), whatever way it ends. Needs WORK (logs go to $WORK/NAME.{out,err}), and
# for `field` HERE and NODE22. A script with more to stop defines cleanup_more.

log() { printf '%s %s\n' "$(date +%H:%M:%S)" "$*"; }

declare -A PID=()
FG=""
cleanup() {
    local name
    [[ -n "$FG" ]] && kill -TERM "$FG" 2>/dev/null
    for name in "${!PID[@]}"; do kill -TERM "${PID[$name]}" 2>/dev/null; done
    for _ in $(seq 1 50); do
        local alive=0
        for name in "${!PID[@]}"; do kill -0 "${PID[$name]}" 2>/dev/null && alive=1; done
        [[ $alive == 0 ]] && break
        sleep 0.1
    done
    for name in "${!PID[@]}"; do
        if kill -0 "${PID[$name]}" 2>/dev/null; then
            echo "warning: $name (pid ${PID[$name]}) ignored SIGTERM, killing it" >&2
            kill -KILL "${PID[$name]}" 2>/dev/null
        fi
    done
    if declare -F cleanup_more >/dev/null; then cleanup_more; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# start NAME CMD...: runs CMD in the background, stdout/stderr in $WORK/NAME.{out,err}
start() {
    local name=$1
    shift
    "$@" >"$WORK/$name.out" 2>"$WORK/$name.err" &
    PID[$name]=$!
}

# run_fg CMD...: runs CMD as a child and waits for it; unlike a plain foreground command, a signal
# to this script is handled at once (the trap stops CMD too)
run_fg() {
    "$@" &
    FG=$!
    wait "$FG"
    local rc=$?
    FG=""
    return $rc
}

# wait_ready NAME SECONDS: waits for the first JSON line on NAME's stdout
wait_ready() {
    local name=$1 secs=$2 i
    for ((i = 0; i < secs * 10; i++)); do
        grep -q '^{' "$WORK/$name.out" 2>/dev/null && return 0
        if ! kill -0 "${PID[$name]}" 2>/dev/null; then
            echo "$name exited before it was ready; stderr:" >&2
            tail -n 20 "$WORK/$name.err" >&2
            return 1
        fi
        sleep 0.1
    done
    echo "$name not ready after ${secs}s; stderr:" >&2
    tail -n 20 "$WORK/$name.err" >&2
    return 1
}

# field NAME KEY: a field of the JSON line on NAME's stdout (the address a process listens on)
field() { "$NODE22" "$HERE/harness.mjs" json-field "$WORK/$1.out" "$2"; }

# result NAME RC: a PASS or FAIL line in $WORK/results.txt; STATUS is 1 after any FAIL
STATUS=0
result() {
    if [[ $2 == 0 ]]; then echo "PASS $1" >>"$WORK/results.txt"; else
        echo "FAIL $1" >>"$WORK/results.txt"
        STATUS=1
    fi
}

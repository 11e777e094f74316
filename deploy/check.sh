#!/usr/bin/env bash
# Runs every validator of deploy/ and exits non-zero if any fails.
#
#   bash deploy/check.sh
#
# Installs what it needs: the Python packages of deploy/requirements.txt into deploy/.venv
# (gitignored), and the Debian packages `prometheus` (promtool) and, for the image test,
# `podman` + `runc`, with apt-get when they are missing and this runs as root; not root and
# missing: promtool is an error, podman makes the image test SKIP.
#
# Environment:
#   TASKGATE_METRICS_FILE=path  also check the rules' and dashboard's metric names against this
#                               /metrics scrape of a running taskgate (besides the contract sample)
#   TASKGATE_BIN=path           the taskgate binary for check-config (default target/debug/taskgate,
#                               built with `cargo build` if missing)
#   TASKGATE_SKIP_IMAGE=1       do not run deploy/test-image.sh (it builds a release binary)
#   TASKGATE_IMAGE_REQUIRE=1    the image test must not SKIP (see deploy/test-image.sh)
# Closes with a line `check: N passed, N failed, N skipped`.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
cd "$root"
venv="$here/.venv"
passed=0 failed=0 skipped=0
failures=()

step() { # name command...
    local name="$1"; shift
    printf '\n== %s\n' "$name"
    local out rc
    out="$("$@" 2>&1)"; rc=$?
    printf '%s\n' "$out"
    if [ $rc -ne 0 ]; then
        failed=$((failed + 1)); failures+=("$name")
        printf -- '-- FAIL: %s (exit %d)\n' "$name" "$rc"
    elif printf '%s\n' "$out" | grep -q '^test-image: SKIP:'; then
        skipped=$((skipped + 1))
        printf -- '-- SKIP: %s\n' "$name"
    else
        passed=$((passed + 1))
        printf -- '-- ok: %s\n' "$name"
    fi
}

apt_updated=0
apt_install() { # package... ; returns non-zero when it cannot install
    [ "$(id -u)" = 0 ] || { echo "check: not root, cannot apt-get install $*" >&2; return 1; }
    command -v apt-get >/dev/null 2>&1 || { echo "check: no apt-get to install $*" >&2; return 1; }
    if [ $apt_updated = 0 ]; then
        apt-get update -qq >/dev/null 2>&1 || { echo "check: apt-get update failed" >&2; return 1; }
        apt_updated=1
    fi
    echo "check: apt-get install $*"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null 2>&1
}

# --- tools ---------------------------------------------------------------------------------------
command -v python3 >/dev/null 2>&1 || { echo "check: python3 is required" >&2; exit 1; }
if ! command -v promtool >/dev/null 2>&1; then
    apt_install prometheus || true
    command -v promtool >/dev/null 2>&1 || {
        echo "check: promtool is missing: install the Debian package 'prometheus' (apt-get install prometheus) or run as root" >&2
        exit 1
    }
fi
if [ "${TASKGATE_SKIP_IMAGE:-0}" != 1 ]; then
    missing=()
    command -v podman >/dev/null 2>&1 || missing+=(podman)
    command -v runc >/dev/null 2>&1 || missing+=(runc)
    if [ ${#missing[@]} -gt 0 ]; then
        apt_install "${missing[@]}" || echo "check: could not install ${missing[*]}; the image test will SKIP"
    fi
fi
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv" || { echo "check: python3 -m venv failed (Debian: apt-get install python3-venv)" >&2; exit 1; }
fi
if ! cmp -s "$here/requirements.txt" "$venv/.requirements.installed" 2>/dev/null; then
    "$venv/bin/pip" install -q --disable-pip-version-check -r "$here/requirements.txt" \
        || { echo "check: pip install -r deploy/requirements.txt failed" >&2; exit 1; }
    cp "$here/requirements.txt" "$venv/.requirements.installed"
fi
py="$venv/bin/python"
echo "check: $(promtool --version 2>&1 | head -n 1); kubernetes-validate $("$venv/bin/kubernetes-validate" --version 2>&1)"

# --- validators ----------------------------------------------------------------------------------
manifests=(deploy/kubernetes/taskgate-sidecar.yaml deploy/kubernetes/taskgate-sidecar-pvc.yaml deploy/kubernetes/taskgate-sidecar-oauth.yaml deploy/kubernetes/taskgate-tier.yaml deploy/kubernetes/servicemonitor.yaml)
for k in 1.30 1.37; do
    step "kubernetes-validate --strict -k $k (Kubernetes schemas; ServiceMonitor is a CRD: see consistency)" \
        "$venv/bin/kubernetes-validate" --strict -k "$k" "${manifests[@]}"
done
step "deploy/check_consistency.py (image, manifests, ServiceMonitor structure, runbooks, PVC variant)" \
    "$py" deploy/check_consistency.py
check_configs() { # taskgate check-config on every TOML that deploy/ ships
    local bin="${TASKGATE_BIN:-$root/target/debug/taskgate}" tmp rc=0 f
    if [ ! -x "$bin" ]; then
        echo "building $bin (cargo build --bin taskgate)"
        cargo build --quiet --bin taskgate || return 1
    fi
    tmp="$(mktemp -d)"
    "$py" - "$tmp" deploy/kubernetes/taskgate-sidecar.yaml deploy/kubernetes/taskgate-sidecar-pvc.yaml deploy/kubernetes/taskgate-sidecar-oauth.yaml deploy/kubernetes/taskgate-tier.yaml <<'PY' || { rm -rf "$tmp"; return 1; }
import sys, yaml
out = sys.argv[1]
for path in sys.argv[2:]:
    for d in yaml.safe_load_all(open(path)):
        if d and d.get("kind") == "ConfigMap":
            for key, text in d.get("data", {}).items():
                if key.endswith(".toml"):
                    name = path.rsplit("/", 1)[1].replace(".yaml", "") + "." + d["metadata"]["name"] + "." + key
                    open(f"{out}/{name}", "w").write(text)
PY
    # The tier manifest's store is PostgreSQL: check-config reaches a real one (the suite's,
    # or a throwaway cluster of this step's own, tests/pg/cluster.sh).
    local db="${TASKGATE_TEST_DATABASE_URL:-}" own_pg=0
    if [ -z "$db" ]; then
        # shellcheck source=../tests/pg/cluster.sh
        source "$root/tests/pg/cluster.sh" || { rm -rf "$tmp"; return 1; }
        db="$TASKGATE_TEST_DATABASE_URL" own_pg=1
        trap pg_stop EXIT  # step() runs this in a subshell: stopped however it ends
    fi
    for f in deploy/image/etc/taskgate/taskgate.toml "$tmp"/*.toml; do
        # The manifests name the admin token's and database URL's variables (from Secrets).
        TASKGATE_ADMIN_TOKEN=check TASKGATE_DATABASE_URL="$db" "$bin" check-config "$f" || rc=1
    done
    [ $own_pg = 0 ] || pg_stop
    rm -rf "$tmp"
    return $rc
}
step "taskgate check-config (image config, ConfigMap TOML of the four manifests; the tier one against PostgreSQL)" check_configs
step "promtool check config deploy/prometheus/prometheus.yml" \
    "$py" deploy/prometheus/check_config.py deploy/prometheus/prometheus.yml
step "promtool check rules deploy/prometheus/taskgate-rules.yml" \
    promtool check rules deploy/prometheus/taskgate-rules.yml
step "promtool test rules deploy/prometheus/taskgate-rules.test.yml" \
    promtool test rules deploy/prometheus/taskgate-rules.test.yml
step "deploy/check_dashboard.py deploy/grafana/taskgate.json" \
    "$py" deploy/check_dashboard.py deploy/grafana/taskgate.json
step "deploy/metric_names.py against the contract sample (deploy/testdata/metrics-contract-sample.txt)" \
    "$py" deploy/metric_names.py deploy/testdata/metrics-contract-sample.txt
if [ -n "${TASKGATE_METRICS_FILE:-}" ]; then
    step "deploy/metric_names.py against $TASKGATE_METRICS_FILE" \
        "$py" deploy/metric_names.py "$TASKGATE_METRICS_FILE"
fi
if [ "${TASKGATE_SKIP_IMAGE:-0}" = 1 ]; then
    printf '\n== deploy/test-image.sh\n-- SKIP: TASKGATE_SKIP_IMAGE=1\n'
    skipped=$((skipped + 1))
else
    step "deploy/test-image.sh (container image)" bash deploy/test-image.sh
fi

echo
[ $failed -eq 0 ] || printf 'check: failed: %s\n' "${failures[@]}"
echo "check: $passed passed, $failed failed, $skipped skipped"
[ $failed -eq 0 ]

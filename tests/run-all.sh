#!/usr/bin/env bash
# taskgate's whole test suite, as README.md gives it: `bash tests/run-all.sh`.
#
# 1. installs what the tests need when it is missing (Debian packages with apt-get when run as
#    root; npm packages with exact versions by `npm ci`; PyPI packages into venvs by pip);
# 2. cargo test (unit tests, integration tests against scripted upstreams, crash/restart tests);
# 3. tests/interop/run.sh: real peers (MCP conformance suite, TypeScript SDK, Python SDK) direct
#    and through taskgate;
# 4. deploy/check.sh: Kubernetes schemas, promtool rules/tests, dashboard and metric names.
# Exit 0 only when every part passed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

need_apt=()
command -v promtool >/dev/null 2>&1 || need_apt+=(prometheus)
command -v node >/dev/null 2>&1 || need_apt+=(nodejs npm)
python3 -c 'import venv' >/dev/null 2>&1 || need_apt+=(python3-venv)
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
echo "== cargo test"
cargo test --locked || status=1

echo "== interop with real MCP peers"
cargo build --locked --quiet
bash tests/interop/run.sh target/debug/taskgate || status=1

if [[ -f deploy/check.sh ]]; then
    echo "== deploy checks"
    bash deploy/check.sh || status=1
fi

if ((status == 0)); then echo "== all tests passed"; else echo "== SOME TESTS FAILED" >&2; fi
exit $status

#!/usr/bin/env python3
"""`promtool check config` for prometheus.yml, also where promtool lacks Kubernetes discovery.

    python3 deploy/prometheus/check_config.py [--promtool PATH] [CONFIG]

Debian's promtool (package `prometheus`, 2.42) is built without kubernetes_sd_configs and
rejects the field. When that happens this checks the kubernetes_sd_configs blocks here (role and
keys), replaces each with an equivalent static_configs target, and runs promtool on that copy
(next to a copy of the rule files), so the rest - relabel_configs (actions, regexes, target
labels), the scrape options and the rule files - is still checked by promtool itself.
Needs PyYAML (deploy/.venv).
"""
import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROLES = {"node", "service", "pod", "endpoints", "endpointslice", "ingress"}
SD_KEYS = {"role", "api_server", "kubeconfig_file", "namespaces", "selectors", "attach_metadata",
           "basic_auth", "authorization", "oauth2", "tls_config", "proxy_url", "follow_redirects",
           "enable_http2", "no_proxy", "proxy_from_environment", "proxy_connect_header", "http_headers"}


def promtool(tool, config):
    r = subprocess.run([tool, "check", "config", str(config)], capture_output=True, text=True)
    return r.returncode, (r.stdout + r.stderr).strip()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config", type=Path, nargs="?", default=HERE / "prometheus.yml")
    ap.add_argument("--promtool", default="promtool")
    a = ap.parse_args()
    rc, out = promtool(a.promtool, a.config)
    if rc == 0 or "kubernetes_sd_configs not found" not in out:
        print(out)
        return rc
    print("check_config: this promtool has no Kubernetes discovery; checking kubernetes_sd_configs here "
          "and the rest with promtool on a copy that uses static_configs")
    doc = yaml.safe_load(a.config.read_text())
    errors = []
    for sc in doc.get("scrape_configs", []):
        for sd in sc.pop("kubernetes_sd_configs", None) or []:
            if sd.get("role") not in ROLES:
                errors.append(f"job {sc.get('job_name')}: kubernetes_sd_configs role {sd.get('role')!r} not one of {sorted(ROLES)}")
            unknown = set(sd) - SD_KEYS
            if unknown:
                errors.append(f"job {sc.get('job_name')}: unknown kubernetes_sd_configs keys {sorted(unknown)}")
            sc.setdefault("static_configs", []).append({"targets": ["127.0.0.1:9090"]})
    with tempfile.TemporaryDirectory() as tmp:
        for rf in doc.get("rule_files", []):
            for src in a.config.parent.glob(rf):
                shutil.copy(src, Path(tmp) / src.relative_to(a.config.parent))
        copy = Path(tmp) / a.config.name
        copy.write_text(yaml.safe_dump(doc, sort_keys=False))
        rc, out = promtool(a.promtool, copy)
    print(out.replace(str(copy), f"{a.config} (static_configs copy)"))
    for e in errors:
        print(f"check_config: FAIL: {e}", file=sys.stderr)
    return 1 if errors or rc != 0 else 0


if __name__ == "__main__":
    sys.exit(main())

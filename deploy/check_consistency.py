#!/usr/bin/env python3
"""Cross-checks of the deployment files that no schema can make.

kubernetes-validate checks each Kubernetes object against its schema; this checks that the
objects agree with each other, with the TOML they carry and with the image:

* deploy/Dockerfile and deploy/image/etc/taskgate/taskgate.toml: EXPOSE, VOLUME and CMD match
  the baked-in config's ports, store path and location.
* deploy/kubernetes/taskgate-sidecar.yaml: the ConfigMap's TOML parses and its listen ports,
  store path and upstream match the containers' ports, mounts and probes; probes are on the
  admin port; the grace period covers preStop + drain_timeout_ms; every container is non-root,
  read-only, without capabilities, with resources; the Service exposes only taskgate's MCP port
  and selects the pods; the scrape annotations name the admin port.
* deploy/kubernetes/servicemonitor.yaml: the ServiceMonitor (a CRD, so no schema ships with
  kubernetes-validate) has the structure of monitoring.coreos.com/v1 as far as used here, selects
  its metrics Service by labels, and names a port that Service has, which targets the admin port.
* every alert in deploy/prometheus/taskgate-rules.yml has a runbook that is a heading of
  deploy/README.md.
* deploy/kubernetes/taskgate-sidecar-pvc.yaml is what `--write-pvc-variant` renders from the main
  manifest (compared as parsed YAML), and deploy/kubernetes/taskgate-sidecar-oauth.yaml what
  `--write-oauth-variant` renders (the ConfigMap's `[auth]` turned into `mode = "oauth"`).

Needs PyYAML (installed in deploy/.venv by deploy/check.sh). Exit 0 when all hold, 1 otherwise.
"""
import argparse
import copy
import re
import sys
import tomllib
from pathlib import Path

import yaml

DEPLOY = Path(__file__).resolve().parent
K8S = DEPLOY / "kubernetes"
MAIN = K8S / "taskgate-sidecar.yaml"
PVC_VARIANT = K8S / "taskgate-sidecar-pvc.yaml"
OAUTH_VARIANT = K8S / "taskgate-sidecar-oauth.yaml"
SERVICEMONITOR = K8S / "servicemonitor.yaml"
DOCKERFILE = DEPLOY / "Dockerfile"
IMAGE_TOML = DEPLOY / "image/etc/taskgate/taskgate.toml"

errors = []


def check(cond, msg):
    if not cond:
        errors.append(msg)
    return cond


def load(path):
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def one(docs, kind, path, name=None):
    found = [d for d in docs if d.get("kind") == kind and (name is None or d["metadata"]["name"] == name)]
    if not check(len(found) == 1, f"{path.name}: want exactly one {kind}{' ' + name if name else ''}, found {len(found)}"):
        raise SystemExit(report())
    return found[0]


def port_of(listen):
    return int(listen.rsplit(":", 1)[1])


def labels_match(selector, labels):
    return all(labels.get(k) == v for k, v in (selector or {}).items())


def duration_s(text):
    m = re.fullmatch(r"((\d+)h)?((\d+)m(?!s))?((\d+)s)?((\d+)ms)?", text or "")
    if not m or not text:
        return None
    h, mi, s, ms = (int(m.group(i) or 0) for i in (2, 4, 6, 8))
    return h * 3600 + mi * 60 + s + ms / 1000


# --- image ----------------------------------------------------------------------------------------
def check_image():
    df = DOCKERFILE.read_text()
    runtime = df[df.index("FROM scratch AS runtime"):] if "FROM scratch AS runtime" in df else ""
    check(runtime, "Dockerfile: no `FROM scratch AS runtime` stage")
    cfg = tomllib.loads(IMAGE_TOML.read_text())
    exposed = sorted(int(p) for line in re.findall(r"^EXPOSE (.+)$", runtime, re.M) for p in line.split())
    want = sorted([port_of(cfg["gateway"]["listen"]), port_of(cfg["admin"]["listen"])])
    check(exposed == want, f"Dockerfile EXPOSE {exposed} != ports of the image's config {want}")
    check(f'VOLUME ["{cfg["store"]["path"]}"]' in runtime,
          f"Dockerfile VOLUME is not the image config's store path {cfg['store']['path']}")
    check('CMD ["serve", "--config", "/etc/taskgate/taskgate.toml"]' in runtime,
          "Dockerfile CMD does not serve /etc/taskgate/taskgate.toml")
    check(re.search(r"^USER 65532:65532$", runtime, re.M), "Dockerfile runtime USER is not 65532:65532")
    check(not re.search(r"^\s*HEALTHCHECK", df, re.M), "Dockerfile has a HEALTHCHECK (Kubernetes probes the admin listener)")
    for listen in (cfg["gateway"]["listen"], cfg["admin"]["listen"]):
        check(listen.startswith("0.0.0.0:"), f"image config listens on {listen}: unreachable from outside the container")


# --- main manifest --------------------------------------------------------------------------------
def containers_by_name(deploy):
    return {c["name"]: c for c in deploy["spec"]["template"]["spec"]["containers"]}


def named_port(container, name):
    for p in container.get("ports", []):
        if p.get("name") == name:
            return p["containerPort"]
    return None


def check_main(docs, path):
    cm = one(docs, "ConfigMap", path)
    dep = one(docs, "Deployment", path)
    svc = one(docs, "Service", path)
    pod = dep["spec"]["template"]
    spec = pod["spec"]
    cs = containers_by_name(dep)
    if not check("taskgate" in cs, f"{path.name}: no container named taskgate"):
        return
    tg = cs["taskgate"]

    if not check("taskgate.toml" in cm.get("data", {}), f"{path.name}: ConfigMap has no taskgate.toml"):
        raise SystemExit(report())
    cfg = tomllib.loads(cm["data"]["taskgate.toml"])
    gw_port, admin_port = port_of(cfg["gateway"]["listen"]), port_of(cfg["admin"]["listen"])
    check(named_port(tg, "mcp") == gw_port, f"taskgate containerPort mcp != [gateway] listen port {gw_port}")
    check(named_port(tg, "admin") == admin_port, f"taskgate containerPort admin != [admin] listen port {admin_port}")

    # config file and store mounts
    mounts = {m["name"]: m for m in tg.get("volumeMounts", [])}
    vols = {v["name"]: v for v in spec.get("volumes", [])}
    args = tg.get("args", [])
    check("--config" in args, "taskgate args have no --config")
    cfg_path = args[args.index("--config") + 1] if "--config" in args else ""
    cfg_vol = [n for n, m in mounts.items() if cfg_path.startswith(m["mountPath"].rstrip("/") + "/")]
    check(cfg_vol and vols.get(cfg_vol[0], {}).get("configMap", {}).get("name") == cm["metadata"]["name"]
          and cfg_path.rsplit("/", 1)[1] in cm["data"],
          f"--config {cfg_path} is not the ConfigMap's file mounted read-only")
    check(cfg_vol and mounts[cfg_vol[0]].get("readOnly") is True, "the config mount is not readOnly")
    store_mounts = [n for n, m in mounts.items() if m["mountPath"].rstrip("/") == cfg["store"]["path"].rstrip("/")]
    check(store_mounts, f"[store] path {cfg['store']['path']} is not a volume mount (read-only root filesystem)")

    # upstream: the server next door, on loopback, on a port a container declares
    ups = cfg.get("upstream", [])
    check(ups, "the ConfigMap's TOML has no [[upstream]]")
    other_ports = {p["containerPort"] for n, c in cs.items() if n != "taskgate" for p in c.get("ports", [])}
    for u in ups:
        m = re.match(r"http://127\.0\.0\.1:(\d+)/", u["url"])
        check(m and int(m.group(1)) in other_ports, f"upstream {u['name']} url {u['url']} is not a loopback port of another container")

    # probes on the admin port
    for probe, want in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        get = tg.get(probe, {}).get("httpGet", {})
        check(get.get("path") == want and get.get("port") in ("admin", admin_port),
              f"taskgate {probe} is not GET {want} on the admin port")

    # shutdown timing
    drain_s = cfg["gateway"].get("drain_timeout_ms", 10000) / 1000
    tg_pre = tg.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
    grace = spec.get("terminationGracePeriodSeconds", 30)
    check(grace > tg_pre + drain_s, f"terminationGracePeriodSeconds {grace} <= taskgate preStop {tg_pre} + drain {drain_s}")
    for n, c in cs.items():
        if n == "taskgate":
            continue
        pre = c.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
        check(pre >= tg_pre + drain_s, f"container {n} stops ({pre} s) before taskgate has drained ({tg_pre + drain_s} s)")
        check(grace > pre, f"terminationGracePeriodSeconds {grace} <= container {n} preStop {pre}")

    # security and resources
    psc = spec.get("securityContext", {})
    check(psc.get("runAsNonRoot") is True, "pod securityContext.runAsNonRoot is not true")
    check(psc.get("runAsUser") == 65532 and psc.get("runAsGroup") == 65532, "pod does not run as 65532:65532 (the image's user)")
    check(psc.get("fsGroup") == 65532, "pod fsGroup is not 65532: the store volume may not be writable")
    for n, c in cs.items():
        sc = c.get("securityContext", {})
        check(sc.get("readOnlyRootFilesystem") is True, f"container {n}: readOnlyRootFilesystem is not true")
        check(sc.get("allowPrivilegeEscalation") is False, f"container {n}: allowPrivilegeEscalation is not false")
        check(sc.get("capabilities", {}).get("drop") == ["ALL"], f"container {n}: capabilities are not drop [ALL]")
        check(sc.get("runAsUser", psc.get("runAsUser", 0)) != 0, f"container {n} runs as root")
        r = c.get("resources", {})
        check(r.get("requests", {}).get("memory") and r.get("limits", {}).get("memory") and r.get("requests", {}).get("cpu"),
              f"container {n}: resources need cpu/memory requests and a memory limit")

    # Service: selects the pods, exposes only taskgate's MCP port
    labels = pod["metadata"].get("labels", {})
    check(labels_match(dep["spec"]["selector"]["matchLabels"], labels), "Deployment selector does not match its pod labels")
    check(labels_match(svc["spec"]["selector"], labels), "Service selector does not match the pod labels")
    sports = svc["spec"]["ports"]
    check(len(sports) == 1 and sports[0]["targetPort"] in ("mcp", gw_port),
          f"Service must expose only taskgate's MCP port, has {[p.get('targetPort') for p in sports]}")

    # scrape annotations
    ann = pod["metadata"].get("annotations", {})
    check(ann.get("prometheus.io/scrape") == "true", "pod has no prometheus.io/scrape: \"true\" annotation")
    check(ann.get("prometheus.io/port") == str(admin_port), f"prometheus.io/port is not the admin port {admin_port}")
    check(ann.get("prometheus.io/path") == "/metrics", "prometheus.io/path is not /metrics")

    # allowed_hosts: the Service's name, so clients in the cluster pass the Host check
    hosts = cfg["gateway"].get("allowed_hosts", [])
    check(svc["metadata"]["name"] in hosts, f"[gateway] allowed_hosts lacks the Service name {svc['metadata']['name']}")
    return dep, svc


# --- ServiceMonitor -------------------------------------------------------------------------------
ENDPOINT_FIELDS = {"port", "targetPort", "path", "scheme", "interval", "scrapeTimeout", "params", "honorLabels",
                   "honorTimestamps", "relabelings", "metricRelabelings", "bearerTokenSecret", "authorization",
                   "basicAuth", "oauth2", "tlsConfig", "followRedirects", "enableHttp2", "filterRunning",
                   "proxyUrl", "trackTimestampsStaleness"}
SPEC_FIELDS = {"selector", "endpoints", "namespaceSelector", "jobLabel", "targetLabels", "podTargetLabels",
               "sampleLimit", "targetLimit", "labelLimit", "labelNameLengthLimit", "labelValueLengthLimit",
               "attachMetadata", "keepDroppedTargets", "scrapeProtocols", "selectorMechanism", "scrapeClass",
               "bodySizeLimit", "fallbackScrapeProtocol", "scrapeClassicHistograms", "convertClassicHistogramsToNHCB",
               "nativeHistogramBucketLimit", "nativeHistogramMinBucketFactor", "serviceDiscoveryRole"}


def check_servicemonitor(dep):
    docs = load(SERVICEMONITOR)
    sm = one(docs, "ServiceMonitor", SERVICEMONITOR)
    svc = one(docs, "Service", SERVICEMONITOR)
    p = SERVICEMONITOR.name
    check(sm.get("apiVersion") == "monitoring.coreos.com/v1", f"{p}: ServiceMonitor apiVersion is not monitoring.coreos.com/v1")
    check(set(sm) <= {"apiVersion", "kind", "metadata", "spec"}, f"{p}: unknown top-level keys {set(sm) - {'apiVersion', 'kind', 'metadata', 'spec'}}")
    check(re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", sm["metadata"].get("name", "")), f"{p}: bad metadata.name")
    spec = sm.get("spec", {})
    check(set(spec) <= SPEC_FIELDS, f"{p}: unknown spec keys {set(spec) - SPEC_FIELDS}")
    sel = spec.get("selector", {}).get("matchLabels")
    check(isinstance(sel, dict) and sel, f"{p}: spec.selector.matchLabels missing")
    check(labels_match(sel, svc["metadata"].get("labels", {})), f"{p}: the ServiceMonitor does not select Service {svc['metadata']['name']}")
    eps = spec.get("endpoints")
    check(isinstance(eps, list) and eps, f"{p}: spec.endpoints missing")
    svc_ports = {sp["name"]: sp for sp in svc["spec"]["ports"]}
    tg = containers_by_name(dep)["taskgate"]
    for ep in eps or []:
        check(set(ep) <= ENDPOINT_FIELDS, f"{p}: unknown endpoint keys {set(ep) - ENDPOINT_FIELDS}")
        check(ep.get("port") in svc_ports, f"{p}: endpoint port {ep.get('port')!r} is not a port name of Service {svc['metadata']['name']}")
        if ep.get("port") in svc_ports:
            check(svc_ports[ep["port"]]["targetPort"] in ("admin", named_port(tg, "admin")),
                  f"{p}: the scraped Service port does not target taskgate's admin port")
        check(ep.get("path", "/metrics") == "/metrics", f"{p}: endpoint path is not /metrics")
        relabel_fields = {"sourceLabels", "separator", "targetLabel", "regex", "modulus", "replacement", "action"}
        for r in ep.get("relabelings", []) + ep.get("metricRelabelings", []):
            check(set(r) <= relabel_fields, f"{p}: unknown relabeling keys {set(r) - relabel_fields}")
            check(r.get("action", "replace").lower() in {"replace", "keep", "drop", "hashmod", "labelmap", "labeldrop",
                                                          "labelkeep", "lowercase", "uppercase", "keepequal", "dropequal"},
                  f"{p}: unknown relabeling action {r.get('action')}")
        job = [r.get("replacement") for r in ep.get("relabelings", []) if r.get("targetLabel") == "job"]
        check(job == ["taskgate"], f"{p}: endpoint does not set job=\"taskgate\" (the alert rules and dashboard select it)")
        check(ep.get("scheme", "http") in ("http", "https"), f"{p}: endpoint scheme {ep.get('scheme')}")
        iv, to = duration_s(ep.get("interval", "30s")), duration_s(ep.get("scrapeTimeout", "10s"))
        check(iv is not None and to is not None, f"{p}: interval/scrapeTimeout are not Prometheus durations")
        check(iv is None or to is None or to <= iv, f"{p}: scrapeTimeout longer than interval")
    check(labels_match(svc["spec"]["selector"], dep["spec"]["template"]["metadata"]["labels"]),
          f"{p}: metrics Service does not select the taskgate pods")
    check(svc["spec"].get("clusterIP") == "None", f"{p}: the metrics Service should be headless (clusterIP: None)")


# --- alert runbooks -------------------------------------------------------------------------------
def check_runbooks():
    rules = yaml.safe_load((DEPLOY / "prometheus/taskgate-rules.yml").read_text())
    readme = (DEPLOY / "README.md").read_text()
    slugs = {re.sub(r"[^a-z0-9 _-]", "", h.strip().lower()).replace(" ", "-")
             for h in re.findall(r"^#+\s+(.*)$", readme, re.M)}
    for g in rules["groups"]:
        for r in g["rules"]:
            if "alert" not in r:
                continue
            rb = r.get("annotations", {}).get("runbook", "")
            check(rb.startswith("deploy/README.md#") and rb.split("#", 1)[1] in slugs,
                  f"alert {r['alert']}: runbook {rb!r} is not a heading of deploy/README.md")


# --- PVC variant ----------------------------------------------------------------------------------
PVC_HEADER = """\
# GENERATED by `deploy/.venv/bin/python deploy/check_consistency.py --write-pvc-variant` from
# taskgate-sidecar.yaml: edit that file, then regenerate (deploy/check.sh fails when they differ).
#
# taskgate-sidecar.yaml with the task store on a PersistentVolumeClaim instead of an emptyDir:
# the records outlive the pod (use it when the upstream's tasks do too). ReadWriteOnce and
# `strategy: Recreate`: the old pod must have released the store (sled's file lock) before the
# new one opens it, so a rollout has a short gap instead of two pods at once.
"""


def render_pvc_variant(docs):
    out = copy.deepcopy(docs)
    dep = one(out, "Deployment", MAIN)
    name = dep["metadata"]["name"] + "-taskgate-store"
    for v in dep["spec"]["template"]["spec"]["volumes"]:
        if v["name"] == "taskgate-store":
            v.clear()
            v.update({"name": "taskgate-store", "persistentVolumeClaim": {"claimName": name}})
    dep["spec"]["strategy"] = {"type": "Recreate"}
    pvc = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "labels": dict(dep["metadata"]["labels"])},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "2Gi"}}},
    }
    idx = out.index(dep)
    out.insert(idx, pvc)
    return out


# --- OAuth variant --------------------------------------------------------------------------------
OAUTH_HEADER = """\
# GENERATED by `deploy/.venv/bin/python deploy/check_consistency.py --write-oauth-variant` from
# taskgate-sidecar.yaml: edit that file, then regenerate (deploy/check.sh fails when they differ).
#
# taskgate-sidecar.yaml with taskgate as an OAuth 2.1 resource server (config/REFERENCE.md,
# [auth.oauth]): clients bring JWT access tokens from the authorization server for the resource
# `audience`; taskgate checks them against the issuer's JWKS (fetched over HTTPS with built-in
# Mozilla roots: the image needs no CA bundle), serves its RFC 9728 metadata, binds tasks to
# issuer + subject and limits each principal ([limits]). Edit issuer and audience for your set-up.
"""

OAUTH_AUTH = """[auth]
mode = "oauth"

[auth.oauth]
issuer = "https://idp.example.com"
audience = "https://mcp.example.com/mcp"
required_scopes = ["mcp"]

[limits]
requests_per_second = 20
burst = 40
max_in_flight = 64
"""


def render_oauth_variant(docs):
    out = copy.deepcopy(docs)
    cm = one(out, "ConfigMap", MAIN)
    key = next(iter(cm["data"]))
    text = cm["data"][key]
    old = '[auth]\nmode = "none"\n'
    if not check(old in text, f"{MAIN.name}: the ConfigMap has no `{old.strip()}` to turn into oauth"):
        return out
    cm["data"][key] = text.replace(old, OAUTH_AUTH)
    return out


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper, text):
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_Dumper.add_representer(str, _str)


def dump(docs, header=PVC_HEADER):
    body = "".join("---\n" + yaml.dump(d, Dumper=_Dumper, sort_keys=False, width=120) for d in docs)
    return header + body


def report():
    for e in errors:
        print(f"check_consistency: FAIL: {e}", file=sys.stderr)
    if not errors:
        print("check_consistency: ok (image config, sidecar manifest, ServiceMonitor, alert runbooks, PVC and OAuth variants)")
    return 1 if errors else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write-pvc-variant", action="store_true", help=f"regenerate {PVC_VARIANT.name}")
    ap.add_argument("--write-oauth-variant", action="store_true", help=f"regenerate {OAUTH_VARIANT.name}")
    a = ap.parse_args()
    docs = load(MAIN)
    if a.write_pvc_variant:
        PVC_VARIANT.write_text(dump(render_pvc_variant(docs)))
        print(f"wrote {PVC_VARIANT}")
        return 0
    if a.write_oauth_variant:
        OAUTH_VARIANT.write_text(dump(render_oauth_variant(docs), OAUTH_HEADER))
        print(f"wrote {OAUTH_VARIANT}")
        return 0
    check_image()
    dep, _ = check_main(docs, MAIN)
    check_servicemonitor(dep)
    check_runbooks()
    if check(PVC_VARIANT.exists(), f"{PVC_VARIANT.name} is missing (run with --write-pvc-variant)"):
        pvc_docs = load(PVC_VARIANT)
        check(pvc_docs == render_pvc_variant(docs),
              f"{PVC_VARIANT.name} is out of date with {MAIN.name} (run with --write-pvc-variant)")
        check_main(pvc_docs, PVC_VARIANT)
    if check(OAUTH_VARIANT.exists(), f"{OAUTH_VARIANT.name} is missing (run with --write-oauth-variant)"):
        oauth_docs = load(OAUTH_VARIANT)
        check(oauth_docs == render_oauth_variant(docs),
              f"{OAUTH_VARIANT.name} is out of date with {MAIN.name} (run with --write-oauth-variant)")
        check_main(oauth_docs, OAUTH_VARIANT)
    return report()


if __name__ == "__main__":
    sys.exit(main())

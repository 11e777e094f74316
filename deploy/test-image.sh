#!/usr/bin/env bash
# Builds and runs the taskgate container image without an image registry.
#
# The builder stage of deploy/Dockerfile starts FROM rust:1-bookworm, which needs a registry; the
# runtime stage is FROM scratch, which does not. So this script
#   1. builds the binary on the host, as the builder stage would with PGO=0 (release code,
#      --locked, glibc; thin LTO unless TASKGATE_IMAGE_PROFILE=release) and stages it with the
#      glibc files it needs (deploy/image/rootfs.sh, as the builder stage does),
#   2. builds the Dockerfile's own `runtime` stage (cut out of deploy/Dockerfile, with
#      `--from=builder /out/` pointed at the staged folder) with podman,
#   3. checks the image's configuration (user, ports, volume, entrypoint, no HEALTHCHECK) and
#      its files (owners, modes, the loader and libraries, their package records),
#   4. runs it with podman, as uid 65532 on a read-only root filesystem with the store on a
#      volume: check-config on the baked-in config, then serve (loopback only, --network host),
#      probes /healthz, /readyz, /metrics, SIGTERM must end it with exit 0, and a second start on
#      the same volume must reopen the store.
# Whatever this machine cannot do is reported as "SKIP: <reason>" and the script exits 0; a real
# failure exits 1. Set TASKGATE_IMAGE_REQUIRE=1 to turn every SKIP into a failure.
#
# TASKGATE_IMAGE_FULL=1 replaces steps 1-2 by a build of the whole deploy/Dockerfile, builder
# stage included: its FROM image is replaced (--build-arg RUST_IMAGE) by a local stand-in for
# rust:1-bookworm made here without a registry: a Debian bookworm root filesystem from
# debootstrap (Debian's mirror) plus this machine's own Rust toolchain and CA bundle. The build
# reaches crates.io from inside the container (--network host). Slow (minutes, 1.4 GB image,
# kept for the next run; the Dockerfile's default PGO=1 build trains and builds twice, about
# 10 minutes more on 2 cores); not part of deploy/check.sh.
#
# Environment:
#   TASKGATE_IMAGE_BINARY=path   use this glibc binary instead of building one (step 1 skipped)
#   TASKGATE_IMAGE_FULL=1        build the whole Dockerfile (see above)
#   TASKGATE_IMAGE_PGO=0|1       the Dockerfile's PGO build argument for TASKGATE_IMAGE_FULL
#                                (default: the Dockerfile's own default, 1)
#   TASKGATE_IMAGE_PROFILE=name  the cargo profile of step 1 (default image-check: thin LTO;
#                                release: the Dockerfile's own build)
#   TASKGATE_RUST_IMAGE=name     the builder image for TASKGATE_IMAGE_FULL
#                                (default localhost/taskgate-rust-builder:bookworm, made if missing)
#   TASKGATE_IMAGE_TAG=name      image tag (default localhost/taskgate:test); the image is kept
#   TASKGATE_IMAGE_REQUIRE=1     SKIP is a failure
#   PODMAN=cmd                   podman command (default podman)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
tag="${TASKGATE_IMAGE_TAG:-localhost/taskgate:test}"
podman="${PODMAN:-podman}"
name="taskgate-image-test-$$"
volume="taskgate-image-test-$$"
work="$(mktemp -d)"

say() { printf 'test-image: %s\n' "$*"; }
fail() { printf 'test-image: FAIL: %s\n' "$*" >&2; exit 1; }
skip() {
    if [ "${TASKGATE_IMAGE_REQUIRE:-0}" = 1 ]; then fail "(TASKGATE_IMAGE_REQUIRE=1) $*"; fi
    printf 'test-image: SKIP: %s\n' "$*"
    exit 0
}

upstream_pid=""
old_image=""
cleanup() {
    [ -n "$upstream_pid" ] && kill "$upstream_pid" 2>/dev/null
    "$podman" rm -f -v -t 0 "$name" >/dev/null 2>&1 || true
    "$podman" rm -f -v -t 0 "$name-2" >/dev/null 2>&1 || true
    # the image this run's tag replaced, if nothing else uses it
    if [ -n "$old_image" ] && [ "$("$podman" image inspect -f '{{.Id}}' "$tag" 2>/dev/null)" != "$old_image" ]; then
        "$podman" rmi "$old_image" >/dev/null 2>&1 || true
    fi
    "$podman" volume rm -f "$volume" >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT

# --- 0. container engine -------------------------------------------------------------------------
command -v "$podman" >/dev/null 2>&1 || skip "podman is not installed (Debian: apt-get install podman runc)"
if ! "$podman" info >"$work/podman-info" 2>&1; then
    skip "podman cannot start here: $(tail -n 3 "$work/podman-info" | tr '\n' ' ')"
fi
old_image="$("$podman" image inspect -f '{{.Id}}' "$tag" 2>/dev/null || true)"

# podman's default rlimits (nofile 1048576, nproc) fail with EPERM where the sandbox lacks
# CAP_SYS_RESOURCE, and crun refuses a hybrid cgroup v1/v2 host: try the runtimes with modest
# limits and keep the first that can start a container. Sets run_opts and runtime_ok.
find_runtime() { # image entrypoint args...
    local image="$1" entry="$2" rt; shift 2
    run_opts=(--ulimit nofile=4096:4096 --ulimit nproc=4096:4096)
    runtime_ok=""
    : > "$work/runtime-errors"
    for rt in "" runc crun; do
        if [ -n "$rt" ]; then
            command -v "$rt" >/dev/null 2>&1 || { echo "$rt: not installed" >> "$work/runtime-errors"; continue; }
        fi
        if "$podman" run --rm ${rt:+--runtime "$rt"} "${run_opts[@]}" --network none \
                --entrypoint "$entry" "$image" "$@" >"$work/probe.log" 2>&1; then
            runtime_ok="${rt:-default}"
            if [ -n "$rt" ]; then run_opts+=(--runtime "$rt"); fi
            return 0
        fi
        echo "${rt:-default runtime}: $(tail -n 1 "$work/probe.log")" >> "$work/runtime-errors"
    done
    return 1
}

# The stand-in for rust:1-bookworm of TASKGATE_IMAGE_FULL (see the header).
make_builder_image() { # image
    local image="$1" rootfs="$work/rust-bookworm" sysroot toolchain
    command -v debootstrap >/dev/null 2>&1 || skip "TASKGATE_IMAGE_FULL: debootstrap is not installed (apt-get install debootstrap)"
    command -v rustc >/dev/null 2>&1 || skip "TASKGATE_IMAGE_FULL: no Rust toolchain on this machine to put in the builder image"
    say "making $image: debootstrap bookworm + this machine's Rust toolchain (a few minutes)"
    debootstrap --variant=minbase --include=gcc,libc6-dev,binutils,ca-certificates \
        bookworm "$rootfs" http://deb.debian.org/debian >"$work/debootstrap.log" 2>&1 \
        || { tail -n 5 "$work/debootstrap.log" >&2; skip "TASKGATE_IMAGE_FULL: debootstrap failed (no Debian mirror?)"; }
    sysroot="$(rustc --print sysroot)"
    toolchain="$(basename "$(readlink -f "$sysroot")")"
    mkdir -p "$rootfs/usr/local/rustup/toolchains/$toolchain" "$rootfs/usr/local/cargo/bin"
    (cd "$sysroot" && tar --exclude=./share/doc -cf - .) | tar -C "$rootfs/usr/local/rustup/toolchains/$toolchain" -xf -
    printf 'version = "12"\ndefault_toolchain = "%s"\nprofile = "minimal"\n' "$toolchain" > "$rootfs/usr/local/rustup/settings.toml"
    cp "$(readlink -f "$(command -v rustup)")" "$rootfs/usr/local/cargo/bin/rustup"
    for p in cargo rustc rustdoc; do ln -sf rustup "$rootfs/usr/local/cargo/bin/$p"; done
    # Trust what this machine trusts (a TLS-inspecting proxy in front of crates.io, say).
    cp /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/ca-certificates.crt"
    tar -C "$rootfs" -cf - . | "$podman" import \
        --change 'ENV RUSTUP_HOME=/usr/local/rustup' --change 'ENV CARGO_HOME=/usr/local/cargo' \
        --change 'ENV PATH=/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        - "$image" >"$work/import.log" 2>&1 || { cat "$work/import.log" >&2; fail "podman import of $image failed"; }
    rm -rf "$rootfs"
}

if [ "${TASKGATE_IMAGE_FULL:-0}" = 1 ]; then
# --- 1+2 (TASKGATE_IMAGE_FULL): the whole Dockerfile -----------------------------------------------
    builder="${TASKGATE_RUST_IMAGE:-localhost/taskgate-rust-builder:bookworm}"
    "$podman" image exists "$builder" || make_builder_image "$builder"
    find_runtime "$builder" /bin/true \
        || skip "podman cannot run the builder stage here: $(tr '\n' ';' < "$work/runtime-errors")"
    say "podman build -f deploy/Dockerfile --build-arg RUST_IMAGE=$builder ${TASKGATE_IMAGE_PGO:+--build-arg PGO=$TASKGATE_IMAGE_PGO }(runtime: $runtime_ok) -> $tag"
    (cd "$root" && "$podman" build --pull=never --format docker --network host "${run_opts[@]}" \
        --build-arg RUST_IMAGE="$builder" ${TASKGATE_IMAGE_PGO:+--build-arg PGO="$TASKGATE_IMAGE_PGO"} \
        -f deploy/Dockerfile -t "$tag" .) >"$work/build.log" 2>&1 \
        || { tail -n 40 "$work/build.log" >&2; fail "podman build of deploy/Dockerfile failed"; }
    grep -E '^\s+Finished |^== ' "$work/build.log" | sed 's/^ */test-image: builder: /' || true
else
# --- 1. the binary -------------------------------------------------------------------------------
if [ -n "${TASKGATE_IMAGE_BINARY:-}" ]; then
    bin="$TASKGATE_IMAGE_BINARY"
    [ -x "$bin" ] || fail "TASKGATE_IMAGE_BINARY=$bin is not an executable file"
    say "using prebuilt binary $bin"
else
    command -v cargo >/dev/null 2>&1 || skip "cargo is not installed"
    # The release profile's code with thin LTO (Cargo.toml [profile.image-check]) unless
    # TASKGATE_IMAGE_PROFILE=release asks for the Dockerfile's PGO=0 build. Built for the host
    # (glibc), as the builder stage builds for its own platform.
    profile="${TASKGATE_IMAGE_PROFILE:-image-check}"
    say "cargo build --profile $profile --locked --bin taskgate"
    (cd "$root" && cargo build --profile "$profile" --locked --bin taskgate) || fail "cargo build failed"
    bin="${CARGO_TARGET_DIR:-$root/target}/$profile/taskgate"
fi
readelf -l "$bin" | grep -q 'Requesting program interpreter' \
    || fail "$bin is statically linked: the image carries glibc for a dynamically linked glibc binary"

# --- 2. build the runtime stage ------------------------------------------------------------------
ctx="$work/context"
mkdir -p "$ctx/deploy" "$ctx/out/empty"
cp -a "$here/image" "$ctx/deploy/image"
sh "$here/image/rootfs.sh" "$bin" "$ctx/out/rootfs" || fail "deploy/image/rootfs.sh failed"
# The runtime stage is everything from `FROM scratch AS runtime` to the end of the Dockerfile.
sed -n '/^FROM scratch AS runtime$/,$p' "$here/Dockerfile" > "$work/runtime.Containerfile"
grep -q '^FROM scratch AS runtime$' "$work/runtime.Containerfile" \
    || fail "deploy/Dockerfile has no 'FROM scratch AS runtime' stage"
# `COPY --from=builder [--chown=..] /out/X Y`  ->  `COPY [--chown=..] out/X Y`
sed -i -E 's#--from=builder((\s+--[a-z]+=\S+)*)\s+/out/#\1 out/#' "$work/runtime.Containerfile"
if grep -n -- '--from=' "$work/runtime.Containerfile"; then
    fail "the runtime stage copies from the builder outside /out/ (see the Dockerfile's header)"
fi
say "podman build (runtime stage of deploy/Dockerfile, FROM scratch) -> $tag"
# --format docker: the OCI format has no HEALTHCHECK field (podman would drop one silently),
# and docker build produces this format too.
"$podman" build --pull=never --layers=false --format docker -f "$work/runtime.Containerfile" -t "$tag" "$ctx" \
    >"$work/build.log" 2>&1 || { cat "$work/build.log" >&2; fail "podman build failed"; }

fi

# --- 3. image configuration and files ------------------------------------------------------------
"$podman" image inspect "$tag" > "$work/inspect.json"
python3 - "$work/inspect.json" <<'EOF' || fail "image configuration"
import json, sys
img = json.load(open(sys.argv[1]))[0]
cfg = img["Config"]
want = {
    "User": "65532:65532",
    "Entrypoint": ["/usr/local/bin/taskgate"],
    "Cmd": ["serve", "--config", "/etc/taskgate/taskgate.toml"],
    "WorkingDir": "/var/lib/taskgate",
    "StopSignal": "SIGTERM",
}
bad = [f"{k}: want {v!r}, got {cfg.get(k)!r}" for k, v in want.items() if cfg.get(k) != v]
if sorted(cfg.get("ExposedPorts") or {}) != ["8080/tcp", "9090/tcp"]:
    bad.append(f"ExposedPorts: {sorted(cfg.get('ExposedPorts') or {})}")
if list(cfg.get("Volumes") or {}) != ["/var/lib/taskgate"]:
    bad.append(f"Volumes: {list(cfg.get('Volumes') or {})}")
hc = img.get("Healthcheck") or cfg.get("Healthcheck")  # podman reports it at the top level
if hc:
    bad.append(f"HEALTHCHECK present: {hc}")
for b in bad:
    print("  image config:", b, file=sys.stderr)
size = img.get("Size", 0)
print(f"test-image: image config ok (user 65532:65532, ports 8080 9090, volume /var/lib/taskgate, no healthcheck), size {size/1e6:.1f} MB")
sys.exit(1 if bad else 0)
EOF
"$podman" create --name "$name" "$tag" >/dev/null
"$podman" export "$name" | tar -tvf - --numeric-owner > "$work/files.txt"
"$podman" rm -v "$name" >/dev/null
debian_builder=1
if [ "${TASKGATE_IMAGE_FULL:-0}" != 1 ] && ! { command -v dpkg-query >/dev/null 2>&1 && [ -r /etc/debian_version ]; }; then
    debian_builder=0 # as deploy/image/rootfs.sh decides
fi
DEBIAN_BUILDER=$debian_builder python3 - "$work/files.txt" <<'EOF' || fail "image files"
import os, sys
rows = {}
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) >= 6:
        rows[f[-1].rstrip("/").lstrip("./").lstrip("/")] = (f[0], f[1])
want = {
    "usr/local/bin/taskgate": ("-rwxr-xr-x", "0/0"),
    "etc/taskgate/taskgate.toml": ("-rw-r--r--", "0/0"),
    "etc/passwd": ("-rw-r--r--", "0/0"),
    "etc/group": ("-rw-r--r--", "0/0"),
    "var": ("drwxr-xr-x", "0/0"),
    "var/lib": ("drwxr-xr-x", "0/0"),
    "var/lib/taskgate": ("drwxr-xr-x", "65532/65532"),
    "etc/nsswitch.conf": ("-rw-r--r--", "0/0"),
}
# The package records (deploy/image/rootfs.sh) come from a Debian builder only: the
# Dockerfile's always is; a host-built image has them when the host is Debian.
if os.environ.get("DEBIAN_BUILDER") == "1":
    want.update({
        "etc/os-release": ("-rw-r--r--", "0/0"),
        "etc/debian_version": ("-rw-r--r--", "0/0"),
        "var/lib/dpkg/status.d/libc6": ("-rw-r--r--", "0/0"),
        "var/lib/dpkg/status.d/libgcc-s1": ("-rw-r--r--", "0/0"),
    })
else:
    want.update({p: rows[p] for p in ("etc/os-release", "etc/debian_version") if p in rows})
bad = []
for path, (mode, owner) in want.items():
    got = rows.get(path)
    if got != (mode, owner):
        bad.append(f"{path}: want {mode} {owner}, got {got}")
# glibc (deploy/image/rootfs.sh): the loader and the libraries, root-owned, writable by root only.
libs = [p for p in rows if p.startswith(("lib/", "lib64/", "usr/lib/")) and rows[p][0][0] == "-"]
for stem in ("ld-linux", "libc.so.", "libgcc_s.so."):
    if not any(p.rsplit("/", 1)[-1].startswith(stem) for p in libs):
        bad.append(f"no {stem}* in the image (glibc libraries: {libs})")
for p in libs:
    if rows[p][1] != "0/0" or rows[p][0][5] == "w" or rows[p][0][8] == "w":
        bad.append(f"{p}: {rows[p]}, want root-owned and writable by root only")
lib_dirs = {"lib", "lib64", "usr/lib", "var/lib/dpkg", "var/lib/dpkg/status.d"}
extra = [p for p in rows if p and p not in want and p not in libs and p not in lib_dirs
         and not p.startswith("var/lib/dpkg/status.d/")
         and not any(w.startswith(p + "/") for w in want)
         and not any(l.startswith(p + "/") for l in libs)]
# podman export adds the runtime's mount points and files (dev, proc, sys, run, etc/hosts...)
extra = [p for p in extra if p.split("/")[0] not in {"dev", "proc", "sys", "run", "tmp"}
         and p not in {"etc/hosts", "etc/resolv.conf", "etc/hostname", ".containerenv", "run/.containerenv"}]
if extra:
    bad.append(f"unexpected files: {extra}")
for b in bad:
    print("  image files:", b, file=sys.stderr)
if not bad:
    print(f"test-image: image files ok (binary, config and {len(libs)} glibc files root-owned, /var/lib/taskgate owned by 65532)")
sys.exit(1 if bad else 0)
EOF

# --- 4. run it -----------------------------------------------------------------------------------
find_runtime "$tag" /usr/local/bin/taskgate --help \
    || skip "image built and checked, but podman cannot run a container here: $(tr '\n' ';' < "$work/runtime-errors")"
say "podman runs containers with the ${runtime_ok} OCI runtime"
run_opts+=(--network host --read-only --read-only-tmpfs=false)

# check-config on the config baked into the image, then on a broken one.
"$podman" run --rm "${run_opts[@]}" "$tag" check-config /etc/taskgate/taskgate.toml >"$work/cc.log" 2>&1 \
    || { cat "$work/cc.log" >&2; fail "check-config /etc/taskgate/taskgate.toml (baked-in config) failed"; }
printf '[gateway]\nlisten = "127.0.0.1:0"\nno_such_key = 1\n' > "$work/broken.toml"
if "$podman" run --rm "${run_opts[@]}" -v "$work/broken.toml:/etc/taskgate/broken.toml:ro" \
        "$tag" check-config /etc/taskgate/broken.toml >"$work/cc-broken.log" 2>&1; then
    fail "check-config accepted a config with an unknown key"
fi
say "check-config: baked-in config valid; unknown key rejected ($(head -n 1 "$work/cc-broken.log"))"

# A stand-in upstream: /readyz is ready when every upstream accepts TCP connections. The config
# names it `localhost`: glibc's resolver in the image must read the container's /etc/hosts
# (/etc/nsswitch.conf), as it would a Kubernetes service name through DNS.
python3 -c '
import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(16)
print(s.getsockname()[1], flush=True)
s.settimeout(0.5)
end = time.time() + 600
while time.time() < end:
    try: s.accept()[0].close()
    except OSError: pass
' > "$work/upstream.port" &
upstream_pid=$!
for _ in $(seq 1 50); do [ -s "$work/upstream.port" ] && break; sleep 0.1; done
upstream_port="$(cat "$work/upstream.port")"
[ -n "$upstream_port" ] || fail "the stand-in upstream did not start"

# serve on loopback ports chosen by the kernel, store on a named volume (initialised from the
# image's /var/lib/taskgate, so owned by 65532).
cat > "$work/test.toml" <<EOF
[gateway]
listen = "127.0.0.1:0"
drain_timeout_ms = 2000
[admin]
listen = "127.0.0.1:0"
[store]
path = "/var/lib/taskgate"
[auth]
mode = "none"
[upgrade]
enabled = false
[[upstream]]
name = "default"
url = "http://localhost:$upstream_port/mcp"
EOF
chmod 0644 "$work/test.toml"
"$podman" volume create "$volume" >/dev/null

wait_listening() { # container -> prints the admin address
    local c="$1" i line
    for i in $(seq 1 100); do
        line="$("$podman" logs "$c" 2>/dev/null | grep -m1 '^{"listening"' || true)"
        if [ -n "$line" ]; then
            printf '%s' "$line" | python3 -c 'import json,sys; print(json.load(sys.stdin)["listening"]["admin"])'
            return 0
        fi
        if [ "$("$podman" inspect -f '{{.State.Running}}' "$c" 2>/dev/null)" != true ]; then
            "$podman" logs "$c" >&2 || true
            fail "container $c exited before printing its listening line"
        fi
        sleep 0.2
    done
    "$podman" logs "$c" >&2 || true
    fail "container $c printed no listening line within 20 s"
}
stop_and_check() { # container
    local c="$1" code
    "$podman" stop -t 30 "$c" >/dev/null
    code="$("$podman" inspect -f '{{.State.ExitCode}}' "$c")"
    [ "$code" = 0 ] || { "$podman" logs "$c" >&2; fail "$c exited $code after SIGTERM, want 0"; }
}

"$podman" run -d --name "$name" "${run_opts[@]}" \
    -v "$work/test.toml:/etc/taskgate/taskgate.toml:ro" -v "$volume:/var/lib/taskgate" "$tag" >/dev/null
admin="$(wait_listening "$name")"
say "serving; admin listener $admin"
for path in /healthz /metrics; do
    code="$(curl -s -o "$work/body" -w '%{http_code}' "http://$admin$path" || true)"
    [ "$code" = 200 ] || fail "GET $path: HTTP $code, want 200"
done
grep -q '^taskgate_' "$work/body" || fail "/metrics has no taskgate_ metric"
samples="$(grep -c '^taskgate_' "$work/body")"
code="$(curl -s -o /dev/null -w '%{http_code}' "http://$admin/readyz" || true)"
[ "$code" = 200 ] || fail "GET /readyz with the upstream listening: HTTP $code, want 200"
kill "$upstream_pid" 2>/dev/null; wait "$upstream_pid" 2>/dev/null || true; upstream_pid=""
code="$(curl -s -o /dev/null -w '%{http_code}' "http://$admin/readyz" || true)"
[ "$code" = 503 ] || fail "GET /readyz with the upstream gone: HTTP $code, want 503"
say "GET /healthz 200, /metrics 200 ($samples taskgate_ samples), /readyz 200 with the upstream up, 503 with it gone"
stop_and_check "$name"
say "SIGTERM: exit code 0"

mount="$("$podman" volume inspect -f '{{.Mountpoint}}' "$volume")"
owners="$(find "$mount" -mindepth 1 -printf '%u:%g\n' | sort -u | tr '\n' ' ')"
[ -n "$(ls -A "$mount")" ] || fail "the store volume is empty after a run"
[ "$owners" = "65532:65532 " ] || fail "store files are owned by $owners, want 65532:65532 only"
say "store volume written by uid 65532: $(ls "$mount" | tr '\n' ' ')"

"$podman" run -d --name "$name-2" "${run_opts[@]}" \
    -v "$work/test.toml:/etc/taskgate/taskgate.toml:ro" -v "$volume:/var/lib/taskgate" "$tag" >/dev/null
admin="$(wait_listening "$name-2")"
stop_and_check "$name-2"
say "restart on the same volume: store reopened, SIGTERM exit 0"
if [ "${TASKGATE_IMAGE_FULL:-0}" = 1 ]; then
    say "ok: image $tag built from the whole deploy/Dockerfile, checked and run"
else
    say "ok: image $tag built from the Dockerfile's runtime stage and a host-built binary, checked and run"
fi

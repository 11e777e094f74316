#!/bin/sh
# Stages the files the container image takes from its builder (deploy/Dockerfile, and
# deploy/test-image.sh for a host-built binary): the taskgate binary and what a glibc binary
# needs to run on `scratch`, at the paths the builder has them.
#
#   sh deploy/image/rootfs.sh BINARY OUT
#
# OUT/usr/local/bin/taskgate   BINARY without debug info, mode 0755
# OUT/<path>                   the dynamic loader and each shared library `ldd BINARY` names
#                              (libc, libm, libgcc_s), copied from the builder (symlinks followed)
# OUT/var/lib/dpkg/status.d/   the dpkg records of the Debian packages those files come from, and
# OUT/etc/os-release,          the builder's OS release, so that image scanners see which glibc
# OUT/etc/debian_version       the image carries (the layout of distroless images: Trivy detects
#                              Debian from debian_version, Grype from os-release); only on a
#                              Debian builder (dpkg-query and /etc/debian_version present)
#
# Why glibc and not a static musl binary: musl's allocator takes one lock for every thread; the
# same code built for musl cost 1.82x nginx's CPU per small tools/call at c=16 against 1.45x for
# glibc (benches/RESULTS.md, R45), and every figure there is a glibc build. The binary's glibc
# tuning (src/main.rs: two malloc arenas, a fixed mmap threshold) applies in the image too.
set -eu
bin="$1"
out="$2"

mkdir -p "$out/usr/local/bin"
objcopy --strip-debug "$bin" "$out/usr/local/bin/taskgate"
chmod 0755 "$out/usr/local/bin/taskgate"

# `ldd` lines: "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" and, for the loader,
# "/lib64/ld-linux-x86-64.so.2 (0x...)"; linux-vdso has no file.
libs="$(ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }')"
[ -n "$libs" ] || { echo "rootfs.sh: $bin names no shared library: not a glibc binary?" >&2; exit 1; }
for lib in $libs; do
    case "$(basename "$lib")" in
        ld-linux*|libc.so.*|libm.so.*|libgcc_s.so.*|libpthread.so.*|libdl.so.*|librt.so.*) ;;
        *) echo "rootfs.sh: $bin needs $lib, which the image does not carry" >&2; exit 1 ;;
    esac
    mkdir -p "$out$(dirname "$lib")"
    cp -L "$lib" "$out$lib"
    chmod 0755 "$out$lib"
done

if command -v dpkg-query >/dev/null 2>&1 && [ -r /etc/debian_version ]; then
    mkdir -p "$out/var/lib/dpkg/status.d" "$out/etc"
    # dpkg knows a library by the path its package installs: /lib/... on bookworm, /usr/lib/...
    # since the /usr merge (trixie); ldd prints the /lib one.
    pkgs=""
    for lib in $libs; do
        owner="$( { dpkg-query -S "$lib" || dpkg-query -S "/usr$lib" || dpkg-query -S "$(readlink -f "$lib")"; } 2>/dev/null | head -n 1 | sed 's/:.*//')"
        [ -n "$owner" ] || { echo "rootfs.sh: no Debian package owns $lib" >&2; exit 1; }
        pkgs="$pkgs $owner"
    done
    for pkg in $(printf '%s\n' $pkgs | sort -u); do
        dpkg-query -s "$pkg" > "$out/var/lib/dpkg/status.d/$pkg"
    done
    cp -L /etc/os-release "$out/etc/os-release"
    cp -L /etc/debian_version "$out/etc/debian_version"
fi

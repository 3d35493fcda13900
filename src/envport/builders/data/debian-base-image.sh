#!/usr/bin/env bash
# Build the tests' Debian bookworm base image without a registry (none is
# reachable here): debootstrap a minbase rootfs, then `docker import` it.
# Skipped when the tag exists. The rootfs tarball is cached, so re-importing
# after the image was deleted takes seconds instead of a debootstrap.
#   usage: base-image.sh [TAG]      (default envport/debian-bookworm:base)
set -euo pipefail

tag=${1:-envport/debian-bookworm:base}
suite=bookworm
variant=minbase
include=python3,python3-venv,python3-pip,ca-certificates
mirror=${ENVPORT_DEBIAN_MIRROR:-http://deb.debian.org/debian}
cache_dir=${ENVPORT_CACHE_DIR:-/var/cache/envport}
lock_wait_s=${ENVPORT_BASE_IMAGE_LOCK_WAIT:-900}
debootstrap_limit_s=${ENVPORT_DEBOOTSTRAP_LIMIT:-900}

if ! command -v docker >/dev/null 2>&1; then
    echo "base-image: no docker client (apt-get install docker.io)" >&2
    exit 1
fi
if docker image inspect "$tag" >/dev/null 2>&1; then
    echo "base-image: $tag present"
    exit 0
fi

mkdir -p "$cache_dir"
# One builder at a time (CI and a test fixture may race); the loser waits,
# then finds the tag or the tarball.
exec 9>"$cache_dir/base-image.lock"
if ! flock -w "$lock_wait_s" 9; then
    echo "base-image: another build holds $cache_dir/base-image.lock for over ${lock_wait_s}s" >&2
    exit 1
fi
if docker image inspect "$tag" >/dev/null 2>&1; then
    echo "base-image: $tag present (built by another run)"
    exit 0
fi

# The cached tarball is named by what went into it: other debootstrap
# arguments never reuse a stale rootfs.
key=$(printf '%s\n' "$suite" "$variant" "$include" "$mirror" | sha256sum | cut -c1-12)
tarball="$cache_dir/debian-$suite-$variant-$key.tar"

if [[ ! -s "$tarball" ]]; then
    if ! command -v debootstrap >/dev/null 2>&1; then
        echo "base-image: debootstrap not installed (apt-get install debootstrap)" >&2
        exit 1
    fi
    rootfs=$(mktemp -d "$cache_dir/rootfs.XXXXXX")
    trap 'rm -rf "$rootfs" "$tarball.partial"' EXIT
    echo "base-image: debootstrap $suite ($variant, +$include) from $mirror"
    if ! timeout "$debootstrap_limit_s" debootstrap --variant="$variant" --include="$include" \
        "$suite" "$rootfs" "$mirror" >"$cache_dir/debootstrap.log" 2>&1; then
        echo "base-image: debootstrap failed or ran past ${debootstrap_limit_s}s; last lines of $cache_dir/debootstrap.log:" >&2
        tail -n 20 "$cache_dir/debootstrap.log" >&2
        [[ -f "$rootfs/debootstrap/debootstrap.log" ]] && tail -n 20 "$rootfs/debootstrap/debootstrap.log" >&2
        exit 1
    fi
    # Downloaded .debs would only bloat the image.
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" --numeric-owner -cf "$tarball.partial" .
    mv "$tarball.partial" "$tarball"
    rm -rf "$rootfs"
    trap - EXIT
    echo "base-image: cached rootfs $tarball ($(du -h "$tarball" | cut -f1))"
fi

docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change "LABEL org.envport.base.rootfs=debian-$suite-$variant-$key" \
    --change 'CMD ["/bin/bash"]' \
    - "$tag" <"$tarball" >/dev/null
echo "base-image: imported $tag from $tarball"

#!/usr/bin/env bash
# Start every real service the integration tests use, in dependency order
# (the base image needs the docker engine). One line per service on success;
# on failure the service's own output and a non-zero exit.
#   usage: all.sh [BASE_IMAGE_TAG]
set -euo pipefail
export LC_ALL=C   # EPOCHREALTIME must use "." for the arithmetic below

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
base_tag=${1:-envport/debian-bookworm:base}
log_dir=$(mktemp -d)
trap 'rm -rf "$log_dir"' EXIT

start() {
    local name=$1 script=$2 t0 secs
    shift 2
    t0=$EPOCHREALTIME
    if bash "$here/$script" "$@" >"$log_dir/$name.log" 2>&1; then
        secs=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.1f", b - a}')
        echo "service $name: up (${secs}s)"
    else
        secs=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.1f", b - a}')
        echo "service $name: FAILED after ${secs}s ($script); its output:" >&2
        sed 's/^/    /' "$log_dir/$name.log" >&2
        exit 1
    fi
}

start dockerd dockerd.sh
start slurm slurm.sh
start sshd sshd.sh
start base-image base-image.sh "$base_tag"

#!/usr/bin/env bash
# Start every real service the integration tests use, in dependency order
# (the base image needs the docker engine). One line per service on success;
# on failure the service's own output and a non-zero exit.
# ENVPORT_CI_WITHOUT=sshd,slurm,slurm-multi,dockerd,podman (any of them) leaves those
# unstarted (dockerd also takes the base image and podman along, slurm the multi-node cluster,
# which shares its munged): .ci/run uses it to prove that CI
# fails when a service is missing.
#   usage: all.sh [BASE_IMAGE_TAG]
set -euo pipefail
export LC_ALL=C   # EPOCHREALTIME must use "." for the arithmetic below

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
base_tag=${1:-envport/debian-bookworm:base}
log_dir=$(mktemp -d)
trap 'rm -rf "$log_dir"' EXIT

without=",${ENVPORT_CI_WITHOUT:-},"

start() {
    local name=$1 script=$2 t0 secs
    shift 2
    if [[ "$without" == *",$name,"* ]] || { [[ $name == base-image ]] && [[ "$without" == *,dockerd,* ]]; } \
        || { [[ $name == slurm-multi ]] && [[ "$without" == *,slurm,* ]]; } \
        || { [[ $name == podman ]] && [[ "$without" == *,dockerd,* ]]; }; then
        echo "service $name: NOT started (ENVPORT_CI_WITHOUT=${ENVPORT_CI_WITHOUT})"
        return 0
    fi
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
start slurm-multi slurm-multi.sh
start sshd sshd.sh
start registry registry.sh
start base-image base-image.sh "$base_tag"
start podman podman.sh "$base_tag"

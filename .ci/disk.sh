#!/usr/bin/env bash
# The disk a CI run needs, said before the tests and after them: free space where the tests write (the
# temp dirs, docker's and podman's stores, the registry's storage, the env caches), and what each of
# envport's caches holds. A run on a full disk fails late and far from the cause (`disk_low` in the
# last tests), so the run says up front how much room it has, and reclaims what no later run reads:
# docker's dangling images and its build cache beyond ENVPORT_CI_BUILD_CACHE_KEEP (default 8GB).
# Host change, said here: those two docker prunes. Nothing of envport's own caches is removed.
#   usage: disk.sh before|after
set -uo pipefail
when=${1:-before}
need_gb=${ENVPORT_CI_DISK_NEED_GB:-25}

free_gb() { df -Pk "$1" 2>/dev/null | awk 'NR == 2 {printf "%d", $4 / 1048576}'; }

show() {
    df -Ph / /tmp /var/tmp /var/lib 2>/dev/null | awk 'NR == 1 || !seen[$1]++'
    for d in /var/lib/docker /var/lib/containers /var/lib/envport-registry/storage /var/tmp/envport-test-envs \
        "${TMPDIR:-/tmp}/pytest-of-$(id -un)"; do
        [[ -e $d ]] && du -sh "$d" 2>/dev/null
    done
}

if [[ $when == before ]] && docker info >/dev/null 2>&1; then
    docker image prune -f >/dev/null 2>&1 || true
    docker builder prune -f --keep-storage "${ENVPORT_CI_BUILD_CACHE_KEEP:-8GB}" >/dev/null 2>&1 || true
fi
show
free=$(free_gb "${TMPDIR:-/tmp}")
if [[ -n $free && $free -lt $need_gb ]]; then
    # Said, not fatal: the tests' own preflight names the step that runs out (`disk_low`).
    echo "disk: WARNING only ${free} GB free under ${TMPDIR:-/tmp}; a full run needs about ${need_gb} GB" \
        "(free space, or point TMPDIR at a larger disk)" >&2
fi
exit 0

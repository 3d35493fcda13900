#!/usr/bin/env bash
# The one definition of "Slurm is up", used by .ci/services/slurm.sh (to decide
# it is done) and by tests/services.py (to decide the tests can run): slurm.conf
# exists, sinfo answers, and a node is in state idle, mix, alloc or comp, i.e. it
# takes jobs now or as soon as the running ones end. drain/down/fail, or any
# state with a suffix (* not responding, ~ powered off, # being configured, ...)
# is not up. Two definitions drifted once: the start script counted alloc as up,
# the tests did not, so services came up green while every Slurm test skipped.
#   usage: slurm-up.sh [NODE]
#   exit 0: prints "NAME STATE CPUS" of the first node that is up
#   exit 1: prints why not on stderr (the states sinfo reported)
set -uo pipefail

UP_STATES="idle mix alloc comp"
conf=${SLURM_CONF:-/etc/slurm/slurm.conf}
node=${1:-}

if [[ ! -f "$conf" ]]; then
    # sinfo would retry reading it for 60 s before failing.
    echo "$conf does not exist" >&2
    exit 1
fi
if ! command -v sinfo >/dev/null 2>&1; then
    echo "sinfo not found (apt-get install slurm-wlm)" >&2
    exit 1
fi
# With no controller, sinfo retries ~10 s before it gives up.
if ! out=$(timeout 30 sinfo -h -N -o '%N %t %c' ${node:+-n "$node"} 2>&1); then
    echo "sinfo failed: ${out:-no answer in 30s}" >&2
    exit 1
fi
seen=()
while read -r name state cpus; do
    [[ -n "$name" ]] || continue
    if [[ " $UP_STATES " == *" $state "* ]]; then
        echo "$name $state $cpus"
        exit 0
    fi
    seen+=("$name=$state")
done <<<"$out"
echo "no node is up (up: $UP_STATES; sinfo: ${seen[*]:-no nodes})" >&2
exit 1

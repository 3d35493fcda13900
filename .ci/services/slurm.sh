#!/usr/bin/env bash
# A one-node Slurm on localhost (munged + slurmctld + slurmd), started by hand
# because PID 1 is not systemd. State, spool, logs and pid files live under a
# private dir; slurm.conf goes where the Slurm tools read it by default, so
# sinfo/srun/sbatch need no SLURM_CONF.
set -euo pipefail

wait_s=${ENVPORT_SLURM_WAIT:-60}
state_dir=${ENVPORT_SLURM_DIR:-/var/lib/envport-slurm}
conf=${SLURM_CONF:-/etc/slurm/slurm.conf}   # Debian's compiled-in default (libslurmfull)
marker="# envport one-node slurm (written by .ci/services/slurm.sh)"
node=$(hostname -s)

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# sinfo's short state: idle, mix, alloc, drain, down... A trailing * / ~ / #
# means not responding, powered down, or being configured.
node_state() { sinfo -h -N -n "$node" -o %t 2>/dev/null | head -n1; }
# "Up" is defined once, in slurm-up.sh, which tests/services.py runs too.
node_up() { bash "$here/slurm-up.sh" "$node" >/dev/null 2>&1; }

for bin in sinfo scontrol /usr/sbin/slurmctld /usr/sbin/slurmd /usr/sbin/munged munge unmunge; do
    if ! command -v "$bin" >/dev/null 2>&1; then
        echo "slurm: $bin not found (apt-get install slurm-wlm munge)" >&2
        exit 1
    fi
done

tag=slurm
# alive, stop, slurm_conf_common
# shellcheck source=.ci/services/slurm-lib.sh
. "$here/slurm-lib.sh"

ctld_pid="$state_dir/slurmctld.pid"
slurmd_pid="$state_dir/slurmd.pid"

# Fast path. sinfo is asked only when our slurmctld runs: with no controller
# it retries for ~10 s before giving up.
if [[ -f "$conf" ]] && grep -qxF "$marker" "$conf" \
    && alive slurmctld "$ctld_pid" && alive slurmd "$slurmd_pid" \
    && node_up; then
    echo "slurm: node $node already up ($(node_state))"
    exit 0
fi

# --- munge ---------------------------------------------------------------
mkdir -p /run/munge
chown munge:munge /run/munge
chmod 0755 /run/munge
if [[ ! -s /etc/munge/munge.key ]]; then
    mungekey --create --keyfile=/etc/munge/munge.key
fi
chown munge:munge /etc/munge/munge.key
chmod 0400 /etc/munge/munge.key
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    runuser -u munge -- /usr/sbin/munged
    deadline=$((SECONDS + wait_s))
    until munge -n 2>/dev/null | unmunge >/dev/null 2>&1; do
        if ((SECONDS >= deadline)); then
            echo "slurm: munged does not answer after ${wait_s}s; see /var/log/munge/munged.log" >&2
            tail -n 20 /var/log/munge/munged.log >&2 || true
            exit 1
        fi
        sleep 0.2
    done
    echo "slurm: munged started"
fi

# --- slurm.conf ----------------------------------------------------------
mkdir -p "$state_dir"/{state,spool,log}
cpus=$(nproc)
mem_mb=$(awk '/^MemTotal:/ {print int($2 / 1024)}' /proc/meminfo)
# slurmd drains a node whose RealMemory exceeds what it finds: stay below it.
real_mem=$((mem_mb * 9 / 10))
new_conf=$(cat <<CONF
$marker
ClusterName=envport
SlurmctldHost=$node(127.0.0.1)
$(slurm_conf_common "$state_dir")
StateSaveLocation=$state_dir/state
SlurmdSpoolDir=$state_dir/spool/slurmd
SlurmctldPidFile=$state_dir/slurmctld.pid
SlurmdPidFile=$state_dir/slurmd.pid
SlurmctldLogFile=$state_dir/log/slurmctld.log
SlurmdLogFile=$state_dir/log/slurmd.log
SlurmctldPort=6817
SlurmdPort=6818
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$real_mem State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
)

conf_changed=0
if [[ ! -f "$conf" ]] || [[ "$(<"$conf")" != "$new_conf" ]]; then
    if [[ -f "$conf" ]] && ! grep -qxF "$marker" "$conf"; then
        cp -p "$conf" "$conf.envport-backup"
        echo "slurm: kept the previous $conf as $conf.envport-backup"
    fi
    mkdir -p "$(dirname "$conf")"
    printf '%s\n' "$new_conf" >"$conf.tmp"
    mv "$conf.tmp" "$conf"
    conf_changed=1
    echo "slurm: wrote $conf (CPUs=$cpus RealMemory=$real_mem)"
fi

if ((conf_changed)); then
    # Node and port definitions are only read at start-up.
    stop slurmd "$slurmd_pid"
    stop slurmctld "$ctld_pid"
fi

if ! alive slurmctld "$ctld_pid"; then
    /usr/sbin/slurmctld
    echo "slurm: slurmctld started"
fi
if ! alive slurmd "$slurmd_pid"; then
    /usr/sbin/slurmd
    echo "slurm: slurmd started"
fi

# --- wait for the node ---------------------------------------------------
deadline=$((SECONDS + wait_s))
next_resume=0
while :; do
    if node_up; then
        break
    fi
    state=$(node_state || true)
    case "$state" in
        drain* | drng* | down* | fail*)
            # Left drained/down by an earlier run (restart, lost slurmd): resume.
            if ((SECONDS >= next_resume)); then
                if scontrol update NodeName="$node" State=RESUME 2>/dev/null; then
                    echo "slurm: node $node was $state; resumed"
                fi
                next_resume=$((SECONDS + 5))
            fi
            ;;
    esac
    if ((SECONDS >= deadline)); then
        echo "slurm: node $node is '${state:-unknown}' after ${wait_s}s, not up (see slurm-up.sh)." >&2
        scontrol show node "$node" 2>&1 | grep -E 'State=|Reason=' >&2 || true
        tail -n 10 "$state_dir/log/slurmctld.log" "$state_dir/log/slurmd.log" >&2 || true
        exit 1
    fi
    sleep 0.5
done
echo "slurm: node $node $(node_state) (CPUs=$cpus)"

#!/usr/bin/env bash
# A multi-node Slurm on this machine: one slurmctld on the host and N real
# slurmds, each in its own network namespace with its own address on a bridge.
# It is a second cluster next to the one-node cluster of slurm.sh (own
# ClusterName, conf file, ports, state dir), so the one-node cluster and the
# tests that use it are untouched; the tools reach it with
# SLURM_CONF=/etc/slurm-multi/slurm.conf (slurm/clusters/multi.yaml says so).
#
#   host netns:  bridge envport0 10.77.0.1/24   slurmctld (port 6827)
#   netns envport-node1: envport0 (veth) 10.77.0.11   slurmd -N node1 (port 6828)
#   netns envport-node2: envport0 (veth) 10.77.0.12   slurmd -N node2
#
# Inside every node the veth is called envport0 like the host's bridge, so
# GLOO_SOCKET_IFNAME=envport0 names the cluster network in a node and in the
# host's netns (where docker --network host containers run) alike.
# Munge, the filesystem, pids and the hostname are shared: only the network
# is separate. Idempotent: a no-op when the cluster is already up.
#   env: ENVPORT_SLURM_MULTI_NODES (2), ENVPORT_SLURM_MULTI_DIR, ENVPORT_SLURM_WAIT (60)
set -euo pipefail

wait_s=${ENVPORT_SLURM_WAIT:-60}
nodes=${ENVPORT_SLURM_MULTI_NODES:-2}
state_dir=${ENVPORT_SLURM_MULTI_DIR:-/var/lib/envport-slurm-multi}
conf=/etc/slurm-multi/slurm.conf
marker="# envport multi-node slurm (written by .ci/services/slurm-multi.sh)"
bridge=envport0
net=10.77.0
host_addr=$net.1
ctld_port=6827
slurmd_port=6828
ctld_host=$(hostname -s)
export SLURM_CONF=$conf

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

for bin in ip nsenter sinfo scontrol /usr/sbin/slurmctld /usr/sbin/slurmd munge unmunge; do
    if ! command -v "$bin" >/dev/null 2>&1; then
        echo "slurm-multi: $bin not found (apt-get install iproute2 util-linux slurm-wlm munge)" >&2
        exit 1
    fi
done
if ! ((nodes >= 2 && nodes <= 9)); then
    echo "slurm-multi: ENVPORT_SLURM_MULTI_NODES=$nodes; use 2..9" >&2
    exit 1
fi

node_names() { local i; for ((i = 1; i <= nodes; i++)); do echo "node$i"; done; }

tag=slurm-multi
# alive, stop, slurm_conf_common
# shellcheck source=.ci/services/slurm-lib.sh
. "$here/slurm-lib.sh"

ctld_pid="$state_dir/slurmctld.pid"
node_pid() { echo "$state_dir/$1/slurmd.pid"; }

# Up: every node in an UP state (slurm-up.sh's definition, node by node).
all_up() {
    local n
    for n in $(node_names); do
        bash "$here/slurm-up.sh" "$n" >/dev/null 2>&1 || return 1
    done
}
states() { sinfo -h -N -o '%N=%t' 2>/dev/null | sort -u | paste -sd' '; }

net_up() {
    local n
    ip -4 addr show dev "$bridge" 2>/dev/null | grep -q "inet $host_addr/" || return 1
    for n in $(node_names); do
        ip netns exec "envport-$n" ip -4 addr show dev "$bridge" 2>/dev/null | grep -q "inet " || return 1
    done
}

daemons_up() {
    local n
    alive slurmctld "$ctld_pid" || return 1
    for n in $(node_names); do alive slurmd "$(node_pid "$n")" || return 1; done
}

# Fast path: sinfo is asked only when our daemons run (with no controller it retries ~10 s).
if [[ -f "$conf" ]] && grep -qxF "$marker" "$conf" && net_up && daemons_up && all_up; then
    echo "slurm-multi: nodes already up ($(states))"
    exit 0
fi

# --- munge (shared with the one-node cluster: same key, same socket) ----------
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    echo "slurm-multi: munge does not answer; start the one-node cluster first (.ci/services/slurm.sh)" >&2
    exit 1
fi

# --- network: a bridge on the host, a netns + veth pair per node ---------------
if ! ip link show "$bridge" >/dev/null 2>&1; then
    ip link add "$bridge" type bridge
    echo "slurm-multi: bridge $bridge created"
fi
ip -4 addr show dev "$bridge" | grep -q "inet $host_addr/" || ip addr add "$host_addr/24" dev "$bridge"
ip link set "$bridge" up
i=0
for n in $(node_names); do
    i=$((i + 1))
    ns="envport-$n"
    hv="ep-$n"   # the host end of the node's veth
    [[ -e "/run/netns/$ns" ]] || ip netns add "$ns"
    if ! ip netns exec "$ns" ip link show "$bridge" >/dev/null 2>&1; then
        ip link del "$hv" 2>/dev/null || true
        ip link add "$hv" type veth peer name "$bridge" netns "$ns"
        echo "slurm-multi: netns $ns with veth $hv <-> $bridge"
    fi
    ip link set "$hv" master "$bridge"
    ip link set "$hv" up
    ip netns exec "$ns" ip link set lo up
    ip netns exec "$ns" ip -4 addr show dev "$bridge" | grep -q "inet $net.1$i/" \
        || ip netns exec "$ns" ip addr add "$net.1$i/24" dev "$bridge"
    ip netns exec "$ns" ip link set "$bridge" up
done
# dockerd sets iptables' FORWARD policy to DROP and, with br_netfilter, bridged
# frames pass that chain too: node-to-node traffic over our bridge would be
# dropped on a stock docker host. Accept it (checked first: idempotent).
if command -v iptables >/dev/null 2>&1 && iptables -S FORWARD >/dev/null 2>&1; then
    iptables -C FORWARD -i "$bridge" -o "$bridge" -j ACCEPT 2>/dev/null \
        || iptables -I FORWARD -i "$bridge" -o "$bridge" -j ACCEPT
fi

# --- slurm.conf ----------------------------------------------------------------
mkdir -p "$state_dir"/{state,log} "$(dirname "$conf")"
for n in $(node_names); do mkdir -p "$state_dir/$n/spool"; done
cpus=$(nproc)
node_lines=""
i=0
for n in $(node_names); do
    i=$((i + 1))
    node_lines+="NodeName=$n NodeHostname=$n NodeAddr=$net.1$i Port=$slurmd_port CPUs=$cpus State=UNKNOWN"$'\n'
done
new_conf=$(cat <<CONF
$marker
ClusterName=envport-multi
SlurmctldHost=$ctld_host($host_addr)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
$(slurm_conf_common "$state_dir")
# Every node has the machine's CPUs; their slurmds share them.
SlurmdParameters=config_overrides
# A node whose slurmd stops answering is DOWN after 10 s and its jobs end NODE_FAIL,
# not requeued (the node-failure test waits for that).
SlurmdTimeout=10
JobRequeue=0
StateSaveLocation=$state_dir/state
# %n: each slurmd its own spool, pid and log (they share the filesystem).
SlurmdSpoolDir=$state_dir/%n/spool
SlurmctldPidFile=$ctld_pid
SlurmdPidFile=$state_dir/%n/slurmd.pid
SlurmctldLogFile=$state_dir/log/slurmctld.log
SlurmdLogFile=$state_dir/log/slurmd-%n.log
${node_lines%$'\n'}
PartitionName=multi Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
)

if [[ ! -f "$conf" ]] || [[ "$(<"$conf")" != "$new_conf" ]]; then
    printf '%s\n' "$new_conf" >"$conf.tmp"
    mv "$conf.tmp" "$conf"
    echo "slurm-multi: wrote $conf ($nodes nodes, CPUs=$cpus each)"
    # Node and port definitions are read at start-up only.
    for n in $(node_names); do stop slurmd "$(node_pid "$n")"; done
    stop slurmctld "$ctld_pid"
fi

if ! alive slurmctld "$ctld_pid"; then
    /usr/sbin/slurmctld -f "$conf"
    echo "slurm-multi: slurmctld started"
fi
for n in $(node_names); do
    if ! alive slurmd "$(node_pid "$n")"; then
        # nsenter --net, not `ip netns exec`: the latter also unshares the mount namespace and
        # mounts a fresh /sys without /sys/fs/cgroup, and slurmd then fails ("Unable to
        # initialize cgroup plugin"). Only the network is to differ.
        nsenter --net="/run/netns/envport-$n" /usr/sbin/slurmd -N "$n" -f "$conf"
        echo "slurm-multi: slurmd $n started in netns envport-$n"
    fi
done

# --- wait for the nodes --------------------------------------------------------
deadline=$((SECONDS + wait_s))
next_resume=0
until all_up; do
    if ((SECONDS >= next_resume)); then
        for n in $(node_names); do
            case "$(sinfo -h -N -n "$n" -o %t 2>/dev/null | head -n1)" in
                drain* | drng* | down* | fail*)
                    scontrol update NodeName="$n" State=RESUME 2>/dev/null && echo "slurm-multi: resumed $n" ;;
            esac
        done
        next_resume=$((SECONDS + 5))
    fi
    if ((SECONDS >= deadline)); then
        echo "slurm-multi: nodes not up after ${wait_s}s: $(states)" >&2
        scontrol show node 2>&1 | grep -E 'NodeName=|State=|Reason=' >&2 || true
        tail -n 10 "$state_dir"/log/*.log >&2 || true
        exit 1
    fi
    sleep 0.5
done
echo "slurm-multi: $(states) (SLURM_CONF=$conf)"

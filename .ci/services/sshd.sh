#!/usr/bin/env bash
# sshd on 127.0.0.1:2222 with its own host key and a generated client key,
# for the shell target and testinfra's ssh:// backend. Everything lives under
# one private dir; the system sshd config and root's ~/.ssh are not touched
# (authorized keys come from our own file).
set -euo pipefail

dir=${ENVPORT_SSH_DIR:-/var/lib/envport-ssh}
port=${ENVPORT_SSH_PORT:-2222}
alias_name=envport-test
wait_s=${ENVPORT_SSHD_WAIT:-30}
cfg="$dir/sshd_config"
client_cfg="$dir/ssh_config"
pidfile="$dir/sshd.pid"
log="$dir/sshd.log"

works() { timeout 15 ssh -F "$client_cfg" "$alias_name" true >/dev/null 2>&1; }

for bin in /usr/sbin/sshd ssh ssh-keygen; do
    if ! command -v "$bin" >/dev/null 2>&1; then
        echo "sshd: $bin not found (apt-get install openssh-server openssh-client)" >&2
        exit 1
    fi
done

if [[ -f "$client_cfg" ]] && works; then
    echo "sshd: $alias_name already answers on 127.0.0.1:$port"
    exit 0
fi

mkdir -p "$dir" /run/sshd
chmod 0700 "$dir"
if [[ ! -f "$dir/ssh_host_ed25519_key" ]]; then
    ssh-keygen -q -t ed25519 -N '' -C envport-test-host -f "$dir/ssh_host_ed25519_key"
    rm -f "$dir/known_hosts"   # it pins the old host key
fi
[[ -f "$dir/id_ed25519" ]] || ssh-keygen -q -t ed25519 -N '' -C envport-test-client -f "$dir/id_ed25519"
cp "$dir/id_ed25519.pub" "$dir/authorized_keys"
chmod 0600 "$dir/authorized_keys"

cat >"$cfg" <<CONF
# envport test sshd (written by .ci/services/sshd.sh)
Port $port
ListenAddress 127.0.0.1
HostKey $dir/ssh_host_ed25519_key
PidFile $pidfile
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
AuthorizedKeysFile $dir/authorized_keys
AcceptEnv LANG LC_*
Subsystem sftp /usr/lib/openssh/sftp-server
CONF

cat >"$client_cfg" <<CONF
# envport test ssh client (written by .ci/services/sshd.sh): ssh -F $client_cfg $alias_name
Host $alias_name
    HostName 127.0.0.1
    Port $port
    User root
    IdentityFile $dir/id_ed25519
    IdentitiesOnly yes
    UserKnownHostsFile $dir/known_hosts
    StrictHostKeyChecking accept-new
    BatchMode yes
    ConnectTimeout 5
    LogLevel ERROR
CONF

/usr/sbin/sshd -t -f "$cfg"

# A running sshd of ours that fails the check has an old config: restart it.
# Only the pid from our own pid file is stopped, never sshd by name.
if [[ -s "$pidfile" ]]; then
    pid=$(<"$pidfile")
    if [[ -r "/proc/$pid/comm" && "$(<"/proc/$pid/comm")" == sshd ]]; then
        kill "$pid"
        deadline=$((SECONDS + 10))
        while kill -0 "$pid" 2>/dev/null; do
            if ((SECONDS >= deadline)); then
                echo "sshd: old sshd (pid $pid) did not stop in 10s" >&2
                exit 1
            fi
            sleep 0.2
        done
    fi
fi

# sshd daemonizes itself (it needs an absolute path to re-exec).
/usr/sbin/sshd -f "$cfg" -E "$log"

deadline=$((SECONDS + wait_s))
until works; do
    if ((SECONDS >= deadline)); then
        echo "sshd: 'ssh -F $client_cfg $alias_name true' fails after ${wait_s}s:" >&2
        timeout 15 ssh -F "$client_cfg" "$alias_name" true >&2 || true
        tail -n 20 "$log" >&2 || true
        exit 1
    fi
    sleep 0.3
done
echo "sshd: $alias_name answers on 127.0.0.1:$port (ssh -F $client_cfg $alias_name)"

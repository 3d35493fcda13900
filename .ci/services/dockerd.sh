#!/usr/bin/env bash
# Start the docker engine unless one already answers. PID 1 is not systemd
# here, so nobody else starts it. Both clients (/usr/local/bin/docker 28.x and
# Debian's /usr/bin/docker 20.10) use the default socket; the check below asks
# both so a DOCKER_HOST pointing elsewhere is caught here, not in a test.
set -euo pipefail

wait_s=${ENVPORT_DOCKERD_WAIT:-60}
log=/var/log/dockerd.log
pidfile=/run/docker.pid

clients=()
for c in "$(command -v docker || true)" /usr/bin/docker; do
    if [[ -n "$c" && -x "$c" ]] && [[ ! " ${clients[*]} " == *" $c "* ]]; then
        clients+=("$c")
    fi
done
if ((${#clients[@]} == 0)); then
    echo "dockerd: no docker client found (apt-get install docker.io)" >&2
    exit 1
fi

answers() {
    local c
    for c in "${clients[@]}"; do
        "$c" info >/dev/null 2>&1 || return 1
    done
}

if answers; then
    echo "dockerd: already answering"
    exit 0
fi

if ! command -v dockerd >/dev/null 2>&1; then
    echo "dockerd: dockerd not installed (apt-get install docker.io)" >&2
    exit 1
fi

# A dockerd that is still starting must not get a twin: both would fight over
# /var/lib/docker and the socket.
running_pid=""
if [[ -s "$pidfile" ]]; then
    pid=$(<"$pidfile")
    if [[ -r "/proc/$pid/comm" && "$(<"/proc/$pid/comm")" == dockerd ]]; then
        running_pid=$pid
    fi
fi

if [[ -n "$running_pid" ]]; then
    echo "dockerd: pid $running_pid is running but not answering yet; waiting"
else
    # setsid: the daemon must outlive this script and the test session that
    # may have started it (a killed process group must not take it along).
    setsid dockerd --iptables=false </dev/null >"$log" 2>&1 &
    echo "dockerd: started pid $! (log $log)"
fi

deadline=$((SECONDS + wait_s))
until answers; do
    if ((SECONDS >= deadline)); then
        echo "dockerd: no answer from ${clients[*]} after ${wait_s}s; last log lines:" >&2
        tail -n 20 "$log" >&2 || true
        exit 1
    fi
    sleep 0.5
done
echo "dockerd: answering ($(/usr/bin/docker version --format 'server {{.Server.Version}}' 2>/dev/null || echo up))"

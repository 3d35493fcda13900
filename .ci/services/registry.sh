#!/usr/bin/env bash
# Debian's docker-registry (CNCF distribution) on 127.0.0.1:5443 with TLS from a CA made here, for
# `envport push`/`pull` and the registry tests. Everything lives under one private dir (CA, server
# key and certificate, config, storage, pid, log); the package's own /etc/docker/registry config and
# its systemd unit are not used. Host change, said here: the CA is copied to
# /etc/docker/certs.d/127.0.0.1:PORT/ca.crt, where the docker engine reads a registry's CA on each
# push (no engine restart). envport trusts it through the site profile field `registry_ca`
# (tests/registry_fixture.py writes such a site). Idempotent: a registry of ours that answers over TLS
# with this CA is left running.
set -euo pipefail
tag=registry
# shellcheck source=.ci/services/slurm-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/slurm-lib.sh"   # alive/stop by our own pid file

dir=${ENVPORT_REGISTRY_DIR:-/var/lib/envport-registry}
port=${ENVPORT_REGISTRY_PORT:-5443}
addr=127.0.0.1:$port
wait_s=${ENVPORT_REGISTRY_WAIT:-30}
pidfile="$dir/registry.pid"
log="$dir/registry.log"

works() { curl -fsS --max-time 5 --cacert "$dir/ca.crt" "https://$addr/v2/" >/dev/null 2>&1; }

for bin in docker-registry openssl curl; do
    if ! command -v "$bin" >/dev/null 2>&1; then
        echo "registry: $bin not found (apt-get install docker-registry openssl curl)" >&2
        exit 1
    fi
done

# Traversable, not listable: other users (a pull as another user) read the CA certificate, never the keys.
share_ca() { chmod 0711 "$dir"; chmod 0644 "$dir/ca.crt"; chmod 0600 "$dir"/*.key; }

trust_engine() {
    mkdir -p "/etc/docker/certs.d/$addr"
    cmp -s "$dir/ca.crt" "/etc/docker/certs.d/$addr/ca.crt" || cp "$dir/ca.crt" "/etc/docker/certs.d/$addr/ca.crt"
}

if [[ -f "$dir/ca.crt" ]] && works; then
    share_ca
    trust_engine
    echo "registry: already answers on https://$addr (CA $dir/ca.crt)"
    exit 0
fi

# The storage holds only what tests pushed (unique names, never read by a later run): a fresh start empties
# it, or a test host's disk fills run after run (18 GB of old pushes once made a CI run fail `disk_low`).
rm -rf "$dir/storage"
mkdir -p "$dir/storage"
if [[ ! -f "$dir/ca.crt" || ! -f "$dir/ca.key" ]]; then
    openssl req -x509 -newkey rsa:3072 -nodes -days 3650 -subj "/CN=envport test registry CA" \
        -keyout "$dir/ca.key" -out "$dir/ca.crt" -addext "basicConstraints=critical,CA:TRUE" \
        -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
    rm -f "$dir/server.crt"   # signed by the old CA
fi
if [[ ! -f "$dir/server.crt" ]]; then
    openssl req -newkey rsa:3072 -nodes -subj "/CN=127.0.0.1" -keyout "$dir/server.key" -out "$dir/server.csr" 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' >"$dir/server.ext"
    openssl x509 -req -in "$dir/server.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -CAcreateserial \
        -days 3650 -extfile "$dir/server.ext" -out "$dir/server.crt" 2>/dev/null
    rm -f "$dir/server.csr"
fi

share_ca

cat >"$dir/config.yml" <<CONF
# envport test registry (written by .ci/services/registry.sh)
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $dir/storage
  delete:
    enabled: true
http:
  addr: $addr
  tls:
    certificate: $dir/server.crt
    key: $dir/server.key
CONF

# A running registry of ours that fails the check has an old config: restart it (slurm-lib.sh's `stop`:
# only the pid from our own pid file, never docker-registry by name).
stop docker-registry "$pidfile"

# docker-registry stays in the foreground: detach it from this script's session.
setsid docker-registry serve "$dir/config.yml" >>"$log" 2>&1 </dev/null &
echo $! >"$pidfile"
trust_engine

deadline=$((SECONDS + wait_s))
until works; do
    if ((SECONDS >= deadline)) || ! kill -0 "$(<"$pidfile")" 2>/dev/null; then
        echo "registry: https://$addr/v2/ does not answer after ${wait_s}s (or docker-registry exited):" >&2
        tail -n 20 "$log" >&2 || true
        exit 1
    fi
    sleep 0.2
done
echo "registry: answers on https://$addr (CA $dir/ca.crt; docker trusts it via /etc/docker/certs.d/$addr)"

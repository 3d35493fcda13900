#!/usr/bin/env bash
# The user a hosted ubuntu runner runs its jobs as, made on this host for tests/test_workflow_run.py
# (issue 38): an unprivileged `runner` with password-less sudo (GitHub's images: runner ALL=(ALL)
# NOPASSWD:ALL), in the docker group (the images add it there), with a subordinate uid/gid range and a
# runtime dir, so its rootless podman works as the images' does. HOST-CHANGING, on purpose: it adds the user,
# its sudoers line and, where sudo is missing, Debian's sudo package. Idempotent.
#   usage: faithful-runner.sh [BASE_IMAGE_TAG]      (run as root)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
user=${ENVPORT_RUNNER_USER:-runner}
base_tag=${1:-envport/debian-bookworm:base}

if ! command -v sudo >/dev/null 2>&1; then
    # A runner's `sudo apt-get ...` steps need the real sudo; Debian 12 images ship without it.
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends sudo >/dev/null
fi

# The user, its subordinate ids, runtime dir and native-overlay storage: the rootless podman setup CI's
# podman user gets (podman.sh; it also loads the base into the user's own HOME's store, which the jobs
# never see: each job runs with a fresh HOME whose store starts empty, as a hosted runner's does).
ENVPORT_PODMAN_USER=$user bash "$here/services/podman.sh" "$base_tag" >/dev/null

usermod -aG docker "$user"
sudoers=/etc/sudoers.d/envport-$user
if [[ ! -f $sudoers ]]; then
    printf '%s ALL=(ALL) NOPASSWD:ALL\n' "$user" >"$sudoers.tmp"
    chmod 0440 "$sudoers.tmp"
    visudo -cf "$sudoers.tmp" >/dev/null
    mv "$sudoers.tmp" "$sudoers"
fi
echo "faithful-runner: $user (uid $(id -u "$user"), groups $(id -Gn "$user" | tr ' ' ,)), password-less sudo"

#!/usr/bin/env bash
# Install what the real-service tests need: Debian packages for the docker
# engine, debootstrap, one-node Slurm, the multi-node Slurm's network namespaces
# (iproute2's ip netns, util-linux's nsenter), sshd, and the SIF/apptainer-build tools
# (siftool, squashfs-tools, squashfuse, fuse3, charliecloud-runtime's ch-run,
# bubblewrap), rootless podman (podman, uidmap's newuidmap, slirp4netns, fuse-overlayfs, catatonit for
# --init), Lmod (the module tests: `envport module`), then envport itself with its test extra. Idempotent: installed packages are not touched again.
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
packages=(docker.io debootstrap slurm-wlm munge iproute2 util-linux openssh-server
          siftool squashfs-tools squashfuse fuse3 charliecloud-runtime bubblewrap gnupg docker-registry
          podman uidmap slirp4netns fuse-overlayfs catatonit lmod)
# Another apt/dpkg run (e.g. a provisioning step) may hold the lock: wait for
# it, but not forever.
lock_wait_s=${ENVPORT_APT_LOCK_WAIT:-600}

missing=()
for pkg in "${packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed'; then
        missing+=("$pkg")
    fi
done

if ((${#missing[@]})); then
    echo "install: apt packages missing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get -o DPkg::Lock::Timeout="$lock_wait_s" update
    # With recommends: the set these scripts were measured with (docker.io, slurm-wlm).
    apt-get -o DPkg::Lock::Timeout="$lock_wait_s" install -y "${missing[@]}"
else
    echo "install: apt packages present: ${packages[*]}"
fi

cd "$repo_root"
python3 -m pip install -e '.[test]'
echo "install: done"

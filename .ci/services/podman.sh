#!/usr/bin/env bash
# Rootless podman for `--target podman`: an unprivileged test user with its own
# subordinate uid/gid ranges, its own storage (native overlay) and runroot, and
# the base image loaded into that storage from the docker engine; and a second
# user with no range at all, for the single-uid refusal. Installs nothing
# (podman, uidmap, slirp4netns, fuse-overlayfs and catatonit come from
# .ci/install.sh). Idempotent: an existing user, range, storage or image stays.
#   usage: podman.sh [BASE_IMAGE_TAG]
set -euo pipefail

user=${ENVPORT_PODMAN_USER:-envport-podman}
single_uid_user=${ENVPORT_PODMAN_1UID_USER:-envport-podman-1uid}
base_tag=${1:-envport/debian-bookworm:base}
# 65536 ids: one full 16-bit range, what podman's default /etc/containers config maps.
range_size=65536

for bin in podman newuidmap newgidmap runuser useradd; do
    if ! command -v "$bin" >/dev/null 2>&1; then
        echo "podman: $bin not found (apt-get install podman uidmap slirp4netns fuse-overlayfs passwd util-linux)" >&2
        exit 1
    fi
done

# No subordinate ids for this one (useradd would add a range by default): podman's single-uid mode.
if ! id -u "$single_uid_user" >/dev/null 2>&1; then
    useradd -K SUB_UID_COUNT=0 -K SUB_GID_COUNT=0 --create-home --shell /bin/bash --user-group "$single_uid_user"
fi
install -d -m 0700 -o "$single_uid_user" -g "$single_uid_user" "/run/user/$(id -u "$single_uid_user")"

if ! id -u "$user" >/dev/null 2>&1; then
    useradd --create-home --shell /bin/bash --user-group "$user"
fi
home=$(getent passwd "$user" | cut -d: -f6)
uid=$(id -u "$user")

# A range above every other one in the file, so it overlaps none (another user's
# overlapping range would let that user's containers write this user's files).
add_range() {
    local file=$1 start
    touch "$file"
    if grep -q "^$user:" "$file"; then
        return 0
    fi
    start=$(awk -F: -v size="$range_size" 'BEGIN {top = 100000}
        {end = $2 + $3; if (end > top) top = end}
        END {print int((top + size - 1) / size) * size}' "$file")
    echo "$user:$start:$range_size" >>"$file"
}
add_range /etc/subuid
add_range /etc/subgid

# Rootless podman keeps its runroot under XDG_RUNTIME_DIR; without systemd-logind
# nothing makes /run/user/UID, so make it here (mode 0700, the user's own).
runtime_dir=/run/user/$uid
install -d -m 0700 -o "$user" -g "$user" "$runtime_dir"

as_user() {
    runuser -u "$user" -- env -i HOME="$home" USER="$user" LOGNAME="$user" PATH=/usr/sbin:/usr/bin:/sbin:/bin \
        XDG_RUNTIME_DIR="$runtime_dir" "$@"
}

# Podman 4.3 picks fuse-overlayfs when installed, else vfs, which copies the whole rootfs at every build
# step (a six-only env: 324 s, against 35 s on overlay); /dev/fuse is root's here, and this kernel mounts
# overlay in a user namespace, so ask for native overlay. Storage made with another driver is reset once.
storage_conf=$home/.config/containers/storage.conf
if [[ ! -f $storage_conf ]]; then
    as_user mkdir -p "$(dirname "$storage_conf")"
    printf '# written by .ci/services/podman.sh: native overlay, see there\n[storage]\ndriver = "overlay"\n' \
        | as_user tee "$storage_conf" >/dev/null
    as_user podman system reset -f >/dev/null 2>&1 || true
fi

# A range added after the user's first podman call is only read by `podman system migrate`.
as_user podman system migrate >/dev/null 2>&1 || true
info=$(as_user podman info --format '{{.Host.Security.Rootless}} {{.Store.GraphDriverName}} {{.Store.GraphRoot}} {{.Store.RunRoot}} {{len .Host.IDMappings.UIDMap}}')
read -r rootless driver graphroot runroot uidmaps <<<"$info"
if [[ $rootless != true ]]; then
    echo "podman: podman info as $user says rootless=$rootless" >&2
    exit 1
fi
if ((uidmaps < 2)); then
    echo "podman: $user has a single-uid mapping (no subuid range in effect): $info" >&2
    exit 1
fi

if ! as_user podman image exists "$base_tag"; then
    if ! docker image inspect "$base_tag" >/dev/null 2>&1; then
        echo "podman: $base_tag is not in the docker engine (run .ci/services/base-image.sh first)" >&2
        exit 1
    fi
    docker save "$base_tag" | as_user podman load >/dev/null
fi
echo "podman: rootless as $user (driver $driver, storage $graphroot, runroot $runroot, $base_tag loaded)"

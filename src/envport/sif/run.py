"""Run commands inside a SIF: `apptainer exec` where apptainer is installed, else Charliecloud's
`ch-run` on the SIF's squashfs partition mounted with squashfuse (measured).

- where: every mount is `ro,nosuid,nodev` (what apptainer uses; a setuid file
  in a pulled image gives nobody root, a device node in it opens for no one)
  at `rootfs` inside a fresh 0700 directory of the running user (PREFIX +
  random): another local user cannot reach the image's files at all;
- mount, as root: `mount -t squashfs -o ro,nosuid,nodev,loop,offset=N FILE MNT` (N: the
  primary partition's offset), what apptainer itself does as root: no FUSE
  round trip per open (bench/bench_sif.py: the witness suite ~1.2x faster);
  squashfuse where it fails (no loop device) or ENVPORT_SIF_MOUNT=squashfuse;
- mount, unprivileged: `squashfuse_ll -f -o ro,nosuid,nodev,offset=N,auto_unmount FILE MNT`
  (what apptainer's own unprivileged mount does;
  squashfuse_ll, the low-level one from the same Debian package, where it is
  installed, else squashfuse), held by a small bash process for as long as
  the caller needs it (`mounted`): one mount serves a whole verify session or
  witness run, so what one command read (libtorch) stays in the page cache
  for the next. Unmounted with `fusermount -u`; the holder then removes the
  mount point and its private directory. A SIGKILLed envport still leaves nothing: the holder dies with
  its parent (PR_SET_PDEATHSIG) and stops squashfuse, which unmounts, and
  `auto_unmount` (fusermount3 watching the FUSE connection) unmounts even a
  SIGKILLed squashfuse (the kernel's mount has no auto_unmount: its holder
  unmounts when envport dies; only a SIGKILL of the holder itself leaves it);
- no FUSE, unprivileged (`/dev/fuse` root-only, common on clusters; or ENVPORT_SIF_MOUNT=extract):
  the judged partition extracted with `unsquashfs -o N` from the same open descriptor into the same
  private 0700 directory, run from there by ch-run, removed afterwards (measured: 0.5 s for a 110 MB lz4
  partition). Never as root: root's extraction would recreate setuid-root files and device nodes on disk,
  where `nosuid,nodev` could not hold them (root loop-mounts instead);
- exec: `ch-run --unset-env='*' --set-env=... [-b SRC:DST] MNT --
  /.singularity.d/actions/exec CMD...`: the image's env scripts are sourced in
  name order by the SIF's own exec action, as apptainer's do; the host
  environment does not leak in (apptainer's --cleanenv); ch-run needs USER
  set (CI has none) and can only bind onto directories the read-only image
  has, so extra folders go to WITNESS_MOUNT (/mnt) and weight mount points;
  ch-run's binds are always writable, so with binds ch-run runs under
  `bwrap --dev-bind / / --ro-bind SRC SRC`: a bind of a read-only mount is
  read-only (and stays so in ch-run's user namespace), as `--bind SRC:DST:ro`
  is for apptainer;
- apptainer: `apptainer exec --cleanenv [--nv] --bind SRC:DST[:ro] FILE CMD...`;
- trust: nothing here takes a path. `mounted` and `apptainer_argv` take a `Gated` (sif/gate.py: the file
  opened once, its table judged, its signatures checked under the site's `trust.require_signed`) and
  mount its partition by the judged offset and size from the open descriptor itself (`/proc/self/fd/N`
  in a child that inherits it), so a file renamed over the name after the check is never what runs.
  The one mount that is not gated is a build's own partial (`mounted_own_build`: the apptainer-binary
  route reads its SBOM before the file has a name, or a signature, to check).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator, Mapping, Optional, Sequence

from envport.core.errors import ReasonError
from envport.core.mounts import mounts
from envport.core.files import remove_tree
from envport.core.proc import run, spawn
from envport.core.progress import human_size
from envport.sif.format import primary_partition, read_sif
from envport.sif.gate import Gated
from envport.sif.handle import SifFile

WITNESS_MOUNT = "/mnt"
EXEC_ACTION = "/.singularity.d/actions/exec"
MOUNT_PREFIX = "envport-sif-"
# Every mount of an image: read-only, its setuid bits and device nodes inert (apptainer's own options).
MOUNT_OPTIONS = "ro,nosuid,nodev"
# The mount point's name inside its private 0700 directory (the directory keeps other users out); the shell
# texts that make and sweep such mounts (SWEEP_FN, launchers/sif.py TASK) spell it too.
ROOTFS = "rootfs"
# What apptainer --cleanenv keeps from the host.
KEEP_ENV = ("TERM", "LANG")
DEBIAN_PACKAGES = {"ch-run": "charliecloud-runtime", "squashfuse": "squashfuse", "fusermount": "fuse3",
                   "bwrap": "bubblewrap"}
# The low-level squashfuse first (same Debian package, faster: bench/bench_sif.py).
SQUASHFUSE = ("squashfuse_ll", "squashfuse")
MOUNT_TIMEOUT_S = 30.0
EXTRACT = "extract"
EXTRACT_TIMEOUT_S = 1800.0
# A squashfs superblock's bytes_used: 8 bytes little-endian at byte 40 (squashfs-tools' squashfs_fs.h).
SQUASHFS_SUPERBLOCK = struct.Struct("<40xQ")

# Holds one mount: $1 squashfuse, $2 its -o options, $3 the SIF, $4 the mount point (DIR/rootfs). Runs
# squashfuse in the foreground; a TERM/INT/HUP (trapped before anything is mounted; or its parent's death:
# PR_SET_PDEATHSIG) stops squashfuse, which unmounts; once squashfuse is gone (unmounted by the caller,
# signalled or killed: auto_unmount) the mount point and its private DIR are removed.
HOLDER = r"""set -u
pid=
trap 'stopping=1; [ -z "$pid" ] || kill -TERM "$pid" 2>/dev/null' TERM INT HUP
"$1" -f -o "$2" "$3" "$4" &
pid=$!
[ -z "${stopping-}" ] || kill -TERM "$pid" 2>/dev/null
while kill -0 "$pid" 2>/dev/null; do wait "$pid"; done
n=0
until rmdir "$4" 2>/dev/null || [ ! -d "$4" ]; do n=$((n+1)); [ "$n" -lt 200 ] || exit 1; sleep 0.05; done
rmdir "${4%/*}" 2>/dev/null
exit 0
"""
# The same for the kernel's loop mount (root): $1 the -o options, $2 the SIF, $3 the mount point (DIR/rootfs).
# A TERM/INT/HUP (or its parent's death) unmounts (lazily when busy) and removes the mount point and DIR.
KERNEL_HOLDER = r"""set -u
pid= mnt=$3
stop() {
  [ -z "$pid" ] || kill "$pid" 2>/dev/null
  umount "$mnt" 2>/dev/null || umount -l "$mnt"
  rmdir "$mnt" "${mnt%/*}"
  exit 0
}
trap stop TERM INT HUP
mount -t squashfs -o "$1" "$2" "$mnt" || exit 3
sleep infinity &
pid=$!
wait "$pid"
stop
"""
MOUNT_ENV = "ENVPORT_SIF_MOUNT"
# `envport_sif_sweep BASE`: unmount every mount envport's per-task wrapper made at BASE<random>/rootfs (a task
# that was killed before its own trap could), and remove both. A mount counts only where /proc/self/mountinfo
# lists it (the kernel's resolved path: a planted symlink never appears there) and its directory is this
# user's, mode 0700 and no link (stat without -L). Never an unmount of what a glob of BASE* found, never
# `umount` through a link: an unrelated mount another user points a link at stays (issue 21, F7). One text,
# for the launcher's cleanup and the Slurm batch script's EXIT trap.
SWEEP_FN = r"""envport_sif_sweep() {
  local base=$1 esc point rest dir me
  local -a points=()
  me=$(id -u)
  # mountinfo writes space, tab, newline and backslash as octal escapes: match BASE in that form.
  esc=${base//\\/\\134}; esc=${esc// /\\040}; esc=${esc//$'\t'/\\011}; esc=${esc//$'\n'/\\012}
  while read -r _ _ _ _ point _; do points+=("$point"); done </proc/self/mountinfo
  for point in "${points[@]}"; do
    rest=${point#"$esc"}
    [ "$rest" != "$point" ] && [[ $rest =~ ^[A-Za-z0-9_]+/rootfs$ ]] || continue
    dir=$base${rest%/rootfs}
    [ "$(stat -c %F:%u:%a -- "$dir" 2>/dev/null)" = "directory:$me:700" ] || continue
    { fusermount -u -- "$dir/rootfs" || umount -l -- "$dir/rootfs"; } 2>/dev/null
  done
  # The directories, also those a task killed outright left empty (auto_unmount took its mount): rmdir
  # removes only an empty directory and never follows a link.
  for dir in "$base"*; do
    [[ ${dir#"$base"} =~ ^[A-Za-z0-9_]+$ ]] || continue
    [ "$(stat -c %F:%u:%a -- "$dir" 2>/dev/null)" = "directory:$me:700" ] || continue
    rmdir -- "$dir/rootfs" "$dir" 2>/dev/null
  done
  return 0
}"""


def apptainer() -> Optional[str]:
    return shutil.which("apptainer") or shutil.which("singularity")


def runtime() -> str:
    """'apptainer' where it is installed (ENVPORT_SIF_RUNTIME=ch-run forces ch-run), else 'ch-run'."""
    if os.environ.get("ENVPORT_SIF_RUNTIME") != "ch-run" and apptainer():
        return "apptainer"
    return "ch-run"


def missing_tools(kind: str) -> list[str]:
    """Debian packages that `kind` ('ch-run' or 'apptainer') lacks here, as 'tool (package)'."""
    if kind == "apptainer":
        return [] if apptainer() else ["apptainer (not packaged for Debian 12)"]
    return [f"{t} ({p})" for t, p in DEBIAN_PACKAGES.items() if shutil.which(t) is None]


def squashfuse_options(offset: int) -> str:
    """squashfuse's -o for the partition at OFFSET: MOUNT_OPTIONS, and unmounted when squashfuse dies."""
    return f"{MOUNT_OPTIONS},offset={offset},auto_unmount"


def squashfuse() -> str:
    """squashfuse_ll where it is installed, else squashfuse."""
    return next((t for t in SQUASHFUSE if shutil.which(t)), SQUASHFUSE[-1])


class MountError(ReasonError):
    """The SIF could not be mounted (reason `sif_mount_failed`); the message has squashfuse's words."""

    def __init__(self, message: str):
        super().__init__("sif_mount_failed", message)


def is_mounted(path: Path) -> bool:
    """PATH is a mount point in this mount namespace (also a FUSE mount whose server died, unlike ismount)."""
    target = str(Path(path).absolute())
    return any(m.point == target for m in mounts())


def unmount(mountpoint: Path) -> None:
    for argv in (["fusermount", "-u", str(mountpoint)], ["fusermount3", "-u", str(mountpoint)],
                 ["umount", str(mountpoint)]):
        if shutil.which(argv[0]) is None:
            continue
        # errors="replace": an unmount says a path's bytes back, and its words must never stop the cleanup.
        if run(argv, timeout=60, errors="replace").ok:
            return
    if is_mounted(mountpoint):
        run(["umount", "-l", str(mountpoint)], timeout=60, errors="replace")


def mount_kind() -> str:
    """'kernel' as root: a read-only loop mount of the squashfs, what apptainer itself does as root (no
    FUSE round trip per open: bench/bench_sif.py); else, or with ENVPORT_SIF_MOUNT=squashfuse, 'squashfuse'."""
    if os.geteuid() == 0 and os.environ.get(MOUNT_ENV) != "squashfuse" and shutil.which("mount"):
        return "kernel"
    return "squashfuse"


def mounted_own_build(sif: Path, prefix: str = MOUNT_PREFIX, parent: Optional[str] = None,
                      only: Sequence[str] = ()):
    """`mounted` for the partial this process's build has just written, under a hidden name, not yet signed
    (builders/apptainer/binary.py reads its SBOM): the trust gate, which is for SIFs from elsewhere, is not
    asked (under trust.require_signed it would refuse every build)."""
    info = read_sif(sif)
    return _mounted(info.file, primary_partition(info), prefix, parent, only)


def mounted(gated: Gated, prefix: str = MOUNT_PREFIX, parent: Optional[str] = None, only: Sequence[str] = ()):
    """GATED's partition mounted `ro,nosuid,nodev` at `rootfs` in a fresh 0700 directory of this user
    (PREFIX + random, in PARENT or the temp dir) for the duration (`mount_kind`; squashfuse where the kernel's
    mount fails, e.g. no loop device); unmounted and both removed afterwards, whatever happened (MountError
    when no mount works).  The bytes mounted are the open file's, at the judged offset and size.
    ONLY (unsquashfs patterns): a caller that opens just these paths; where the partition is extracted
    rather than mounted, only they are (a mount reads what is opened, whatever ONLY says)."""
    return _mounted(gated.file, gated.partition, prefix, parent, only)


@contextlib.contextmanager
def _mounted(sif: SifFile, part, prefix: str, parent: Optional[str], only: Sequence[str] = ()) -> Iterator[Path]:
    holder, kind, failed, mnt = None, "", [], None
    try:
        for kind in access_kinds():
            mnt = _private_mountpoint(prefix, parent)  # a fresh one per try: a failed holder removes its own
            try:
                holder = _extract(sif, part.offset, part.size, mnt, only) if kind == EXTRACT else \
                    _hold(kind, sif, part.offset, part.size, mnt)
                break
            except MountError as exc:
                failed.append(str(exc))
                _release(mnt, None, kind)
                mnt = None
        else:
            raise MountError("; ".join(failed))
        yield mnt
    finally:
        if mnt is not None:
            _release(mnt, holder, kind)


def _private_mountpoint(prefix: str, parent: Optional[str]) -> Path:
    """`rootfs` in a fresh directory PREFIX+random (in PARENT or the temp dir): mkdtemp makes it 0700 and ours,
    atomically (O_EXCL), whoever can write PARENT (/tmp)."""
    mnt = Path(tempfile.mkdtemp(prefix=prefix, dir=parent)) / ROOTFS
    try:
        mnt.mkdir(mode=0o700)
    except OSError:
        mnt.parent.rmdir()
        raise
    return mnt


def access_kinds() -> list[str]:
    """How this process may reach a partition's files, in the order tried: the kernel's loop mount (root),
    squashfuse, then, unprivileged only, an extraction (EXTRACT) where FUSE is not this user's."""
    if os.environ.get(MOUNT_ENV) == EXTRACT and os.geteuid() != 0:
        return [EXTRACT]
    kinds = ["kernel", "squashfuse"] if mount_kind() == "kernel" else ["squashfuse"]
    return kinds + ([EXTRACT] if os.geteuid() != 0 else [])


def access_label() -> str:
    """How `mounted` will reach the partition here, for a launcher's description: 'kernel squashfs',
    'squashfuse_ll, else unsquashfs' (no FUSE for this user)."""
    names = {"kernel": "kernel squashfs", "squashfuse": squashfuse(), EXTRACT: "unsquashfs"}
    return ", else ".join(names[k] for k in access_kinds())


def reached_as(mnt: Path) -> str:
    """'mounted at MNT', or 'extracted to MNT' where `mounted` fell back to an extraction."""
    return f"{'mounted at' if is_mounted(mnt) else 'extracted to'} {mnt}"


def _extract(sif: SifFile, offset: int, size: int, dest: Path, only: Sequence[str] = ()) -> None:
    """The squashfs at OFFSET (SIZE bytes, as the table was judged) of the open SIF extracted into DEST (the
    empty private mount point) by unsquashfs reading the descriptor, never the name. MountError with its words.
    Its superblock must end inside the partition: unsquashfs bounds its reads by it, not by the table.
    ONLY: just the paths matching these unsquashfs extract patterns (each '/'-separated component a shell
    wildcard, a leading '.' matched only by a '.'), with the folders leading to them: what the SBOM reads
    (sif/sbom.py `extract_patterns`), not the whole partition."""
    tool = shutil.which("unsquashfs")
    if tool is None:
        raise MountError("unsquashfs not found (apt-get install squashfs-tools)")
    head = sif.read(offset, SQUASHFS_SUPERBLOCK.size)
    if len(head) < SQUASHFS_SUPERBLOCK.size or head[:4] != b"hsqs":
        raise MountError(f"{sif.path}: the partition at byte {offset} is no squashfs")
    used = SQUASHFS_SUPERBLOCK.unpack(head)[0]
    if used > size:
        raise MountError(f"{sif.path}: the squashfs says it is {used} bytes, more than its partition ({size})")
    what = f"the files it reads (not all {human_size(size)})" if only else human_size(size)
    print(f"envport: no FUSE mount for this user: extracting {what} of {sif.path} into {dest} "
          "(unsquashfs; removed afterwards)", file=sys.stderr, flush=True)
    ran = run([tool, "-o", str(offset), "-d", str(dest), "-f", "-no-xattrs", "-n", sif.child_path, *only],
              timeout=EXTRACT_TIMEOUT_S, pass_fds=sif.pass_fds, errors="replace")
    # Exit 2: non-fatal errors only (a device node an unprivileged user cannot make: never used in the image).
    if ran.returncode not in (0, 2):
        said = (ran.stderr or ran.stdout or ran.why).strip().splitlines()
        raise MountError(f"unsquashfs of {sif.path} into {dest} failed: {said[-1] if said else ran.returncode}")


def _hold(kind: str, sif: SifFile, offset: int, size: int, mnt: Path) -> subprocess.Popen:
    """Start the holder of one mount of KIND and wait until MNT is mounted (MountError with its words).  The
    holder inherits SIF's descriptor and mounts `/proc/self/fd/N`: the open file, not whatever the name
    points at now; the kernel's loop device is also limited to the partition's size."""
    argv = ["bash", "-c", KERNEL_HOLDER, "envport-sif-mount", f"{MOUNT_OPTIONS},loop,offset={offset},sizelimit={size}",
            sif.child_path, str(mnt)] if kind == "kernel" \
        else ["bash", "-c", HOLDER, "envport-sif-mount", squashfuse(), squashfuse_options(offset),
              sif.child_path, str(mnt)]
    tool = f"mount -t squashfs -o {MOUNT_OPTIONS},loop" if kind == "kernel" else squashfuse()
    with tempfile.TemporaryFile() as err:
        holder = spawn(argv, stdout=subprocess.DEVNULL, stderr=err, new_session=True, dies_with=signal.SIGTERM,
                       pass_fds=sif.pass_fds)
        deadline = time.monotonic() + MOUNT_TIMEOUT_S
        while not is_mounted(mnt):
            if holder.poll() is not None or time.monotonic() > deadline:
                if holder.poll() is None:
                    holder.kill()
                holder.wait()
                err.seek(0)
                said = err.read().decode(errors="replace").strip()
                raise MountError(f"{tool} of {sif.path} at {mnt} failed"
                                 + (f": {said}" if said else f" (not mounted after {MOUNT_TIMEOUT_S:.0f}s)"))
            time.sleep(0.02)
    return holder


def _release(mnt: Path, holder: Optional[subprocess.Popen], kind: str) -> None:
    """Unmount MNT, let its holder remove it and its private directory; a holder that does not end is stopped.
    An extracted tree (EXTRACT) is removed whole, its read-only folders made writable first."""
    if kind == EXTRACT and not is_mounted(mnt):
        remove_tree(mnt)
    if holder is not None and kind == "kernel":
        holder.terminate()  # its trap unmounts and removes the directory
    elif is_mounted(mnt):
        unmount(mnt)  # squashfuse then exits, and its holder removes the directory
    if holder is not None:
        try:
            holder.wait(timeout=MOUNT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            holder.terminate()
            try:
                holder.wait(timeout=10)
            except subprocess.TimeoutExpired:
                holder.kill()
                holder.wait()
    if is_mounted(mnt):
        run(["umount", "-l", str(mnt)], timeout=60, errors="replace")
    for path in (mnt, mnt.parent):
        with contextlib.suppress(OSError):
            path.rmdir()


def ch_run_argv(mnt: str, argv: Sequence[str], *, env: Mapping[str, str] = (),
                binds: Sequence[tuple[str, str]] = ()) -> list[str]:
    """ch-run on a mounted SIF: a clean environment, the image's env scripts, then ARGV.

    BINDS (host folder, path in the image) are read-only: ch-run runs under bwrap, which makes each
    host folder a read-only mount first (ch-run's own binds are writable).
    """
    out = ["ch-run", "--unset-env=*", "--set-env=HOME=/root"]
    for key in KEEP_ENV:
        if os.environ.get(key):
            out.append(f"--set-env={key}={os.environ[key]}")
    for key, value in sorted(dict(env).items()):
        out.append(f"--set-env={key}={value}")
    for src, dst in binds:
        out.append(f"--bind={src}:{dst}")
    out += [mnt, "--", EXEC_ACTION, *argv]
    if not binds:
        return out
    ro = ["bwrap", "--dev-bind", "/", "/"]
    for src in dict.fromkeys(src for src, _ in binds):
        ro += ["--ro-bind", src, src]
    return ro + ["--", *out]


def apptainer_argv(gated: Gated, argv: Sequence[str], *, env: Mapping[str, str] = (),
                   binds: Sequence[tuple[str, str, bool]] = (), nv: bool = False,
                   image: Optional[str] = None) -> list[str]:
    """apptainer exec of the gated file: named by this process's descriptor (`/proc/PID/fd/N`, which every
    child of this process can open while it lives), never by the path that was judged (not run here: no
    apptainer on this project's machines).  IMAGE: another name for it, for a process that is not this one's
    child (the Slurm task wrapper opens and checks the file itself, then passes its own descriptor)."""
    sif = image or f"/proc/{os.getpid()}/fd/{gated.file.fd}"
    out = [apptainer() or "apptainer", "exec", "--cleanenv"] + (["--nv"] if nv else [])
    for src, dst, ro in binds:
        out += ["--bind", f"{src}:{dst}" + (":ro" if ro else "")]
    for key, value in sorted(dict(env).items()):
        out += ["--env", f"{key}={value}"]
    return out + [sif, *argv]


def ch_run_env() -> dict[str, str]:
    """The host environment ch-run itself needs (it refuses to start without USER)."""
    env = dict(os.environ)
    env.setdefault("USER", _user())
    return env


def _user() -> str:
    import pwd

    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())

"""Run commands inside a SIF: `apptainer exec` where apptainer is installed, else Charliecloud's
`ch-run` on the SIF's squashfs partition mounted with squashfuse (RECIPES.md, measured).

- mount: `squashfuse -o offset=N FILE MNT` (N: the primary partition's offset;
  what apptainer's own unprivileged mount does), unmounted with `fusermount -u`;
- exec: `ch-run --unset-env='*' --set-env=... [-b SRC:DST] MNT --
  /.singularity.d/actions/exec CMD...`: the image's env scripts are sourced in
  name order by the SIF's own exec action, as apptainer's do; the host
  environment does not leak in (apptainer's --cleanenv); ch-run needs USER
  set (CI has none) and can only bind onto directories the read-only image
  has, so extra folders go to WITNESS_MOUNT (/mnt) and weight mount points;
- apptainer: `apptainer exec --cleanenv [--nv] --bind SRC:DST[:ro] FILE CMD...`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator, Mapping, Optional, Sequence

from envport.engines.sif import primary_partition, read_sif

WITNESS_MOUNT = "/mnt"
EXEC_ACTION = "/.singularity.d/actions/exec"
MOUNT_PREFIX = "envport-sif-"
# What apptainer --cleanenv keeps from the host.
KEEP_ENV = ("TERM", "LANG")
DEBIAN_PACKAGES = {"ch-run": "charliecloud-runtime", "squashfuse": "squashfuse", "fusermount": "fuse3"}


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


def partition_offset(sif: Path) -> int:
    return primary_partition(read_sif(sif)).offset


def mount(sif: Path, mountpoint: Path, timeout: float = 30) -> None:
    """Mount SIF's primary partition read-only at MOUNTPOINT (raises RuntimeError with the tool's message)."""
    offset = partition_offset(sif)
    proc = subprocess.run(["squashfuse", "-o", f"offset={offset}", str(sif), str(mountpoint)],
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"squashfuse of {sif} at {mountpoint} failed: {(proc.stderr or proc.stdout).strip()}")
    deadline = time.monotonic() + timeout
    while not os.path.ismount(mountpoint):
        if time.monotonic() > deadline:
            raise RuntimeError(f"squashfuse returned but {mountpoint} is not mounted after {timeout:.0f}s")
        time.sleep(0.05)


def unmount(mountpoint: Path) -> None:
    for argv in (["fusermount", "-u", str(mountpoint)], ["fusermount3", "-u", str(mountpoint)],
                 ["umount", str(mountpoint)]):
        if shutil.which(argv[0]) is None:
            continue
        if subprocess.run(argv, capture_output=True, timeout=60).returncode == 0:
            return
    if os.path.ismount(mountpoint):
        subprocess.run(["umount", "-l", str(mountpoint)], capture_output=True, timeout=60)


@contextlib.contextmanager
def mounted(sif: Path) -> Iterator[Path]:
    """SIF mounted at a fresh directory for the duration; unmounted and removed afterwards."""
    mnt = Path(tempfile.mkdtemp(prefix=MOUNT_PREFIX))
    try:
        mount(sif, mnt)
        yield mnt
    finally:
        if os.path.ismount(mnt):
            unmount(mnt)
        with contextlib.suppress(OSError):
            mnt.rmdir()


def ch_run_argv(mnt: str, argv: Sequence[str], *, env: Mapping[str, str] = (),
                binds: Sequence[tuple[str, str]] = ()) -> list[str]:
    """ch-run on a mounted SIF: a clean environment, the image's env scripts, then ARGV."""
    out = ["ch-run", "--unset-env=*", "--set-env=HOME=/root"]
    for key in KEEP_ENV:
        if os.environ.get(key):
            out.append(f"--set-env={key}={os.environ[key]}")
    for key, value in sorted(dict(env).items()):
        out.append(f"--set-env={key}={value}")
    for src, dst in binds:
        out.append(f"--bind={src}:{dst}")
    return out + [mnt, "--", EXEC_ACTION, *argv]


def apptainer_argv(sif: str, argv: Sequence[str], *, env: Mapping[str, str] = (),
                   binds: Sequence[tuple[str, str, bool]] = (), nv: bool = False) -> list[str]:
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

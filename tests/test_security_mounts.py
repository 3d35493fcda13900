"""Issue 21, F1 and F7: the SIF mounts envport makes, attacked as another local user (uid 65534 through
`setpriv`), on the real code paths.

- F1: a pulled SIF whose partition holds a setuid-root copy of `id` and a 0666 character device node
  (made by mksquashfs pseudo definitions: nothing setuid or device-like touches the host's disk) is
  mounted as verify (`sif_run.mounted`), a witness run (`SifLauncher.session`) and a Slurm task (the
  launcher's per-call wrapper, `launchers/sif.py` TASK) mount it. Every mount must be ro,nosuid,nodev
  in /proc/self/mountinfo, at `rootfs` in a 0700 directory of ours; uid 65534, started inside the mount
  (so the private directory is not what stops it), runs the setuid `id` without euid 0 and cannot open
  the device node for writing; by path it cannot reach the image at all.
- F7: uid 65534 plants symlinks named like the per-call mount directories, pointing at unrelated mounts
  (tmpfs mounts this test makes); the launcher's cleanup (what a timeout or Ctrl-C runs) and a real Slurm
  job's EXIT trap must unmount the mount a killed task left, and leave the unrelated mounts mounted.

Host-changing commands, all undone in `finally`: kernel loop and tmpfs mounts under this test's own
folders and /tmp, squashfuse mounts, symlinks in /tmp (made as uid 65534). Needs root (mount, setpriv).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import tempfile
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Iterator

import pytest

from .support import REPO, missing, run_envport, wait_until

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
# Pseudo definitions (mksquashfs -p): a setuid-root copy of the host's id, a world-writable /dev/null node.
PSEUDO = ["evil-id f 4755 0 0 cat /usr/bin/id", "null c 666 0 0 1 3"]


def _needs(*tools: str) -> None:
    if os.geteuid() != 0:
        missing("the mount tests need root (kernel loop mounts, tmpfs, setpriv to another user)")
    absent = [t for t in tools if shutil.which(t) is None]
    if absent:
        missing(f"not installed: {', '.join(absent)} (apt-get install squashfs-tools squashfuse fuse3 util-linux)")


def _mountinfo(point: str) -> list[str]:
    """The per-mount options of the mounts at POINT ([] when nothing is mounted there)."""
    with open("/proc/self/mountinfo") as fh:
        return [ln.split()[5] for ln in fh if ln.split()[4] == point]


def _mounted_under(where: str) -> list[str]:
    with open("/proc/self/mountinfo") as fh:
        return sorted(ln.split()[4] for ln in fh if ln.split()[4].startswith(where))


@pytest.fixture(scope="module")
def hostile_sif(tmp_path_factory) -> Path:
    """A SIF (envport's own writer) whose partition holds /evil-id (setuid root) and /null (0666, 1:3)."""
    _needs("mksquashfs", "setpriv", "mount")
    from envport.sif.format import write_sif

    tmp = tmp_path_factory.mktemp("hostile-sif")
    (tmp / "tree").mkdir()
    pseudo = [a for p in PSEUDO for a in ("-p", p)]
    subprocess.run(["mksquashfs", str(tmp / "tree"), str(tmp / "x.sqfs"), "-noappend", "-quiet", "-no-progress",
                    *pseudo], check=True, timeout=120)
    listing = subprocess.run(["unsquashfs", "-lls", str(tmp / "x.sqfs")], capture_output=True, text=True).stdout
    assert "-rwsr-xr-x root/root" in listing and "crw-rw-rw- root/root" in listing, listing
    sif = tmp / "hostile.sif"
    write_sif(sif, deffile=b"Bootstrap: docker\nFrom: x\n", inspect_metadata=b"{}", squashfs_path=tmp / "x.sqfs",
              created=0, uuid=b"\0" * 16)
    os.chmod(tmp, 0o755)  # the SIF is another user's download: readable by all, as in a shared sif_dir
    return sif


@pytest.fixture
def public_tmp() -> Iterator[Path]:
    """A folder under /tmp that every user can enter (as /tmp is): where a mount's directory goes, so only
    envport's own 0700 directory can keep another user out."""
    path = Path(tempfile.mkdtemp(prefix="envport-test-public-", dir="/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _as_nobody(argv: list[str], cwd: str | None = None) -> subprocess.CompletedProcess:
    # cwd is entered as root before setpriv drops to uid 65534: the attack then starts inside the mount.
    return subprocess.run(NOBODY + argv, cwd=cwd, capture_output=True, text=True, timeout=60)


def _attack(mnt: str) -> None:
    """What another local user gets from a held mount at MNT: nothing."""
    assert mnt.endswith("/rootfs"), mnt
    opts = _mountinfo(mnt)
    assert len(opts) == 1, (mnt, opts)
    assert {"ro", "nosuid", "nodev"} <= set(opts[0].split(",")), f"{mnt} mounted {opts[0]}"
    private = os.lstat(os.path.dirname(mnt))
    assert stat.S_ISDIR(private.st_mode) and stat.S_IMODE(private.st_mode) == 0o700 \
        and private.st_uid == os.geteuid(), (oct(private.st_mode), private.st_uid)
    # Started inside the mount: the setuid bit gives no root (kernel: runs as nobody; FUSE: no access at all).
    ran = _as_nobody(["./evil-id"], cwd=mnt)
    assert "euid=0" not in ran.stdout, f"uid 65534 got root from the image's setuid id: {ran.stdout}"
    assert ran.returncode != 0 or "uid=65534" in ran.stdout, (ran.returncode, ran.stdout, ran.stderr)
    wrote = _as_nobody(["sh", "-c", "echo x > ./null && echo WROTE"], cwd=mnt)
    assert wrote.returncode != 0 and "WROTE" not in wrote.stdout, "the image's device node opened for writing"
    assert "Permission denied" in wrote.stderr, wrote.stderr
    # By path: the private directory stops another user before the image.
    for path in (f"{mnt}/evil-id", mnt, os.path.dirname(mnt)):
        seen = _as_nobody(["ls", "-d", path] if path != os.path.dirname(mnt) else ["ls", path])
        assert seen.returncode != 0 and "Permission denied" in seen.stderr, (path, seen.stdout, seen.stderr)


# The filesystem each kind of mount shows (fuse.squashfuse_ll where the low-level one is installed).
FSTYPES = {"kernel": "squashfs", "squashfuse": "fuse.squashfuse"}


@pytest.mark.parametrize("kind", sorted(FSTYPES))
def test_verify_mount_gives_another_user_no_root_and_no_device(hostile_sif: Path, public_tmp: Path, kind: str,
                                                               monkeypatch):
    from envport.sif import run as sif_run
    from envport.sif.gate import gate

    _needs("squashfuse")
    monkeypatch.setenv(sif_run.MOUNT_ENV, kind)
    with sif_run.mounted(gate(hostile_sif), parent=str(public_tmp)) as mnt:  # what verify/sif.py holds
        assert _fstype(str(mnt)) == FSTYPES[kind] or _fstype(str(mnt)).startswith(FSTYPES[kind] + "_"), \
            _fstype(str(mnt))
        _attack(str(mnt))
    assert list(public_tmp.iterdir()) == [] and _mounted_under(f"{public_tmp}/") == []


def _fstype(point: str) -> str:
    with open("/proc/self/mountinfo") as fh:
        return next(ln.split(" - ")[1].split()[0] for ln in fh if ln.split()[4] == point)


def test_witness_run_mount_gives_another_user_nothing(hostile_sif: Path, public_tmp: Path, monkeypatch):
    from envport.witness.launchers.sif import SifLauncher

    _needs("squashfuse")
    monkeypatch.setattr(tempfile, "tempdir", str(public_tmp))  # the run's mount goes to the temp dir
    launcher = SifLauncher(hostile_sif, runtime="ch-run")
    with launcher.session():
        held = _mounted_under(f"{public_tmp}/")
        assert len(held) == 1 and launcher.invocation("x.py", [], {}).label == held[0], held
        _attack(held[0])
    assert list(public_tmp.iterdir()) == []


# The Slurm task's own wrapper (launchers/sif.py TASK) with a stand-in for ch-run: it prints the mount it
# was given and waits. What the wrapper mounts, and how, is the real thing.
HOLD = ["bash", "-c", 'printf "mounted %s\\n" "$1"; exec sleep 600', "hold"]


@contextmanager
def _task(launcher, sif: Path) -> Iterator[tuple[subprocess.Popen, str]]:
    """One per-call wrapper of LAUNCHER running (its own session); yields it and the mount it made."""
    from envport.sif import run as sif_run
    from envport.sif.gate import gate
    from envport.witness.launchers.sif import MNT, TASK

    inv = launcher.invocation("x.py", [], {})
    i = inv.argv.index(TASK)
    head = inv.argv[:i + 1 + 6]  # bash -c TASK $0 runtime sif options base judged-identity
    assert head[-3] == sif_run.squashfuse_options(gate(sif).partition.offset), head
    assert head[-1] == gate(sif).file.identity, head
    env = {k: v for k, v in (inv.env or os.environ).items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    proc = subprocess.Popen([*head, *HOLD, MNT], env=env, stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        line = proc.stdout.readline().strip()
        assert line.startswith("mounted "), (line, proc.poll())
        yield proc, line.split(" ", 1)[1]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)


def test_slurm_task_mount_gives_another_user_nothing(hostile_sif: Path):
    from envport.witness.launchers.sif import SifLauncher

    _needs("squashfuse", "mountpoint")
    launcher = SifLauncher(hostile_sif, runtime="ch-run")
    with _task(launcher, hostile_sif) as (proc, mnt):
        assert mnt.startswith(launcher.task_mounts()), mnt
        _attack(mnt)
        os.killpg(proc.pid, signal.SIGTERM)  # a timeout, scancel: the task's own trap unmounts
        proc.wait(timeout=60)
    wait_until("the task's mounts gone", lambda: _mounted_under(launcher.task_mounts()) == [] and
               not os.path.exists(os.path.dirname(mnt)), timeout=30)


# --- F7: cleanup follows no symlink and unmounts only envport's own ----------------------------------


@contextmanager
def _unrelated_mounts(base: str) -> Iterator[list[str]]:
    """Two tmpfs mounts nobody asked envport to touch, and uid 65534's symlinks at BASE + EVIL01/EVIL02
    (the names of per-call mount directories) pointing at one of them and at the folder above the other."""
    top = Path(tempfile.mkdtemp(prefix="envport-test-victim-", dir="/tmp"))
    a, b = top / "a", top / "b"
    targets = [str(a), str(b / "rootfs")]
    links = [f"{base}EVIL01", f"{base}EVIL02"]
    try:
        a.mkdir()
        (b / "rootfs").mkdir(parents=True)
        for t in targets:
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "envport-test-victim", t], check=True, timeout=30)
        top.chmod(0o755)
        for link, target in zip(links, [a, b]):
            made = _as_nobody(["ln", "-s", str(target), link])
            assert made.returncode == 0, made.stderr
        yield targets
    finally:
        for t in reversed(targets):
            if _mountinfo(t):
                subprocess.run(["umount", t], timeout=30)
        for link in links:
            with suppress(OSError):
                os.unlink(link)
        shutil.rmtree(top, ignore_errors=True)


@contextmanager
def _killed_task_mount(launcher, sif: Path, unmounted: bool = False) -> Iterator[str]:
    """A per-call wrapper SIGKILLed with its mount held (its trap never ran): yields the mount it left,
    removed afterwards whatever the test found. UNMOUNTED: its mount gone too, its directories left (what
    Slurm killing the step's squashfuse as well leaves once auto_unmount ran; unmounted here by hand)."""
    with _task(launcher, sif) as (proc, mnt):
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    try:
        assert _mountinfo(mnt), f"the killed task left no mount at {mnt}"  # squashfuse lives on, daemonized
        if unmounted:
            subprocess.run(["fusermount", "-u", mnt], check=True, timeout=30)
        yield mnt
    finally:
        if _mountinfo(mnt):
            subprocess.run(["fusermount", "-u", mnt], timeout=30)
        shutil.rmtree(os.path.dirname(mnt), ignore_errors=True)


def test_launcher_cleanup_unmounts_its_own_and_follows_no_symlink(hostile_sif: Path):
    from envport.witness.launchers.sif import SifLauncher

    _needs("squashfuse", "mountpoint")
    launcher = SifLauncher(hostile_sif, runtime="ch-run")
    with _killed_task_mount(launcher, hostile_sif) as left, \
            _killed_task_mount(launcher, hostile_sif, unmounted=True) as emptied, \
            _unrelated_mounts(launcher.task_mounts()) as victims:
        cleanup = launcher.invocation("x.py", [], {}).cleanup  # what run_with_deadline runs on timeout/Ctrl-C
        assert cleanup
        for argv in cleanup:
            subprocess.run(argv, capture_output=True, timeout=60)
        assert not _mountinfo(left) and not os.path.exists(os.path.dirname(left)), \
            "the killed task's mount was not cleaned up"
        assert not os.path.exists(os.path.dirname(emptied)), "a killed task's empty directory was left"
        for v in victims:
            assert _mountinfo(v), f"the cleanup unmounted {v}, an unrelated mount behind a planted symlink"


def test_slurm_job_exit_trap_unmounts_its_own_and_follows_no_symlink(hostile_sif: Path, slurm, tmp_path: Path):
    """A real batch job (the one-node cluster) whose ranks fail at once (the image has no /mnt for ch-run):
    its EXIT trap sweeps the job's mounts."""
    from envport.witness.launchers.sif import SifLauncher

    _needs("squashfuse", "mountpoint", "ch-run")
    proc = run_envport("slurm", "submit", "demo-cpu", "--cluster", "local", "--target", "apptainer", "--sif",
                       str(hostile_sif), "--check", "collectives", "--dry-run", "--json", root=REPO, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = json.loads(proc.stdout)["script"]
    sweep = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("envport_sif_sweep /")]
    assert len(sweep) == 1, text
    base = sweep[0].split()[1]
    # A rank of this job killed before its trap ran: the same wrapper, the same mount directory prefix.
    launcher = SifLauncher(hostile_sif, runtime="ch-run")
    launcher.prefix = base[len("/tmp/"):-1]
    script = tmp_path / "job.sbatch"
    script.write_text(text)
    with _killed_task_mount(launcher, hostile_sif) as left, _unrelated_mounts(base) as victims:
        ran = subprocess.run(["sbatch", "--wait", f"--output={tmp_path}/job.log", str(script)],
                             capture_output=True, text=True, timeout=300)
        log = (tmp_path / "job.log").read_text() if (tmp_path / "job.log").exists() else ""
        assert "envport-slurm: begin" in log, (ran.stdout, ran.stderr, log)
        assert not _mountinfo(left), f"the job's EXIT trap left {left} mounted\n{log}"
        for v in victims:
            assert _mountinfo(v), f"the job's EXIT trap unmounted {v} through a planted symlink\n{log}"

"""`envport witness NAME --target apptainer` and `envport slurm submit --target apptainer`: the witness
scripts inside a real SIF (ch-run on the squashfuse-mounted SIF here; apptainer exec where installed),
and nothing mounted afterwards, whether the run passed, failed, timed out, was signalled (SIGTERM,
SIGKILL) or its Slurm job was cancelled. A witness run mounts the SIF once for all its calls; the
weights and the witness folder are read-only inside it.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from .sif_fixtures import BuiltSif, sif_env
from .support import ENV_NAME, as_json, begun_job, fail_with, proven, run_envport, wait_until

pytest_plugins = ["tests.sif_fixtures"]


def _mounts(where: str) -> list[str]:
    """Mount points whose path starts with WHERE."""
    with open("/proc/self/mountinfo") as fh:
        return sorted(ln.split()[4] for ln in fh if ln.split()[4].startswith(where))


def _fstype(mountpoint: str) -> str:
    with open("/proc/self/mountinfo") as fh:
        return next(ln.split(" - ")[1].split()[0] for ln in fh if ln.split()[4] == mountpoint)


# How a run mounts the SIF: the kernel's loop mount as root (what apptainer does as root), squashfuse
# unprivileged (forced here with ENVPORT_SIF_MOUNT=squashfuse); the tests below that take `mount_kind` run both.
MOUNT_KINDS = {"kernel": "squashfs", "squashfuse": "fuse.squashfuse"}


@pytest.fixture(params=sorted(MOUNT_KINDS))
def mount_kind(request, monkeypatch) -> str:
    import os

    if request.param == "kernel" and os.geteuid() != 0:
        pytest.skip("the kernel's loop mount of a SIF needs root")
    monkeypatch.setenv("ENVPORT_SIF_MOUNT", request.param)
    return request.param


def _left(where: str) -> list[str]:
    """Mount points and directories left at paths starting with WHERE (a test's own TMPDIR + the mount
    prefix, or one launcher's or job's /tmp prefix): only this test's, whatever else runs on the host."""
    head, _, name = where.rpartition("/")
    return sorted(set(_mounts(where)) | {str(d) for d in Path(head or "/").glob(f"{name}*")})


@pytest.fixture
def tmpdir_env(tmp_path: Path) -> tuple[dict, str]:
    """(an envport environment whose TMPDIR is this test's own folder, where the run's SIF mount goes)."""
    tmp = tmp_path / "tmpdir"
    tmp.mkdir()
    return sif_env(TMPDIR=str(tmp)), f"{tmp}/envport-sif-"


# The batch script's EXIT trap sweeps the job's SIF mounts under this prefix (sif/run.py SWEEP_FN).
SWEEP = re.compile(r"^  envport_sif_sweep (/tmp/envport-sif-[0-9a-f]+-)$", re.M)


def _job_prefix(job: str) -> str:
    """The /tmp prefix of a Slurm job's SIF mounts, read from its batch script's cleanup."""
    shown = subprocess.run(["scontrol", "show", "job", job, "-o"], capture_output=True, text=True, timeout=30)
    script = re.search(r"\bCommand=(\S+)", shown.stdout)
    assert script, shown.stdout + shown.stderr
    found = SWEEP.search(Path(script.group(1)).read_text())
    assert found, f"no SIF mount sweep in {script.group(1)}"
    return found.group(1)


def test_every_witness_passes_inside_the_sif(demo_sif: BuiltSif, tmpdir_env):
    env, where = tmpdir_env
    proc = run_envport("witness", ENV_NAME, "--target", "apptainer", "--json", "--no-ledger", root=demo_sif.root,
                       env=env, timeout=900)
    assert proc.returncode == 0, fail_with(proc, "witness --target apptainer")
    out = as_json(proc)
    steps = {s["step"]: s["verdict"] for s in out["steps"]}
    for name in ("python", "import torch", "kernel", "collectives (world 2)", "dtensor (mesh 2x2)"):
        assert steps.get(name) == "OK", steps
    # The docs level is `present` where this env passed the same doc earlier in the run (the ledger says so).
    assert any(s.startswith("cli ") for s in steps), steps
    assert all(proven({"step": k, "verdict": v}) for k, v in steps.items()), steps
    # demo-cpu's pinned weight, read through its variable from the read-only bind at the spec's path.
    weight = next((s for s in out["steps"] if s["step"] == "weight tiny"), None)
    assert weight and weight["data"]["read_only"] is True and "$DEMO_WEIGHTS=/weights/tiny" in weight["detail"], \
        out["steps"]
    assert out["launcher"].endswith(demo_sif.path.name)
    assert _left(where) == [], "a SIF mount (or its directory) was left behind"


def test_a_failing_witness_leaves_no_mount(demo_sif: BuiltSif, tmpdir_env):
    env, where = tmpdir_env
    proc = run_envport("witness", ENV_NAME, "--target", "apptainer", "--only", "collectives", "--deadline", "10",
                       "--json", "--no-ledger", root=demo_sif.root, env={**env, "ENVPORT_WITNESS_FAULT": "crash:1"},
                       timeout=300)
    assert proc.returncode == 1, fail_with(proc, "witness with rank 1 crashing")
    assert _left(where) == [], "a failed witness left its SIF mounted"


def test_a_timed_out_call_is_stopped_and_unmounted(tiny_sif: BuiltSif, tmp_path: Path):
    from envport.witness.launchers.sif import SifLauncher

    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "stall.py").write_text("import time\nprint('stalling', flush=True)\ntime.sleep(600)\n")
    launcher = SifLauncher(tiny_sif.path, witness_dir=scripts)
    assert launcher.preflight() is None
    # A call outside a run (srun's self-contained wrapper): its own mount under /tmp/<prefix>-.
    result = launcher.run("stall.py", [], {}, deadline_s=15)
    assert result.timed_out and "stalling" in result.output, result.output
    assert _left(f"/tmp/{launcher.prefix}-") == [], "the timed-out call left its SIF mounted"


def test_collectives_as_two_slurm_tasks_with_the_sif_launcher(demo_sif: BuiltSif, slurm):
    proc = run_envport("slurm", "submit", ENV_NAME, "--cluster", "local", "--target", "apptainer", "--check",
                       "collectives", "--json", "--no-ledger", root=demo_sif.root, env=sif_env(), timeout=600)
    assert proc.returncode == 0, fail_with(proc, "slurm submit --target apptainer")
    out = json.loads(proc.stdout)
    steps = {s["step"]: s for s in out["steps"]}
    assert steps["collectives (world 2)"]["verdict"] == "OK", out["steps"]
    script = Path(out["script_path"]).read_text()
    assert "ch-run" in script or "apptainer" in script
    prefix = SWEEP.search(script)
    assert prefix and _left(prefix.group(1)) == [], "a Slurm task left its SIF mounted"


def test_missing_sif_is_refused(sif_project: Path):
    from .support import write_spec

    write_spec(sif_project, "tiny-nosif")
    proc = run_envport("witness", "tiny-nosif", "--target", "apptainer", "--json", "--no-ledger", root=sif_project,
                       env=sif_env(), timeout=120)
    assert proc.returncode == 3, fail_with(proc, "witness without a SIF")
    assert "sif_missing" in proc.stdout and "envport build tiny-nosif --target apptainer" in proc.stdout


# Reads each folder, then tries to write into it.
WRITE_PY = """import os, sys
for d in sys.argv[1:]:
    if d.startswith("/weights"):
        print("read", d, open(d + "/tiny.f32", "rb").read(4).hex())
    else:
        print("read", d, len(os.listdir(d)))
    try:
        with open(d + "/envport-wrote", "w") as fh:
            fh.write("x")
        print("WROTE", d)
    except OSError as exc:
        print("refused", d, exc.errno, exc.strerror)
"""


def _stall_scripts(tmp_path: Path) -> Path:
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "stall.py").write_text("import time\nprint('stalling', flush=True)\ntime.sleep(600)\n")
    (scripts / "where.py").write_text(
        "import os\nprint('root-dev', os.stat('/opt').st_dev, flush=True)\n")
    (scripts / "write.py").write_text(WRITE_PY)
    return scripts


@pytest.fixture
def own_tmp(tmp_path: Path, monkeypatch) -> Path:
    """This process's temp dir (where a run's mount goes) pointed at the test's own folder."""
    import tempfile

    tmp = tmp_path / "tmpdir"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    return tmp


def test_a_run_mounts_the_sif_once_and_leaves_nothing(tiny_sif: BuiltSif, tmp_path: Path, own_tmp: Path,
                                                       mount_kind: str):
    from envport.witness.launchers.sif import SifLauncher

    launcher = SifLauncher(tiny_sif.path, witness_dir=_stall_scripts(tmp_path))
    assert launcher.preflight() is None
    where = f"{own_tmp}/{launcher.prefix}-"
    with launcher.session():
        held = _left(where)  # the private directory and its rootfs, the mount point
        assert len(held) == 2 and _mounts(where) == held[1:] == [f"{held[0]}/rootfs"], held
        assert _fstype(held[1]).startswith(MOUNT_KINDS[mount_kind]), _fstype(held[1])
        inv = launcher.invocation("where.py", [], {})
        assert held[1] in inv.argv and "squashfuse" not in " ".join(inv.argv), inv.argv
        devs = []
        for _ in range(2):
            res = launcher.run("where.py", [], {}, deadline_s=60)
            assert res.returncode == 0, res.output
            devs += re.findall(r"root-dev (\d+)", res.output)
        assert len(devs) == 2 and devs[0] == devs[1], "two calls of one run saw different mounts"
        assert _left(f"{own_tmp}/") == held and _left(f"/tmp/{launcher.prefix}-") == [], \
            "a call mounted the SIF again"
        # A timed-out call inside the run is stopped; the run's mount stays until the run ends.
        stalled = launcher.run("stall.py", [], {}, deadline_s=5)
        assert stalled.timed_out and "stalling" in stalled.output, stalled.output
        assert _left(where) == held
    assert _left(where) == [], "the run's mount (or its directory) was left behind"


def test_an_error_inside_the_run_still_unmounts(tiny_sif: BuiltSif, tmp_path: Path, own_tmp: Path):
    from envport.witness.launchers.sif import SifLauncher

    launcher = SifLauncher(tiny_sif.path, witness_dir=_stall_scripts(tmp_path))
    where = f"{own_tmp}/{launcher.prefix}-"
    with pytest.raises(RuntimeError, match="boom"):
        with launcher.session():
            assert len(_mounts(where)) == 1
            raise RuntimeError("boom")
    assert _left(where) == []


def test_weights_and_witness_folder_are_read_only_inside_the_sif(demo_sif: BuiltSif, tmp_path: Path,
                                                                 own_tmp: Path, mount_kind: str):
    from envport.witness.launchers.sif import SifLauncher

    weights = tmp_path / "weights"
    weights.mkdir()
    (weights / "tiny.f32").write_bytes(b"\x01\x02\x03\x04")
    scripts = _stall_scripts(tmp_path)
    launcher = SifLauncher(demo_sif.path, witness_dir=scripts, mounts=[(str(weights), "/weights/tiny")])
    assert launcher.preflight() is None
    # Within a run (one mount) and as a self-contained call (srun's wrapper): both bind read-only.
    with launcher.session():
        in_run = launcher.run("write.py", ["/weights/tiny", "/mnt"], {}, deadline_s=120)
    alone = launcher.run("write.py", ["/weights/tiny", "/mnt"], {}, deadline_s=120)
    for res in (in_run, alone):
        assert res.returncode == 0, res.output
        assert "read /weights/tiny 01020304" in res.output, res.output
        assert "WROTE" not in res.output, res.output
        assert "refused /weights/tiny 30 Read-only file system" in res.output, res.output  # EROFS
        assert "refused /mnt 30 Read-only file system" in res.output, res.output
    assert sorted(p.name for p in weights.iterdir()) == ["tiny.f32"]
    assert not (scripts / "envport-wrote").exists()


def _mount_holder(sif: Path, parent: Path) -> subprocess.Popen:
    code = ("import sys, time\n"
            "from pathlib import Path\n"
            "from envport.sif.gate import gate\n"
            "from envport.sif.run import mounted\n"
            "with mounted(gate(Path(sys.argv[1])), parent=sys.argv[2]) as m:\n"
            "    print(m, flush=True)\n"
            "    time.sleep(600)\n")
    return subprocess.Popen([sys.executable, "-c", code, str(sif), str(parent)], stdout=subprocess.PIPE, text=True)


def test_a_sigkilled_envport_leaves_no_mount(tiny_sif: BuiltSif, tmp_path: Path, mount_kind: str):
    where = f"{tmp_path}/envport-sif-"
    proc = _mount_holder(tiny_sif.path, tmp_path)
    try:
        mnt = proc.stdout.readline().strip()
        assert mnt.startswith(where) and _left(where) == [str(Path(mnt).parent), mnt], (mnt, _left(where))
        assert _fstype(mnt).startswith(MOUNT_KINDS[mount_kind]), _fstype(mnt)
        proc.kill()
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    # The holder dies with its parent: it unmounts (the kernel's mount) or stops squashfuse, which unmounts;
    # then it removes the directory.
    wait_until("unmount after SIGKILL", lambda: _left(where) == [], timeout=30)


def test_sigterm_to_envport_witness_unmounts(demo_sif: BuiltSif, tmpdir_env):
    env, where = tmpdir_env
    proc = subprocess.Popen(
        [sys.executable, "-m", "envport", "-C", str(demo_sif.root), "witness", ENV_NAME, "--target", "apptainer",
         "--only", "collectives", "--no-ledger"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**env, "ENVPORT_WITNESS_FAULT": "hang:1"})
    try:
        wait_until("SIF mount", lambda: _mounts(where), proc)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and "interrupted" in err, (proc.returncode, err[-2000:])
    assert _left(where) == [], "SIGTERM left the SIF mounted"


def test_a_failing_slurm_job_leaves_no_mount(demo_sif: BuiltSif, slurm):
    proc = run_envport("slurm", "submit", ENV_NAME, "--cluster", "local", "--target", "apptainer", "--check",
                       "collectives", "--deadline", "20", "--json", "--no-ledger", root=demo_sif.root,
                       env=sif_env(ENVPORT_WITNESS_FAULT="crash:1"), timeout=600)
    assert proc.returncode == 1, fail_with(proc, "slurm submit with rank 1 crashing")
    prefix = SWEEP.search(Path(json.loads(proc.stdout)["script_path"]).read_text())
    assert prefix and _left(prefix.group(1)) == [], "a failed Slurm job left its SIF mounted"


def test_scancel_in_mid_witness_leaves_no_mount(demo_sif: BuiltSif, slurm):
    proc = subprocess.Popen(
        [sys.executable, "-m", "envport", "-C", str(demo_sif.root), "slurm", "submit", ENV_NAME, "--cluster",
         "local", "--target", "apptainer", "--check", "collectives", "--json", "--no-ledger"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=sif_env(ENVPORT_WITNESS_FAULT="hang:1"))  # rank 1 hangs: the witness stays in the middle
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True)
    reader.start()
    try:
        # Both ranks' tasks have mounted the SIF and the job's log says the dist witness began.
        job = wait_until("the dist witness's start", lambda: begun_job(err), proc)
        prefix = _job_prefix(job)
        wait_until("both ranks' mounts", lambda: len(_mounts(prefix)) >= 2, proc)
        subprocess.run(["scancel", job], check=True, timeout=30)
        stdout, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(timeout=30)
    out = json.loads(stdout)
    assert proc.returncode == 1 and out["state"] == "CANCELLED", (out, "".join(err))
    wait_until("no mount of the cancelled job", lambda: _left(prefix) == [], timeout=60)

"""`envport witness NAME --target apptainer` and `envport slurm submit --target apptainer`: the witness
scripts inside a real SIF (ch-run on the squashfuse-mounted SIF here; apptainer exec where installed),
and nothing mounted afterwards, whether the run passed, failed or timed out.
"""

from __future__ import annotations

import json
from pathlib import Path

from .sif_fixtures import BuiltSif, sif_env
from .support import ENV_NAME, as_json, fail_with, run_envport

pytest_plugins = ["tests.sif_fixtures"]


def _sif_mounts() -> list[str]:
    with open("/proc/self/mountinfo") as fh:
        return [ln.split()[4] for ln in fh if "/envport-sif-" in ln.split()[4]]


def _left_dirs() -> list[Path]:
    return sorted(Path("/tmp").glob("envport-sif-*-*"))


def test_every_witness_passes_inside_the_sif(demo_sif: BuiltSif):
    before = (_sif_mounts(), _left_dirs())
    proc = run_envport("witness", ENV_NAME, "--target", "apptainer", "--json", "--no-ledger", root=demo_sif.root,
                       env=sif_env(), timeout=900)
    assert proc.returncode == 0, fail_with(proc, "witness --target apptainer")
    out = as_json(proc)
    steps = {s["step"]: s["verdict"] for s in out["steps"]}
    for name in ("python", "import torch", "kernel", "collectives (world 2)", "dtensor (mesh 2x2)"):
        assert steps.get(name) == "OK", steps
    assert any(s.startswith("cli ") for s in steps) and set(steps.values()) == {"OK"}, steps
    assert out["launcher"].endswith(demo_sif.path.name)
    assert (_sif_mounts(), _left_dirs()) == before, "a SIF mount (or its directory) was left behind"


def test_a_failing_witness_leaves_no_mount(demo_sif: BuiltSif):
    before = (_sif_mounts(), _left_dirs())
    proc = run_envport("witness", ENV_NAME, "--target", "apptainer", "--only", "collectives", "--deadline", "10",
                       "--json", "--no-ledger", root=demo_sif.root, env=sif_env(ENVPORT_WITNESS_FAULT="crash:1"),
                       timeout=300)
    assert proc.returncode == 1, fail_with(proc, "witness with rank 1 crashing")
    assert (_sif_mounts(), _left_dirs()) == before, "a failed witness left its SIF mounted"


def test_a_timed_out_call_is_stopped_and_unmounted(tiny_sif: BuiltSif, tmp_path: Path):
    from envport.witness.launchers.sif import SifLauncher

    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "stall.py").write_text("import time\nprint('stalling', flush=True)\ntime.sleep(600)\n")
    launcher = SifLauncher(tiny_sif.path, witness_dir=scripts)
    assert launcher.preflight() is None
    before = (_sif_mounts(), _left_dirs())
    result = launcher.run("stall.py", [], {}, deadline_s=15)
    assert result.timed_out and "stalling" in result.output, result.output
    assert (_sif_mounts(), _left_dirs()) == before, "the timed-out call left its SIF mounted"


def test_collectives_as_two_slurm_tasks_with_the_sif_launcher(demo_sif: BuiltSif, slurm):
    before = (_sif_mounts(), _left_dirs())
    proc = run_envport("slurm", "submit", ENV_NAME, "--cluster", "local", "--target", "apptainer", "--check",
                       "collectives", "--json", "--no-ledger", root=demo_sif.root, env=sif_env(), timeout=600)
    assert proc.returncode == 0, fail_with(proc, "slurm submit --target apptainer")
    out = json.loads(proc.stdout)
    steps = {s["step"]: s for s in out["steps"]}
    assert steps["collectives (world 2)"]["verdict"] == "OK", out["steps"]
    script = Path(out["script_path"]).read_text() if Path(out["script_path"]).exists() else ""
    assert not script or "ch-run" in script or "apptainer" in script
    assert (_sif_mounts(), _left_dirs()) == before, "a Slurm task left its SIF mounted"


def test_missing_sif_is_refused(sif_project: Path):
    from .support import write_spec

    write_spec(sif_project, "tiny-nosif")
    proc = run_envport("witness", "tiny-nosif", "--target", "apptainer", "--json", "--no-ledger", root=sif_project,
                       env=sif_env(), timeout=120)
    assert proc.returncode == 3, fail_with(proc, "witness without a SIF")
    assert "sif_missing" in proc.stdout and "envport build tiny-nosif --target apptainer" in proc.stdout

"""launchers/srun.py: Slurm tasks as torch ranks, around the venv (local) and docker launchers.

Units check the argv and the per-task wrapper; the rest runs real `srun` on
the one-node cluster (2 CPUs) with demo-cpu as a venv and as an image.
"""

from __future__ import annotations

import subprocess

import pytest

from envport.witness.launchers.docker import DockerLauncher

from envport.witness.launchers.local import LocalLauncher
from envport.witness.launchers.srun import SrunLauncher, venv_prelude, world_of
from envport.spec.loader import load_spec
from envport.witness.plan import WitnessOptions
from envport.witness.run import run_witnesses

from .support import ENV_NAME


def test_world_comes_from_the_dist_witness_only():
    assert world_of("dist.py", ["--checks", "collectives", "--world-size", "4"]) == 4
    assert world_of("dist.py", ["--world-size=3"]) == 3
    assert world_of("basic.py", ["--world-size", "4"]) == 1
    assert world_of("kernel.py", []) == 1


def test_wrapper_maps_slurm_identity_to_torch():
    launcher = SrunLauncher(LocalLauncher("/env/bin/python"), ENV_NAME, in_allocation=True,
                            prelude=venv_prelude("/env"))
    argv = launcher.command("dist.py", ["--world-size", "2", "--launch", "external"], {"A": "x y"})
    assert argv[:4] == ["srun", "--ntasks=2", "--wait=60", "--kill-on-bad-exit=1"]
    i = argv.index("-c")
    wrapper = argv[i + 1]
    assert 'RANK="$SLURM_PROCID"' in wrapper and 'LOCAL_RANK="$SLURM_LOCALID"' in wrapper
    assert 'WORLD_SIZE="$SLURM_NTASKS"' in wrapper and "scontrol show hostnames" in wrapper
    assert ". /env/.envport/env.sh" in wrapper and "export A='x y'" in wrapper
    assert argv[i + 2:] == ["envport-task", "/env/bin/python", launcher.witness_path("dist.py"),
                            "--world-size", "2", "--launch", "external"]
    assert not launcher.spawns_ranks


def test_outside_an_allocation_srun_starts_a_named_job_and_overcommits_when_needed():
    launcher = SrunLauncher(LocalLauncher("/env/bin/python"), ENV_NAME, in_allocation=False,
                            job_options=["--time=5"])
    launcher._node_cpus = 2  # as sinfo says for this node
    opts = launcher.srun_options(4)
    assert "--overcommit" in opts and f"--job-name={launcher.job_name}" in opts and "--time=5" in opts
    assert "--overcommit" not in launcher.srun_options(2)
    inv = launcher.invocation("dist.py", ["--world-size", "2"], {})
    assert inv.env["MASTER_PORT"].isdigit()  # one port per job, chosen before the tasks start
    assert ["scancel", f"--name={launcher.job_name}"] in inv.cleanup


def test_docker_ranks_get_a_container_named_by_job_and_rank():
    inner = DockerLauncher("envport/demo-cpu:latest", witness_dir="/job/witnesses")
    launcher = SrunLauncher(inner, ENV_NAME, in_allocation=True, run_token="tok")
    argv = launcher.command("dist.py", ["--world-size", "2"], {"PYTHONUNBUFFERED": "1"})
    wrapper = argv[argv.index("-c") + 1]
    assert 'name="$1-${SLURM_JOB_ID}-${SLURM_PROCID}"' in wrapper
    assert '--label "envport.slurm-job=${SLURM_JOB_ID}"' in wrapper
    assert "-e RANK -e LOCAL_RANK -e WORLD_SIZE -e NODE_RANK -e SLURMD_NODENAME -e MASTER_ADDR -e MASTER_PORT" in wrapper
    assert "rm -f \"$name\"" in wrapper  # TERM from scancel removes this rank's container
    tail = argv[argv.index("envport-task") + 1:]
    assert tail[:2] == [f"envport-{ENV_NAME}", "docker"]
    assert "--name" not in tail and "envport.run=tok" in tail
    assert tail[-5:] == ["envport/demo-cpu:latest", "python3", "/opt/envport/witnesses/dist.py", "--world-size", "2"]


@pytest.mark.slurm
def test_more_tasks_than_the_node_has_cpus_start(slurm):
    """srun -n N on fewer than N CPUs pends forever without --overcommit; the launcher adds it.
    N is the node's CPUs + 2, so this runs on any node size."""
    world = slurm.cpus + 2
    launcher = SrunLauncher(LocalLauncher("/bin/echo"), ENV_NAME, in_allocation=False)
    result = launcher.run("dist.py", ["--world-size", str(world)], {}, deadline_s=60)
    assert result.returncode == 0 and not result.timed_out, result.output
    ranks = sorted(ln for ln in result.lines if "dist.py" in ln)
    assert len(ranks) == world, result.output


@pytest.mark.slurm
def test_collectives_as_two_slurm_tasks_in_the_venv(slurm, local_venv):
    spec = load_spec(ENV_NAME, local_venv.root).spec
    launcher = SrunLauncher(LocalLauncher(local_venv.python), ENV_NAME, in_allocation=False,
                            prelude=venv_prelude(local_venv.prefix))
    results = run_witnesses(spec, launcher, WitnessOptions(only=["collectives"], deadline_s=120))
    assert [(r.step, r.verdict.value) for r in results] == [("collectives (world 2)", "OK")], \
        [r.line() for r in results] + [ln for r in results for ln in r.lines]
    assert "2 ranks on gloo/cpu" in results[0].detail


@pytest.mark.slurm
@pytest.mark.docker
def test_collectives_as_two_slurm_tasks_with_docker_run(slurm, demo_image, session_project):
    spec = load_spec(ENV_NAME, session_project).spec
    launcher = SrunLauncher(DockerLauncher(demo_image.tag), ENV_NAME, in_allocation=False)
    results = run_witnesses(spec, launcher, WitnessOptions(only=["collectives"], deadline_s=120))
    assert [(r.step, r.verdict.value) for r in results] == [("collectives (world 2)", "OK")], \
        [r.line() for r in results] + [ln for r in results for ln in r.lines]
    left = subprocess.run(["docker", "ps", "-aq", "--filter", f"label=envport.run={launcher.token}"],
                          capture_output=True, text=True, timeout=30)
    assert left.stdout.strip() == "", "rank containers left behind"

"""`envport slurm submit`: cluster profiles, the sbatch template, and real jobs on the one-node cluster.

Faults, each on the real cluster: a job whose command fails (FAILED, log tail,
Slurm's ExitCode); a job Slurm keeps PENDING (a task wider than the node:
Reason=PartitionConfig, measured) cancelled after max_pending and REFUSED with
that Reason; a request sbatch rejects outright (REFUSED); scancel in the middle
of a docker witness leaves no container.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from envport.engines.slurm import sacct_job
from envport.plan.cluster import cluster_names, load_cluster, slurm_time_seconds
from envport.core.errors import SpecError

from .support import ENV_NAME, begun_job, cli_env, copy_tracked, fail_with, run_envport


def write_profile(root: Path, name: str, cache_dir: Path, **fields) -> str:
    data = {"name": name, "partition": "debug", "time": "00:05:00", "container_runtime": "docker",
            "cache_dir": str(cache_dir), "max_pending": "60s"}
    data.update(fields)
    path = root / "slurm" / "clusters" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return name


@pytest.fixture(scope="module")
def jobs_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("slurm-jobs")


def submit(root: Path, *args: str, env: dict | None = None, timeout: float = 300) -> tuple[int, dict, str]:
    proc = run_envport("slurm", "submit", ENV_NAME, *args, "--json", root=root, env=env or cli_env(),
                       timeout=timeout)
    try:
        out = json.loads(proc.stdout)
    except ValueError:
        raise AssertionError(fail_with(proc, "envport slurm submit")) from None
    return proc.returncode, out, proc.stderr


# --- profiles and the template ------------------------------------------------------------


def test_shipped_profiles_validate():
    names = cluster_names(None)
    assert {"local", "example-gpu"} <= set(names)
    local = load_cluster("local", None)
    assert local.partition == "debug" and local.container_runtime == "docker" and local.max_pending == 120
    gpu = load_cluster("example-gpu", None)
    assert gpu.gres == "gpu:4" and gpu.time_s == 3600


def test_clusters_command_lists_project_and_shipped_profiles(session_project, jobs_dir):
    write_profile(session_project, "t-listed", jobs_dir)
    proc = run_envport("slurm", "clusters", "--json", root=session_project, env=cli_env(), timeout=300)
    assert proc.returncode == 0, fail_with(proc, "slurm clusters")
    names = {p["name"] for p in json.loads(proc.stdout)["clusters"]}
    assert {"local", "example-gpu", "t-listed"} <= names


def test_a_typo_in_a_profile_is_an_error_with_file_and_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: bad\npartition: debug\npartitoin: gpu\ntime: soon\nmax_pending: forever\n")
    with pytest.raises(SpecError) as exc:
        load_cluster(str(path), None)
    text = str(exc.value)
    assert f"{path}:3: partitoin" in text  # unknown key, named with its line
    assert "time" in text and "not a Slurm time" in text
    assert "max_pending" in text and "not a duration" in text


@pytest.mark.parametrize("value,seconds", [("10", 600), ("1:30", 90), ("01:00:00", 3600), ("1-00", 86400),
                                           ("2-03:04:05", 2 * 86400 + 3 * 3600 + 4 * 60 + 5)])
def test_slurm_time_formats(value, seconds):
    assert slurm_time_seconds(value) == seconds


def test_dry_run_prints_a_script_bash_accepts_with_every_value_quoted(session_project, tmp_path):
    odd = tmp_path / "jobs with space$HOME"
    name = write_profile(session_project, "odd-dry", odd, activation=["echo activating"], account="proj-1")
    proc = run_envport("slurm", "submit", ENV_NAME, "--cluster", name, "--target", "docker", "--check",
                       "collectives", "--world-size", "4", "--dry-run", root=session_project, env=cli_env(),
                       timeout=300)
    assert proc.returncode == 0, fail_with(proc, "dry-run")
    script = proc.stdout
    assert script.startswith("#!/bin/bash\n")
    assert "#SBATCH --job-name=envport-demo-cpu" in script and "#SBATCH --account=proj-1" in script
    assert "#SBATCH --ntasks=4" in script
    assert f"'{odd}" in script  # the odd folder is single-quoted wherever it appears
    assert "srun --ntasks=4 --wait=60 --kill-on-bad-exit=1" in script
    assert 'name="$1-${SLURM_JOB_ID}-${SLURM_PROCID}"' in script
    assert not odd.exists(), "a dry run creates nothing"
    check = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    shellcheck = shutil.which("shellcheck")
    if shellcheck:
        sc = subprocess.run([shellcheck, "-s", "bash", "-S", "warning", "-"], input=script, capture_output=True,
                            text=True)
        assert sc.returncode == 0, sc.stdout


def test_the_wheel_carries_the_slurm_folder(tmp_path):
    """slurm/ stays top-level in the checkout; `pip install .` must still ship it (envport.slurm_files).
    Built from a copy of the tracked files, so build/ and *.egg-info land there, not in the checkout;
    a failed build is a failure: a wheel that cannot be built ships nothing."""
    src = copy_tracked(tmp_path / "src")
    out = tmp_path / "wheels"
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
                           "-w", str(out), str(src)], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, fail_with(proc, "pip wheel")
    import zipfile

    wheel = next(out.glob("envport-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for member in ("envport/slurm_files/__init__.py", "envport/slurm_files/witness.sbatch.j2",
                   "envport/slurm_files/clusters/local.yaml", "envport/witness/slurm_job.py",
                   "envport/engines/slurm.py", "envport/plan/cluster.py", "envport/builders/apptainer/sif_job.py",
                   "envport/witness/launchers/srun.py", "envport/witness/launchers/ssh.py", "envport/verify/backends.py"):
        assert member in names, member


# --- real jobs ---------------------------------------------------------------------------


@pytest.mark.slurm
def test_collectives_pass_as_two_tasks_with_the_venv(slurm, local_venv, jobs_dir):
    root = local_venv.root
    name = write_profile(root, "t-venv", jobs_dir)
    code, out, err = submit(root, "--cluster", name, "--target", "venv", "--check", "collectives",
                            env=cli_env(ENVPORT_ENVS_DIR=local_venv.envs_dir))
    assert code == 0, (out, err)
    steps = {s["step"]: s for s in out["steps"]}
    assert steps["collectives (world 2)"]["verdict"] == "OK", steps
    job = steps[f"slurm job {out['job_id']}"]
    assert job["verdict"] == "OK" and "JobState=COMPLETED ExitCode=0:0" in job["detail"]
    assert out["state"] == "COMPLETED" and out["slurm_exit_code"] == "0:0"
    assert f"slurm: job {out['job_id']}: begin dist world 2" in err  # progress lines from the log
    log = Path(out["log"]).read_text()
    assert "master " in log and "ENVPORT-WITNESS" in log
    assert not (Path(out["job_dir"]) / "witnesses").exists(), "the job removes its copy of the witnesses"
    # Without a database, the job-completion file still has it (what envport reads once scontrol forgets).
    assert sacct_job(out["job_id"]) == {"JobState": "COMPLETED", "ExitCode": "0:0"}
    from envport.report import ledger as envport_ledger
    ledger = envport_ledger.read(root, ENV_NAME)  # this user's state dir, not the checkout
    rec = next(r for r in reversed(ledger) if r["kind"] == "witness" and r.get("slurm"))
    assert rec["verdict"] == "OK" and rec["slurm"]["job_id"] == out["job_id"]


@pytest.mark.slurm
@pytest.mark.docker
def test_collectives_pass_as_two_tasks_with_docker_run(slurm, demo_image, session_project, jobs_dir):
    name = write_profile(session_project, "t-docker", jobs_dir)
    code, out, err = submit(session_project, "--cluster", name, "--target", "docker", "--image", demo_image.tag,
                            "--check", "collectives")
    assert code == 0, (out, err)
    steps = {s["step"]: s["verdict"] for s in out["steps"]}
    assert steps["collectives (world 2)"] == "OK" and out["state"] == "COMPLETED", out
    left = subprocess.run(["docker", "ps", "-aq", "--filter", f"label=envport.slurm-job={out['job_id']}"],
                          capture_output=True, text=True, timeout=30)
    assert left.stdout.strip() == ""


@pytest.mark.slurm
def test_a_failing_job_is_failed_with_its_log_tail_and_exit_code(slurm, session_project, jobs_dir):
    name = write_profile(session_project, "t-fails", jobs_dir,
                         activation=["echo activating on $(hostname)", "echo module not found >&2", "exit 7"])
    code, out, _ = submit(session_project, "--cluster", name, "--target", "venv", "--check", "collectives",
                          "--prefix", "/nonexistent")
    assert code == 1, out
    assert out["verdict"] == "FAILED" and out["state"] == "FAILED" and out["slurm_exit_code"] == "7:0"
    job = out["steps"][-1]
    assert job["verdict"] == "FAILED" and "ExitCode=7:0" in job["detail"]
    assert "activating on" in "\n".join(job["lines"]) and "module not found" in "\n".join(job["lines"])
    assert out["steps"][0]["detail"].startswith("not run: the job ended (JobState=FAILED ExitCode=7:0)")


@pytest.mark.slurm
def test_a_job_that_cannot_start_is_cancelled_after_max_pending(slurm, session_project, jobs_dir):
    # One task wider than the node: Slurm accepts it and keeps it PENDING (Reason=PartitionConfig).
    name = write_profile(session_project, "t-pends", jobs_dir, cpus=slurm.cpus * 32, max_pending="3s")
    # How soon after max_pending it gives up is measured by bench/bench_refusals.py, not asserted here.
    code, out, err = submit(session_project, "--cluster", name, "--target", "venv", "--check", "python")
    assert code == 3, (out, err)
    step = out["steps"][0]
    assert step["verdict"] == "REFUSED" and step["reason"] == "pending_timeout", step
    assert "Reason=PartitionConfig" in step["detail"] and "max_pending 3s" in step["detail"]
    gone = subprocess.run(["squeue", "-h", "-j", out["job_id"]], capture_output=True, text=True, timeout=30)
    assert gone.stdout.strip() == "", "the pending job was not cancelled"


@pytest.mark.slurm
def test_a_request_sbatch_rejects_is_refused(slurm, session_project, jobs_dir):
    name = write_profile(session_project, "t-rejected", jobs_dir, mem="100000000")  # 100 TB
    code, out, _ = submit(session_project, "--cluster", name, "--target", "venv", "--check", "python")
    assert code == 3, out
    step = out["steps"][0]
    assert step["reason"] == "sbatch_rejected" and "Requested node configuration is not available" in step["detail"]


def _job_containers(job: str, *status: str) -> list[str]:
    argv = ["docker", "ps", "-a", "--filter", f"label=envport.slurm-job={job}", "--format", "{{.Names}}"]
    for st in status:
        argv += ["--filter", f"status={st}"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout.split()




def test_scancel_in_mid_witness_leaves_no_container(slurm, demo_image, session_project, jobs_dir):
    name = write_profile(session_project, "t-cancel", jobs_dir)
    proc = subprocess.Popen(
        [sys.executable, "-m", "envport", "-C", str(session_project), "slurm", "submit", ENV_NAME, "--cluster", name,
         "--target", "docker", "--image", demo_image.tag, "--check", "collectives", "--json", "--no-ledger"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=cli_env(ENVPORT_WITNESS_FAULT="hang:1"))  # rank 1 hangs: the witness stays in the middle
    err: list[str] = []

    def read_progress() -> None:
        for line in proc.stderr:
            err.append(line)

    reader = threading.Thread(target=read_progress, daemon=True)
    reader.start()
    try:
        # In the middle of the witness: the job's log says the dist witness began, and both rank
        # containers run. Polled, with a bound; never a fixed sleep.
        deadline = time.monotonic() + 180
        job = ""
        while not job or len(_job_containers(job, "running")) < 2:
            assert proc.poll() is None, f"submit ended before the witness was cancelled:\n{''.join(err)}"
            assert time.monotonic() < deadline, f"the witness never got going in 180s:\n{''.join(err)}"
            job = begun_job(err)
            time.sleep(0.5)
        assert set(_job_containers(job)) >= {f"envport-{ENV_NAME}-{job}-0", f"envport-{ENV_NAME}-{job}-1"}
        subprocess.run(["scancel", job], check=True, timeout=30)
        proc.wait(timeout=120)
        stdout = proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(timeout=30)
    out = json.loads(stdout)
    assert proc.returncode == 1 and out["state"] == "CANCELLED", (out, "".join(err))
    assert "the job ended (CANCELLED) while this witness ran" in out["steps"][0]["detail"]
    end = time.monotonic() + 30
    while (left := _job_containers(job)) and time.monotonic() < end:
        time.sleep(0.5)
    assert left == [], f"containers of the cancelled job are still there: {left}"

"""`envport slurm submit --nodes 2 --ntasks-per-node 2` on the two-node cluster (.ci/services/slurm-multi.sh).

Each slurmd runs in its own network namespace (node1 10.77.0.11, node2 10.77.0.12, the host's
bridge 10.77.0.1), so the venv ranks' gloo traffic between the nodes crosses namespaces over
TCP. Docker containers (`--network host`) all land in dockerd's namespace, the host's: there the
test proves the rank layout over two Slurm nodes and the cleanup, not a network boundary
(docs/infra.md, "A multi-node Slurm"). The node-failure test kills one node's slurmd mid-job.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from .services import SlurmMulti, run_service_script
from .support import ENV_NAME, cli_env, fail_with, run_envport

LAYOUT = ("--nodes", "2", "--ntasks-per-node", "2")
# Rank -> (node, NODE_RANK, LOCAL_RANK) for 2 nodes x 2 tasks (Slurm's default block distribution).
EXPECTED = {"0": ("node1", 0, 0), "1": ("node1", 0, 1), "2": ("node2", 1, 0), "3": ("node2", 1, 1)}


def submit(multi: SlurmMulti, root: Path, *args: str, env: dict | None = None) -> tuple[int, dict, str]:
    proc = run_envport("slurm", "submit", ENV_NAME, "--cluster", "multi", *LAYOUT, "--check", "collectives,dtensor",
                       *args, "--json", "--no-ledger", root=root, env=env or cli_env(), timeout=600)
    try:
        out = json.loads(proc.stdout)
    except ValueError:
        raise AssertionError(fail_with(proc, "envport slurm submit --cluster multi")) from None
    return proc.returncode, out, proc.stderr


def assert_across_nodes(out: dict, err: str, master: str) -> None:
    steps = {s["step"]: s for s in out["steps"]}
    for step in ("collectives (world 4)", "dtensor (mesh 2x2)"):
        assert steps[step]["verdict"] == "OK", (steps[step], err)
        ranks = steps[step]["data"]["ranks"]
        got = {r: (v["node"], v["node_rank"], v["local_rank"]) for r, v in ranks.items()}
        assert got == EXPECTED, got
        assert "node1 (node rank 0): ranks 0,1, node2 (node rank 1): ranks 2,3" in steps[step]["detail"]
    assert out["state"] == "COMPLETED" and out["nodes"] == "node[1-2]", out
    log = Path(out["log"]).read_text()
    assert f"master {master}:" in log, log[:2000]


def test_the_multi_profile_script_spreads_the_ranks_and_finds_the_master(session_project):
    """--dry-run, no cluster needed: the layout directives, the profile's slurm.conf and task env, MASTER_ADDR."""
    root = session_project
    for target, master in (("venv", 'MASTER_ADDR=$(master_addr "$SLURM_JOB_NODELIST")'),
                           ("docker", "MASTER_ADDR=10.77.0.1")):
        proc = run_envport("slurm", "submit", ENV_NAME, "--cluster", "multi", "--target", target, *LAYOUT,
                           "--check", "collectives,dtensor", "--dry-run", root=root, env=cli_env(), timeout=300)
        assert proc.returncode == 0, fail_with(proc, f"dry-run {target}")
        script = proc.stdout
        for line in ("#SBATCH --ntasks=4", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=2",
                     "export SLURM_CONF=/etc/slurm-multi/slurm.conf", master, "NODE_RANK=\"$SLURM_NODEID\"",
                     "GLOO_SOCKET_IFNAME=envport0"):
            assert line in script, (target, line)
        assert script.count("srun --ntasks=4 ") == 1  # collectives and dtensor share one world-4 step
        check = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True)
        assert check.returncode == 0, check.stderr


def test_a_witness_wider_than_the_layout_is_a_usage_error(session_project):
    root = session_project
    proc = run_envport("slurm", "submit", ENV_NAME, "--cluster", "multi", "--target", "venv", "--nodes", "1",
                       "--ntasks-per-node", "2", "--check", "dtensor", "--dry-run", root=root, env=cli_env(),
                       timeout=300)
    assert proc.returncode == 2, fail_with(proc, "a 2x2 mesh on 1x2 tasks")
    assert "needs 4 ranks; --nodes 1 --ntasks-per-node 2 give 2" in proc.stderr


def test_each_node_is_its_own_network_namespace(slurm_multi):
    """One task a node: each sees its own network namespace and only its own address on envport0."""
    proc = subprocess.run(["srun", "--nodes=2", "--ntasks-per-node=1", "bash", "-c",
                           'echo "$SLURMD_NODENAME $(readlink /proc/self/ns/net) '
                           '$(ip -4 -o addr show dev envport0 | awk \'{print $4}\')"'],
                          capture_output=True, text=True, timeout=120, env=slurm_multi.env())
    assert proc.returncode == 0, proc.stderr
    rows = {ln.split()[0]: ln.split()[1:] for ln in proc.stdout.splitlines()}
    assert rows["node1"][1] == "10.77.0.11/24" and rows["node2"][1] == "10.77.0.12/24", rows
    here = os.readlink("/proc/self/ns/net")
    assert len({rows["node1"][0], rows["node2"][0], here}) == 3, (rows, here)


@pytest.mark.slow
def test_collectives_and_dtensor_across_two_nodes_with_the_venv(slurm_multi, local_venv):
    code, out, err = submit(slurm_multi, local_venv.root, "--target", "venv",
                            env=cli_env(ENVPORT_ENVS_DIR=local_venv.envs_dir))
    assert code == 0, (out, err)
    # MASTER_ADDR: the first node of the allocation, node1, whose name does not resolve: its NodeAddr.
    assert_across_nodes(out, err, "10.77.0.11")


@pytest.mark.slow
def test_collectives_and_dtensor_across_two_nodes_with_docker(slurm_multi, demo_image):
    code, out, err = submit(slurm_multi, demo_image.root, "--target", "docker", "--image", demo_image.tag)
    assert code == 0, (out, err)
    # The containers share dockerd's (the host's) network: the profile's docker_master_addr, the bridge.
    assert_across_nodes(out, err, "10.77.0.1")
    assert _job_containers(out["job_id"]) == []


def _job_containers(job: str) -> list[str]:
    argv = ["docker", "ps", "-a", "--filter", f"label=envport.slurm-job={job}", "--format", "{{.Names}}"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout.split()


def _job_state(multi: SlurmMulti, job: str) -> str:
    out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True, timeout=30,
                         env=multi.env()).stdout.strip()
    return out


@pytest.mark.slow
def test_a_node_that_dies_mid_job_fails_it_with_slurms_reason_and_leaves_no_container(slurm_multi, demo_image):
    # This test changes host state: it kills node2's slurmd (started by .ci/services/slurm-multi.sh, found by its
    # pid file) and, whatever happens, runs slurm-multi.sh again, which restarts it and waits until node2 is idle
    # (resuming it from DOWN), so later tests still have the cluster.
    pid_file = slurm_multi.slurmd_pid_file("node2")
    pid = int(pid_file.read_text().strip())
    assert Path(f"/proc/{pid}/comm").read_text().strip() == "slurmd", f"{pid_file} does not name a running slurmd"
    proc = subprocess.Popen(
        [sys.executable, "-m", "envport", "-C", str(demo_image.root), "slurm", "submit", ENV_NAME,
         "--cluster", "multi", *LAYOUT, "--check", "collectives", "--target", "docker", "--image", demo_image.tag,
         "--json", "--no-ledger"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=cli_env(ENVPORT_WITNESS_FAULT="hang:3"))  # rank 3 (node2) hangs: the job stays mid-witness
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True)
    reader.start()
    job = ""
    try:
        # Mid-job: the witness began and all four rank containers run. Polled, with a bound.
        deadline = time.monotonic() + 240
        while not job or len(_job_containers(job)) < 4:
            assert proc.poll() is None, f"submit ended before the node was killed:\n{''.join(err)}"
            assert time.monotonic() < deadline, f"the witness never got going in 240s:\n{''.join(err)}"
            job = next((ln.split()[2].rstrip(":") for ln in list(err)
                        if ln.startswith("slurm: job ") and ": begin dist world 4" in ln), "")
            time.sleep(0.5)
        os.kill(pid, signal.SIGKILL)
        proc.wait(timeout=240)  # SlurmdTimeout=10 s: node2 goes DOWN and the job ends NODE_FAIL
        stdout = proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
        ok, started = run_service_script("slurm-multi.sh")
        assert ok, f"slurm-multi.sh could not bring node2 back:\n{started}"
    reader.join(timeout=30)
    out = json.loads(stdout)
    assert proc.returncode == 1 and out["verdict"] == "FAILED", (out, "".join(err))
    assert out["state"] == "NODE_FAIL", out
    job_step = out["steps"][-1]
    assert job_step["step"] == f"slurm job {job}" and "JobState=NODE_FAIL" in job_step["detail"], job_step
    assert "a node of the job failed" in job_step["detail"] and "node2" in job_step["detail"], job_step
    assert out["steps"][0]["verdict"] == "FAILED"
    assert "the job ended (NODE_FAIL) while this witness ran" in out["steps"][0]["detail"]
    # Nothing left: no container of the job (node1's cleanup removes node2's too: one dockerd), and
    # the job's copy of the witnesses is gone. Bounded poll: removal finishes after the job ends.
    end = time.monotonic() + 60
    while (left := _job_containers(job)) and time.monotonic() < end:
        time.sleep(0.5)
    assert left == [], f"containers of the failed job are still there: {left}"
    assert not (Path(out["job_dir"]) / "witnesses").exists()
    assert _job_state(slurm_multi, job) == ""

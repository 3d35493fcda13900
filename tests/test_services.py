"""The real services the integration tests rely on are up and usable.

Each test skips, with the fixture's reason, when its service is absent; in CI
(ENVPORT_REQUIRE_SERVICES=1, tests/README.md) it fails instead.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from .support import missing

PY_VERSION = re.compile(r"^Python 3\.\d+\.\d+$")


def _run(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


# --- docker ------------------------------------------------------------------


@pytest.mark.docker
def test_sdk_runs_base_image_with_host_network(docker_client, base_image):
    out = docker_client.containers.run(
        base_image, ["python3", "--version"], network_mode="host", remove=True
    )
    assert PY_VERSION.match(out.decode().strip()), out


# Two clients live here: the image's 28.x (no buildx) and Debian's 20.10
# (BuildKit). Builders may use either, so both must reach the same engine.
DOCKER_CLIENTS = {"PATH-docker": lambda: shutil.which("docker"),
                  "debian-docker": lambda: shutil.which("/usr/bin/docker")}


@pytest.mark.docker
@pytest.mark.parametrize("which", sorted(DOCKER_CLIENTS))
def test_cli_runs_base_image_on_the_sdk_engine(docker_client, base_image, which):
    client = DOCKER_CLIENTS[which]()
    if client is None:
        missing(f"{which}: no such docker client (apt-get install docker.io)")
    proc = _run([client, "run", "--rm", "--network", "host", base_image, "python3", "--version"], timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert PY_VERSION.match(proc.stdout.strip()), proc.stdout

    inspect = _run([client, "image", "inspect", "--format", "{{.Id}}", base_image], timeout=30)
    assert inspect.stdout.strip() == docker_client.images.get(base_image).id


# --- slurm -------------------------------------------------------------------


@pytest.mark.slurm
def test_srun_two_tasks(slurm):
    # A task count above the node's CPUs pends forever instead of failing.
    overcommit = ["--overcommit"] if slurm.cpus < 2 else []
    proc = _run(["timeout", "60", "srun", "-n", "2", *overcommit, "hostname"], timeout=90)
    assert proc.returncode == 0, f"srun exited {proc.returncode}: {proc.stderr}"
    names = [line.split(".")[0] for line in proc.stdout.split()]
    assert names == [slurm.name, slurm.name]


@pytest.mark.slurm
def test_sbatch_exit_code_reaches_sacct(slurm, tmp_path):
    # No accounting database here: sacct -c reads the jobcomp/filetxt file.
    proc = _run(
        ["timeout", "120", "sbatch", "--parsable", "--wait", "-o", str(tmp_path / "out"), "--wrap", "exit 3"],
        timeout=150,
    )
    assert proc.returncode == 3, f"sbatch --wait exited {proc.returncode}: {proc.stderr}"
    job_id = proc.stdout.strip().split(";")[0]
    acct = _run(["sacct", "-c", "-j", job_id, "-n", "-P", "-o", "JobID,State,ExitCode"], timeout=30)
    assert acct.returncode == 0, acct.stderr
    assert f"{job_id}|FAILED|3:0" in acct.stdout.splitlines(), acct.stdout


# --- ssh ---------------------------------------------------------------------


@pytest.mark.ssh
def test_ssh_runs_a_command(ssh_host):
    proc = _run(ssh_host.argv("echo ok"), timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "ok\n"


@pytest.mark.ssh
def test_testinfra_reaches_ssh_host(ssh_host):
    import testinfra  # the [build] extra: its absence is an error, not a skip
    host = testinfra.get_host(ssh_host.url, **ssh_host.testinfra_kwargs)
    assert host.run("echo ok").stdout == "ok\n"
    assert host.user().name == "root"

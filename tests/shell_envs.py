"""Session fixtures for the SSH, Slurm, srun and parity tests: demo-cpu built for real, once.

Import the fixtures a test module uses (`from tests.shell_envs import local_venv  # noqa: F401`).

- ``shell_project``: a throwaway copy of specs/, images/, docs/ and sites/ (the
  site's `test` host and wheelhouse settings decide the docker image's hash), so
  ledgers written by the tests never touch the checkout.
- ``local_venv``: demo-cpu as a venv on this host, in LOCAL_ENVS_DIR.
- ``ssh_venv``: demo-cpu as a venv built over SSH on the site host `test`, in
  SSH_ENVS_DIR: a different folder, so it is really built a second time.
- ``demo_image``: the docker image envport/demo-cpu:<hash12>, from the docker
  builder (`envport build demo-cpu --target docker`) when absent.

The env folders live outside the checkout under /var/tmp and are kept between
sessions: a build whose hash matches reports `present` in about a second.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from .conftest import REPO

LOCAL_ENVS_DIR = os.environ.get("ENVPORT_TEST_ENVS_DIR", "/var/tmp/envport-test-envs")
SSH_ENVS_DIR = os.environ.get("ENVPORT_TEST_SSH_ENVS_DIR", "/var/tmp/envport-ssh-envs")
BUILD_TIMEOUT = 900
ENV_NAME = "demo-cpu"


def copy_project(dest: Path) -> Path:
    for d in ("specs", "images", "docs", "sites"):
        if (REPO / d).is_dir():
            shutil.copytree(REPO / d, dest / d)
    return dest


def cli_env(**extra: str) -> dict:
    """This process's environment with the test env folders (local and over SSH)."""
    env = dict(os.environ)
    env.update(ENVPORT_ENVS_DIR=LOCAL_ENVS_DIR, ENVPORT_SSH_ENVS_DIR=SSH_ENVS_DIR)
    env.pop("ENVPORT_WITNESS_FAULT", None)
    env.update(extra)
    return env


def envport(*args: str, root: Path, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """The real CLI in a subprocess, on the project copy."""
    return subprocess.run([sys.executable, "-m", "envport", "-C", str(root), *args], cwd=root,
                          capture_output=True, text=True, timeout=timeout, env=env or cli_env())


def fail_with(proc: subprocess.CompletedProcess, what: str) -> str:
    return f"{what} exited {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"


@dataclass(frozen=True)
class BuiltVenv:
    root: Path  # the project copy it was built from
    prefix: str  # the env folder (on this host, or on the SSH host)
    envs_dir: str
    host: str | None = None

    @property
    def python(self) -> str:
        return f"{self.prefix}/bin/python"


@pytest.fixture(scope="session")
def shell_project(tmp_path_factory) -> Path:
    return copy_project(tmp_path_factory.mktemp("shell-project"))


@pytest.fixture(scope="session")
def local_venv(shell_project) -> BuiltVenv:
    """demo-cpu built (or present) as a venv here: torch==2.13.0 from the local wheel, ~30 s cold."""
    proc = envport("build", ENV_NAME, "--target", "venv", root=shell_project,
                   env=cli_env(ENVPORT_ENVS_DIR=LOCAL_ENVS_DIR), timeout=BUILD_TIMEOUT)
    assert proc.returncode == 0, fail_with(proc, "envport build --target venv")
    return BuiltVenv(shell_project, f"{LOCAL_ENVS_DIR}/{ENV_NAME}", LOCAL_ENVS_DIR)


@pytest.fixture(scope="session")
def ssh_venv(shell_project, ssh_host) -> BuiltVenv:
    """demo-cpu built (or present) over SSH on the site host `test`, in its own folder."""
    proc = envport("build", ENV_NAME, "--target", "venv", "--host", "test", root=shell_project,
                   env=cli_env(ENVPORT_ENVS_DIR=SSH_ENVS_DIR), timeout=BUILD_TIMEOUT)
    assert proc.returncode == 0, fail_with(proc, "envport build --target venv --host test")
    return BuiltVenv(shell_project, f"{SSH_ENVS_DIR}/{ENV_NAME}", SSH_ENVS_DIR, host="test")


@pytest.fixture(scope="session")
def demo_image(docker_client, base_image, shell_project) -> str:
    """envport/demo-cpu:<hash12> in the engine; built by the docker builder when absent."""
    try:
        from envport.builders import docker as _builder  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"the docker builder is not there yet ({exc})")
    from envport.hashing import content_hash
    from envport.loader import load_spec
    from envport.site import load_site

    loaded = load_spec(ENV_NAME, shell_project)
    tag = f"envport/{ENV_NAME}:{content_hash(loaded, load_site(None, shell_project))[:12]}"
    import docker

    try:
        docker_client.images.get(tag)
        return tag
    except docker.errors.ImageNotFound:
        pass
    proc = envport("build", ENV_NAME, "--target", "docker", root=shell_project, timeout=BUILD_TIMEOUT)
    assert proc.returncode == 0, fail_with(proc, "envport build --target docker")
    docker_client.images.get(tag)
    return tag

"""The shared fixtures, each defined once; registered from tests/conftest.py (`pytest_plugins`).

The real services (docker_client, base_image, slurm, ssh_host) come from tests/services.py.

- ``project``: a throwaway copy of the project (tests/support.py PROJECT_DIRS) for one test.
- ``session_project``: one copy for the session, shared by the session's built envs: the
  site's `test` host and wheelhouse settings decide their hashes, and the ledgers the tests
  write never touch the checkout.
- ``demo_image``: demo-cpu built for real once per session by the docker builder (`--rebuild`:
  a BuildKit build that reuses the engine's layer cache where it has one, cold in CI) and kept.
- ``local_venv``: demo-cpu as a venv on this host, in LOCAL_ENVS_DIR.
- ``ssh_venv``: demo-cpu as a venv built over SSH on the site host `test`, in a fresh folder
  (SSH_ENVS_DIR.XXXXXX, made on the host and removed afterwards): really built over SSH every session.
- ``throwaway_images``: names whose images a test creates; removed afterwards.

The contract of the shared ones (session_project, demo_image, local_venv, ssh_venv; tests/README.md
"The shared session fixtures' contract"): a test reads and runs them (inspect, verify, witness, freeze,
containers from the image, a rebuild that must say `present`) and never changes them (no install into
the venv, no removing or re-tagging the image, no edit of session_project's specs or sites): every
other test of the run sees them as built. A test that must mutate an env builds its own small one
(tests/support.py write_spec in its `project`) or copies the shared one first.

The local env folder (LOCAL_ENVS_DIR) lives outside the checkout under /var/tmp and is kept
between sessions: a build whose hash matches reports `present` in about a second.
"""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from .support import (BUILD_TIMEOUT, ENV_NAME, LOCAL_ENVS_DIR, SSH_ENVS_DIR, BuiltVenv, DemoImage, as_json, cli_env,
                      copy_project, fail_with, run_envport)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A throwaway copy of the project for one test (in its tmp_path), so tests never touch the checkout."""
    return copy_project(tmp_path)


@pytest.fixture(scope="session")
def session_project(tmp_path_factory) -> Path:
    """One project copy for the session's shared envs (demo_image, local_venv, ssh_venv)."""
    return copy_project(tmp_path_factory.mktemp("session-project"))


@pytest.fixture(scope="session")
def demo_image(docker_client, base_image, session_project) -> DemoImage:
    """demo-cpu built for real from the debootstrap base, torch from the wheelhouse; kept after the session."""
    from envport.recipe.identity import content_hash
    from envport.spec.loader import load_spec
    from envport.plan.site import load_site

    proc = run_envport("build", ENV_NAME, "--target", "docker", "--rebuild", "--json", root=session_project,
                       timeout=BUILD_TIMEOUT)
    out = as_json(proc)
    assert proc.returncode == 0, fail_with(proc, "envport build --target docker --rebuild")
    build = out["steps"][-1]
    assert build["verdict"] == "OK" and build["step"].startswith(f"build envport/{ENV_NAME}:"), build
    tag = build["data"]["image"]
    # The tag names the spec's content hash for the project's default site.
    loaded = load_spec(ENV_NAME, session_project)
    assert tag == f"envport/{ENV_NAME}:{content_hash(loaded, load_site(None, session_project))[:12]}", tag
    docker_client.images.get(tag)
    return DemoImage(root=session_project, tag=tag, id=build["data"]["image_id"], result=out, stderr=proc.stderr)


@pytest.fixture(scope="session")
def local_venv(session_project) -> BuiltVenv:
    """demo-cpu built (or present) as a venv here: torch==2.13.0 from the local wheel, ~30 s cold."""
    proc = run_envport("build", ENV_NAME, "--target", "venv", root=session_project,
                       env=cli_env(ENVPORT_ENVS_DIR=LOCAL_ENVS_DIR), timeout=BUILD_TIMEOUT)
    assert proc.returncode == 0, fail_with(proc, "envport build --target venv")
    return BuiltVenv(session_project, f"{LOCAL_ENVS_DIR}/{ENV_NAME}", LOCAL_ENVS_DIR)


@pytest.fixture(scope="session")
def ssh_venv(session_project, ssh_host) -> BuiltVenv:
    """demo-cpu built over SSH on the site host `test`, in a fresh folder made on the host for this session
    (a kept folder would make every later session find it `present` and never build over SSH again);
    removed from the host afterwards."""
    made = subprocess.run(ssh_host.argv(f"mktemp -d {SSH_ENVS_DIR}.XXXXXX"), capture_output=True, text=True,
                          timeout=60)
    assert made.returncode == 0 and made.stdout.strip(), f"mktemp on the SSH host failed: {made.stderr}"
    envs_dir = made.stdout.strip()
    try:
        proc = run_envport("build", ENV_NAME, "--target", "venv", "--host", "test", "--json", root=session_project,
                           env=cli_env(ENVPORT_ENVS_DIR=envs_dir, ENVPORT_SSH_ENVS_DIR=envs_dir),
                           timeout=BUILD_TIMEOUT)
        assert proc.returncode == 0, fail_with(proc, "envport build --target venv --host test")
        last = as_json(proc)["steps"][-1]
        assert last["verdict"] == "OK", f"a fresh folder must be built, not {last['verdict']}: {last}"
        # The weights where the env on the host reads them (~/.envport/weights there): verify checks them.
        proc = run_envport("weights", "stage", ENV_NAME, "--host", "test", root=session_project, env=cli_env(),
                           timeout=300)
        assert proc.returncode == 0, fail_with(proc, "envport weights stage --host test")
        yield BuiltVenv(session_project, f"{envs_dir}/{ENV_NAME}", envs_dir, host="test")
    finally:
        subprocess.run(ssh_host.argv(f"rm -rf {shlex.quote(envs_dir)}"), capture_output=True, timeout=120)


@pytest.fixture
def throwaway_images(docker_client):
    """Names (envport/<name>) whose images the test creates; all their tags are removed afterwards."""
    names: list[str] = []
    yield names
    import docker

    for name in names:
        # By label, not only by tag: a rebuild re-tags, leaving the earlier image untagged.
        for img in docker_client.images.list(all=True, filters={"label": f"envport.name={name}"}):
            try:
                docker_client.images.remove(img.id, force=True)
            except docker.errors.APIError:
                pass

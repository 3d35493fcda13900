"""Fixtures for the docker build/verify/secrets tests: a plugin (`pytest_plugins`), so the
session's demo-cpu image is built once and shared by the three test files.

Every test works on a throwaway copy of the project (specs, images, docs,
sites), so the checkout's images/ and ledgers never change.  The demo-cpu
image is built once per session, for real (`--rebuild`: a BuildKit build that
reuses the engine's layer cache where it has one, cold in CI), and kept;
every other image a test creates is removed by `throwaway_images`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .docker_helpers import as_json, copy_project, run_envport


@pytest.fixture(scope="session")
def docker_project(tmp_path_factory) -> Path:
    """One project copy for the session's shared images (demo-cpu and its wheelhouse)."""
    return copy_project(tmp_path_factory.mktemp("docker-project"))


@pytest.fixture
def dproject(tmp_path) -> Path:
    """A fresh project copy (with sites/) for one test."""
    return copy_project(tmp_path)


@pytest.fixture(scope="session")
def demo_image(docker_client, base_image, docker_project) -> dict:
    """demo-cpu built for real from the debootstrap base, torch from the wheelhouse; kept after the session."""
    proc = run_envport("build", "demo-cpu", "--target", "docker", "--rebuild", "--json", root=docker_project)
    out = as_json(proc)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    build = out["steps"][-1]
    assert build["verdict"] == "OK" and build["step"].startswith("build envport/demo-cpu:"), build
    return {"root": docker_project, "tag": build["data"]["image"], "id": build["data"]["image_id"],
            "result": out, "stderr": proc.stderr}


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

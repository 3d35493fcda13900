"""jax-cpu (issue 42): a JAX env without torch, built for real as a venv, a docker image and a SIF (envport's
own builder, run by ch-run), whose kernel witness is JAX's (a seeded jit-compiled MLP on JAX's default
backend, here the CPU).

One build per backend for the whole module (module-scoped fixtures); jax and jaxlib come through the
same route as every env's wheels here: the venv's pip, and the docker build's wheelhouse
(`envport wheelhouse`, downloaded through the host's pip and its cache).
"""

from __future__ import annotations

import json

import pytest

from .sif_fixtures import build_sif, require_sif_tools, sif_env
from .support import BUILD_TIMEOUT, LOCAL_ENVS_DIR, as_json, cli_env, copy_project, fail_with, proven, run_envport

NAME = "jax-cpu"
SUITE = {"python", "import jax", "import jaxlib", "import numpy", "kernel (jax)"}


@pytest.fixture(scope="module")
def jax_project(tmp_path_factory):
    return copy_project(tmp_path_factory.mktemp("jax-project"))


@pytest.fixture(scope="module")
def jax_venv(jax_project) -> str:
    """jax-cpu as a venv in the tests' kept env folder (present in about a second once built)."""
    proc = run_envport("build", NAME, "--target", "venv", root=jax_project, env=cli_env(), timeout=BUILD_TIMEOUT)
    assert proc.returncode == 0, fail_with(proc, "envport build jax-cpu --target venv")
    return f"{LOCAL_ENVS_DIR}/{NAME}/bin/python"


@pytest.fixture(scope="module")
def jax_image(docker_client, base_image, jax_project) -> str:
    """jax-cpu built as an image from the debootstrap base, its wheels from the env's wheelhouse."""
    proc = run_envport("build", NAME, "--target", "docker", "--json", root=jax_project, env=cli_env(),
                       timeout=BUILD_TIMEOUT)
    assert proc.returncode == 0, fail_with(proc, "envport build jax-cpu --target docker")
    tag = as_json(proc)["steps"][-1]["data"]["image"]
    docker_client.images.get(tag)
    return tag


@pytest.fixture(scope="module")
def jax_sif(base_image, jax_project) -> str:
    """jax-cpu's SIF, built by envport's own .def builder (the local site's squashfs compression)."""
    require_sif_tools()
    return str(build_sif(jax_project, NAME).path)


def _witness(root, *args: str, env=None) -> dict[str, dict]:
    proc = run_envport("witness", NAME, *args, "--json", "--no-ledger", root=root, env=env or cli_env(), timeout=600)
    out = as_json(proc)
    assert proc.returncode == 0, fail_with(proc, f"envport witness {' '.join(args)}")
    assert all(proven(s) for s in out["steps"]), [(s["step"], s["verdict"]) for s in out["steps"]]
    steps = {s["step"]: s for s in out["steps"]}
    assert SUITE <= set(steps), sorted(steps)
    # No torch here and none asked for: JAX's row, never "torch not importable".
    assert "kernel" not in steps, steps.get("kernel")
    return steps


def _jax_kernel(steps: dict[str, dict]) -> str:
    detail = steps["kernel (jax)"]["detail"]
    assert detail.startswith("cpu:0: shape [8, 4], checksum ") and detail.endswith("(jax 0.4.38)"), detail
    return detail


def test_jax_witnesses_pass_in_the_venv_the_image_and_the_sif_with_one_checksum(jax_project, jax_venv, jax_image,
                                                                                jax_sif):
    in_venv = _jax_kernel(_witness(jax_project, "--target", "venv", "--python", jax_venv))
    in_image = _jax_kernel(_witness(jax_project, "--target", "docker", "--image", jax_image))
    in_sif = _jax_kernel(_witness(jax_project, "--target", "apptainer", "--sif", jax_sif, env=sif_env()))
    # The same seeded pass, the same jaxlib: the same numbers on every backend.
    assert in_venv == in_image == in_sif


def test_doctor_reports_jaxs_backend(jax_project, jax_venv):
    proc = run_envport("doctor", "--python", jax_venv, "--json", root=jax_project, env=cli_env(), timeout=300)
    assert proc.returncode == 0, fail_with(proc, "envport doctor --python")
    report = json.loads(proc.stdout)
    jax = report["frameworks"]["jax"]
    assert (jax["version"], jax["jaxlib"], jax["backend"], jax["devices"]) == ("0.4.38", "0.4.38", "cpu", [])
    assert "triton" not in report["frameworks"]
    assert report["torch"]["available"] is False  # the env holds no torch, and the doctor says so
    text = run_envport("doctor", "--python", jax_venv, root=jax_project, env=cli_env(), timeout=300).stdout
    assert "jax 0.4.38 (jaxlib 0.4.38): backend cpu, 0 GPU(s)" in text

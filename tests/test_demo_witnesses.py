"""demo-cpu's whole witness suite, for real, inside its built envs: the venv on this
host and the docker image; collectives at world 2 and 4 and DTensor on a 2x2 mesh
(world 4), gloo on CPU.  Every check must be OK: each compares values, not completion."""

from __future__ import annotations

import pytest

from .support import ENV_NAME, as_json, cli_env, fail_with, run_envport

FULL_SUITE = {"python", "import torch", "import six", "kernel", "collectives (world 2)", "dtensor (mesh 2x2)"}


def _witness(root, *args: str) -> dict[str, dict]:
    proc = run_envport("witness", ENV_NAME, *args, "--json", "--no-ledger", root=root, env=cli_env(), timeout=600)
    out = as_json(proc)
    assert proc.returncode == 0, fail_with(proc, f"envport witness {' '.join(args)}")
    assert all(s["verdict"] == "OK" for s in out["steps"]), [(s["step"], s["verdict"]) for s in out["steps"]]
    return {s["step"]: s for s in out["steps"]}


def _target_args(request, target: str) -> tuple:
    if target == "venv":
        venv = request.getfixturevalue("local_venv")
        return venv.root, ("--target", "venv", "--python", venv.python)
    image = request.getfixturevalue("demo_image")
    return image.root, ("--target", "docker", "--image", image.tag)


@pytest.mark.parametrize("target", ["venv", "docker"])
def test_full_suite(request, target):
    root, args = _target_args(request, target)
    steps = _witness(root, *args)
    assert FULL_SUITE <= set(steps), sorted(steps)
    cli = [s for name, s in steps.items() if name.startswith("cli ")]
    assert len(cli) == 2 and all("matched" in s["detail"] for s in cli), cli


@pytest.mark.parametrize("target", ["venv", "docker"])
def test_collectives_at_world_4(request, target):
    root, args = _target_args(request, target)
    steps = _witness(root, *args, "--only", "collectives", "--world-size", "4")
    assert set(steps) == {"collectives (world 4)"}

"""Five imported recipes, built unedited and witnessed (issue 26, done-when 2): `envport import` ->
`envport build` -> `envport witness` passes without a hand edit of the imported spec.

The recipes are the scenarios tests/import/build-*.txt (a Dockerfile, a `.def`, an environment.yml,
a requirements file and an install script; test_import.py checks each one's spec and report line by
line). Each is imported in a subprocess as a user runs it, built for real as a venv here (the spec's
python is this host's 3.11; its system_pkgs are checked with dpkg) and witnessed: every import the
spec carries must be OK. The Dockerfile and the `.def` are also built as images and witnessed inside
them, imported with `--base envport/debian-bookworm:base`: no registry is reachable here, so the
recipes' own bases (python:3.11-slim-bookworm, debian:bookworm-slim) cannot be pulled, and `--base`
is an import flag, not an edit of the spec.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest
import yaml

from .support import REPO, as_json, fail_with, run_envport
from .test_import import HERE, parse

BUILDS = ["build-dockerfile-peptides", "build-def-msa", "build-conda-qc", "build-requirements-lab",
          "build-shell-install"]
DOCKER_BUILDS = ["build-dockerfile-peptides", "build-def-msa"]
LOCAL_BASE = "envport/debian-bookworm:base"

pytestmark = pytest.mark.slow  # five venv builds (~20 s each) and two image builds (~2 min each)


def _import(scenario: str, tmp: Path, *extra: str) -> tuple[Path, str, dict, dict]:
    """The scenario's recipe imported into a fresh project: (project, spec name, import --json, env)."""
    header, sections = parse(HERE / f"{scenario}.txt")
    inputs = [(n, b) for n, b in sections if not n.startswith("expect")]
    ctx, project = tmp / "ctx", tmp / "project"
    (project / "specs").mkdir(parents=True)
    (project / "sites").mkdir()
    (project / "sites" / "local.yaml").write_bytes((REPO / "sites" / "local.yaml").read_bytes())
    for name, body in inputs:
        (ctx / name).parent.mkdir(parents=True, exist_ok=True)
        (ctx / name).write_text(body, encoding="utf-8")
    env = {**os.environ, "ENVPORT_ENVS_DIR": str(tmp / "envs"), "ENVPORT_STATE_DIR": str(tmp / "state")}
    proc = run_envport("import", str(ctx / inputs[0][0]), *shlex.split(header.get("args", "")), *extra, "--json",
                       root=project, env=env)
    data = as_json(proc)
    assert proc.returncode == 0 and data["valid"] and not data["lost"], fail_with(proc, f"envport import {scenario}")
    spec = yaml.safe_load((project / "specs" / f"{header['name']}.yaml").read_text())
    # The spec carries its witnesses, and one mapped note says where they came from.
    assert spec["witnesses"]["imports"], spec
    [note] = [n for n in data["notes"] if n["action"] == "turned into witnesses.imports"]
    assert note["kind"] == "mapped", note
    return project, header["name"], spec, env


def _witnessed(project: Path, name: str, spec: dict, env: dict, target: str) -> None:
    proc = run_envport("witness", name, "--target", target, "--no-ledger", "--json", root=project, env=env,
                       timeout=600)
    out = as_json(proc)
    assert proc.returncode == 0, fail_with(proc, f"envport witness {name} --target {target}")
    verdicts = {s["step"]: s["verdict"] for s in out["steps"]}
    # Every import the imported spec asks for was run and is OK, not only "the command exited 0".
    want = {f"import {m}" for m in spec["witnesses"]["imports"]}
    assert want <= set(verdicts), (sorted(want - set(verdicts)), verdicts)
    assert all(v == "OK" for v in verdicts.values()), verdicts


@pytest.mark.parametrize("scenario", BUILDS)
def test_imported_recipe_builds_as_a_venv_and_its_witnesses_pass(scenario: str, tmp_path: Path):
    project, name, spec, env = _import(scenario, tmp_path)
    build = run_envport("build", name, "--target", "venv", root=project, env=env)
    assert build.returncode == 0, fail_with(build, f"envport build {name} --target venv")
    assert f"OK       build {name} (venv)" in build.stdout, build.stdout
    _witnessed(project, name, spec, env, "venv")


@pytest.mark.parametrize("scenario", DOCKER_BUILDS)
def test_imported_recipe_builds_as_an_image_and_its_witnesses_pass(scenario: str, tmp_path: Path, base_image,
                                                                   throwaway_images):
    assert base_image == LOCAL_BASE
    project, name, spec, env = _import(scenario, tmp_path, "--base", LOCAL_BASE)
    assert spec["base"] == LOCAL_BASE, spec
    throwaway_images.append(name)
    build = run_envport("build", name, "--target", "docker", root=project, env=env)
    assert build.returncode == 0, fail_with(build, f"envport build {name} --target docker")
    _witnessed(project, name, spec, env, "docker")

"""Session fixtures for the SIF tests: SIFs built for real by envport's own `.def` builder, once a session.

Register with `pytest_plugins = ["tests.sif_fixtures"]` in a test module.

- ``demo_sif``: demo-cpu's SIF (torch from the wheelhouse, squashfs compressed as the local site says),
  built in the session project (tests/fixtures.py ``session_project``) so it shares its hash with
  the docker image and venv the parity tests compare it with. mksquashfs of ~1.1 GB: the slow part.
- ``sif_project``: a project copy with small specs (six only, no torch) and a site ``sif-fast``
  (the local site with lz4 squashfs: the fault and verify tests need a real SIF, not gzip's time).
- ``tiny_sif`` / ``jq_sif``: `tiny-sif` and `tiny-jq` (the same plus the Debian package jq, which
  apt-get installs in %post) built there.

Where apptainer is on PATH the builder would take the apptainer route; these fixtures pin
envport's own builder (ENVPORT_SIF_BUILDER=envport): it is what they test.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from .support import ENV_NAME, as_json, cli_env, copy_project, fail_with, missing, run_envport, write_site, write_spec

SIF_TIMEOUT = 1200
TOOLS = {"bwrap": "bubblewrap", "mksquashfs": "squashfs-tools", "squashfuse": "squashfuse",
         "ch-run": "charliecloud-runtime", "fusermount3": "fuse3", "siftool": "siftool"}


@dataclass(frozen=True)
class BuiltSif:
    root: Path  # the project it was built in
    name: str
    site: str | None
    path: Path
    hash: str
    result: dict  # the build's --json output
    stderr: str  # its progress lines


def sif_env(**extra: str) -> dict:
    return cli_env(ENVPORT_SIF_BUILDER="envport", **extra)


def require_sif_tools() -> None:
    absent = [f"{tool} ({pkg})" for tool, pkg in TOOLS.items() if shutil.which(tool) is None]
    if absent:
        missing(f"SIF tools not installed: {', '.join(absent)}; apt-get install {' '.join(sorted(set(TOOLS.values())))}")


def build_sif(root: Path, name: str, site: str | None = None, *extra: str) -> BuiltSif:
    args = ["build", name, "--target", "apptainer", "--json", *extra] + (["--site", site] if site else [])
    proc = run_envport(*args, root=root, env=sif_env(), timeout=SIF_TIMEOUT)
    assert proc.returncode == 0, fail_with(proc, f"envport {' '.join(args)}")
    out = as_json(proc)
    last = out["steps"][-1]
    assert last["verdict"] in ("OK", "present"), last
    path = Path(last["data"]["sif"])
    assert path.is_file() and path.name.startswith(f"{name}-"), path
    return BuiltSif(root, name, site, path, _hash(root, name, site), out, proc.stderr)


def _hash(root: Path, name: str, site: str | None) -> str:
    from envport.plan.site import load_site
    from envport.recipe.identity import resolve
    from envport.spec.loader import load_spec

    return resolve(load_spec(name, root), load_site(site, root), "apptainer").hash


@pytest.fixture(scope="session")
def demo_sif(base_image, session_project) -> BuiltSif:
    require_sif_tools()
    return build_sif(session_project, ENV_NAME)


@pytest.fixture(scope="session")
def sif_project(tmp_path_factory) -> Path:
    root = copy_project(tmp_path_factory.mktemp("sif-project"))
    write_spec(root, "tiny-sif")
    write_spec(root, "tiny-jq", system_pkgs=["jq"])
    write_site(root, "sif-fast", apptainer={"compression": "lz4"})
    return root


@pytest.fixture(scope="session")
def tiny_sif(base_image, sif_project) -> BuiltSif:
    require_sif_tools()
    return build_sif(sif_project, "tiny-sif", "sif-fast")


@pytest.fixture(scope="session")
def jq_sif(base_image, sif_project) -> BuiltSif:
    require_sif_tools()
    return build_sif(sif_project, "tiny-jq", "sif-fast")

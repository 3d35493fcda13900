"""`pip install .` (not editable) into a clean venv works outside the checkout.

The design card keeps renderers/ at the top level and maps it into the package
(`envport.renderers`) with the build backend; a subpackage or template missing
from pyproject.toml works in the editable checkout and breaks only here.

The tracked files (`git ls-files`, as they are in the working tree) are copied
to a temporary directory first, so the build's artefacts (build/, *.egg-info)
never touch the checkout.  The venv is made without system site-packages, so
nothing of the checkout's editable install can leak in; pip resolves the
dependencies from whatever index this machine is configured with.  Then the
venv's own `envport` renders a copy of specs/ in another temporary directory
and every file must be byte-identical to the committed images/.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
import venv
from pathlib import Path

import pytest
import yaml

from envport.spec.loader import all_spec_names, load_spec
from envport.recipe.render import KEPT_FILES, render_spec

from .support import REPO, copy_tracked

pytestmark = pytest.mark.slow


def files_under(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name not in KEPT_FILES}


def build_artefacts() -> dict[str, int]:
    """{path: mtime_ns} of every file under the checkout's build/ and *.egg-info/ (setuptools' leftovers)."""
    roots = [REPO / "build", *REPO.glob("*.egg-info"), *(REPO / "src").glob("*.egg-info")]
    return {str(f): f.stat().st_mtime_ns for r in roots if r.is_dir() for f in r.rglob("*") if f.is_file()}


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    base = tmp_path_factory.mktemp("install")
    src = copy_tracked(base / "src")
    before = build_artefacts()
    env_dir = base / "venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    bindir = env_dir / "bin"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    proc = subprocess.run([str(bindir / "python"), "-m", "pip", "install", "--disable-pip-version-check",
                           "--no-input", str(src)], cwd=base, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, f"pip install . failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    # The build's leftovers stay in the copy, never in the checkout: nothing under build/ or *.egg-info
    # there was created or rewritten (compared file by file, so a build/ left by something else still counts).
    assert build_artefacts() == before, "pip install of the copy wrote build/ or *.egg-info into the checkout"
    project = base / "project"
    shutil.copytree(REPO / "specs", project / "specs")
    return {"bin": bindir, "env": env, "project": project, "base": base}


def test_installed_package_is_the_copy_not_the_checkout(installed):
    code = ("import envport, envport.renderers, envport.cli; "
            "print(envport.__file__); print(envport.renderers.__file__); print(envport.renderers.TEMPLATES)")
    proc = subprocess.run([str(installed["bin"] / "python"), "-c", code], cwd=installed["base"],
                          env=installed["env"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    site = str(installed["base"] / "venv")
    for line in proc.stdout.split():
        assert line.startswith(site), f"{line} is not inside the venv {site}"
    templates = Path(proc.stdout.split()[2])
    assert {"Dockerfile.j2", "apptainer.def.j2", "setup.sh.j2"} <= {p.name for p in templates.glob("*.j2")}


@pytest.fixture(scope="module")
def rendered(installed) -> dict[str, bytes]:
    """`envport render --all` by the installed CLI, in a copy of specs/: {path under images/: bytes}."""
    proc = subprocess.run([str(installed["bin"] / "envport"), "render", "--all"], cwd=installed["project"],
                          env=installed["env"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = files_under(installed["project"] / "images")
    assert out
    return out


def test_installed_cli_renders_what_the_checkout_renders(rendered):
    names = all_spec_names(REPO)
    assert {rel.split("/")[0] for rel in rendered} == set(names)
    for name in names:
        for rel, (data, _) in render_spec(load_spec(name, REPO)).files.items():
            assert rendered.get(f"{name}/{rel}") == data, f"{name}/{rel} differs from the checkout's rendering"


def test_installed_rendering_is_byte_identical_to_committed_images(rendered):
    committed = files_under(REPO / "images")
    stale = sorted(rel for rel in rendered.keys() | committed.keys() if rendered.get(rel) != committed.get(rel))
    assert not stale, (f"{len(stale)} file(s) under images/ differ from a fresh rendering by the installed "
                       f"package (images/ is stale: run `envport render --all`): {stale}")


def test_installed_render_check_passes_on_the_committed_images_and_names_a_drifted_file(installed, tmp_path):
    """`render --all --check` judges files it did not write: the checkout's images/, then a copy with one edit."""
    project = tmp_path / "check"
    shutil.copytree(REPO / "specs", project / "specs")
    shutil.copytree(REPO / "images", project / "images")
    check = [str(installed["bin"] / "envport"), "render", "--all", "--check"]
    proc = subprocess.run(check, cwd=project, env=installed["env"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    dockerfile = project / "images" / "demo-cpu" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text() + "# an edit by hand\n")
    proc = subprocess.run(check, cwd=project, env=installed["env"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "images/demo-cpu/Dockerfile" in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def test_a_missing_build_extra_is_named_not_mistaken_for_a_stopped_engine(installed):
    """Installed without `[build]` (no docker SDK): REFUSED missing_extra with the pip command.

    An image already in the engine is answered `present` from one socket request, without the SDK; so the
    spec gets an env var no other test uses, and its image is certainly one that has to be built."""
    shutil.copytree(REPO / "sites", installed["project"] / "sites", dirs_exist_ok=True)
    spec_file = installed["project"] / "specs" / "demo-cpu.yaml"
    data = yaml.safe_load(spec_file.read_text())
    data["env"]["NEVER_BUILT_MARK"] = uuid.uuid4().hex
    spec_file.write_text(yaml.safe_dump(data, sort_keys=False))
    proc = subprocess.run([str(installed["bin"] / "envport"), "build", "demo-cpu", "--target", "docker", "--json"],
                          cwd=installed["project"], env=installed["env"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    step = json.loads(proc.stdout)["steps"][-1]
    assert step["reason"] == "missing_extra", step
    assert "pip install 'envport[build]'" in step["detail"] and "docker" in step["detail"]


def test_verify_and_up_without_the_build_extra_refuse_in_one_line(installed):
    """Issue 27 row 1: `verify`/`up` after a plain install were a ModuleNotFoundError traceback (up mid-table)."""
    shutil.copytree(REPO / "sites", installed["project"] / "sites", dirs_exist_ok=True)
    python = str(installed["bin"] / "python")
    for argv, step in ((["verify", "demo-cpu", "--target", "venv"], "verify demo-cpu"),
                       (["up", "demo-cpu", "--target", "venv"], "preflight")):
        proc = subprocess.run([str(installed["bin"] / "envport"), *argv], cwd=installed["project"],
                              env=installed["env"], capture_output=True, text=True, timeout=300)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 3 and "Traceback" not in out, out
        refused = [ln for ln in out.splitlines() if "[missing_extra]" in ln]
        assert len(refused) == 1 and step in refused[0], out
        # The pip command names the interpreter that refused, so the extra lands in this envport.
        assert f"{python} -m pip install 'envport[build]'" in refused[0] and "'pytest'" in refused[0], out

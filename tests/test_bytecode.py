"""A site's `bytecode` mode: when an env's .py files are compiled, at build or at their first import
(unset: the installer's own default, pip at build, uv at the first import).  Neither installer compiles:
pip is always told `--no-compile`, uv never `--compile-bytecode`; where the mode is build, the recipe
compiles after the phase (renderers/bytecode.py).

The recipes are checked as rendered for every target; real venv builds (pip and uv, local wheels made
here, no network) show what each mode leaves in site-packages, and that a first import compiles what
the build left alone.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from envport.plan.site import Site
from envport.recipe.identity import content_hash, resolve
from envport.recipe.render import render_plan
from envport.renderers.bytecode import COMPILE_SITE_PACKAGES
from envport.spec.loader import load_spec
from tests.support import PY, cli_env, fail_with, run_envport, write_site, write_spec
from tests.tinywheels import local_phase, make_wheel

# target -> (the renderer, the recipe file it writes)
RECIPES = {"docker": ("docker", "Dockerfile"), "apptainer": ("apptainer", "tiny.def"),
           "venv": ("shell", "setup-venv.sh")}
# (installer, the site's bytecode field) -> (the flag every install of a phase carries, whether the recipe
# compiles after each phase: no installer compiles itself, envport compiles after it).
CASES = {("pip", None): ("--no-compile", True), ("pip", "build"): ("--no-compile", True),
         ("pip", "first-import"): ("--no-compile", False),
         ("uv", None): (None, False), ("uv", "first-import"): (None, False),
         ("uv", "build"): (None, True)}
OTHER_FLAGS = ("--no-compile", "--compile-bytecode")


@pytest.fixture
def tiny(tmp_path):
    for d in ("specs", "sites"):
        (tmp_path / d).mkdir()
    make_wheel(tmp_path / "wheels", "envport-ta", "1.0", files={"envport_ta/__init__.py": "A = 1\n"})
    write_spec(tmp_path, "tiny", python=PY, pip_phases=[local_phase(tmp_path, "envport-ta==1.0")])
    return tmp_path


def _site(installer: str, bytecode: str | None) -> Site:
    return Site(name="t", installer=installer, **({"bytecode": bytecode} if bytecode else {}))


def _installs(text: str) -> list[str]:
    """Each `pip install` command of a recipe, its continuation lines joined."""
    out, lines = [], text.replace("\\\n", " ").splitlines()
    for line in lines:
        if "pip install" in line and "uv==" not in line and not line.lstrip().startswith(("#", "echo", "say")):
            out.append(" ".join(line.split()))
    return out


@pytest.mark.parametrize("installer,bytecode", list(CASES), ids=[f"{i}-{b or 'default'}" for i, b in CASES])
@pytest.mark.parametrize("target", list(RECIPES))
def test_each_install_carries_only_the_flag_its_installer_needs(tiny, installer, bytecode, target):
    renderer, recipe = RECIPES[target]
    resolved = resolve(load_spec("tiny", tiny), _site(installer, bytecode), renderer)
    files = render_plan(resolved.plan, resolved.identity.hash, (renderer,)).files
    text = files[recipe][0].decode()
    installs = _installs(text)
    assert installs, f"no pip install in the {target} recipe"
    want, compiles_after = CASES[(installer, bytecode)]
    for line in installs:
        for flag in OTHER_FLAGS:
            assert (flag in line) == (flag == want), f"{target}, {installer}/{bytecode}: {line}"
    assert text.count(shlex.quote(COMPILE_SITE_PACKAGES)) == (1 if compiles_after else 0), text


def test_the_mode_is_in_the_hash_only_where_it_changes_the_env(tiny):
    loaded = load_spec("tiny", tiny)
    hashes = {case: content_hash(loaded, _site(*case)) for case in CASES}
    assert hashes[("pip", None)] == hashes[("pip", "build")]  # pip's default, spelled out or not
    assert hashes[("uv", None)] == hashes[("uv", "first-import")]  # uv's
    assert hashes[("pip", "first-import")] != hashes[("pip", "build")]
    assert hashes[("uv", "build")] != hashes[("uv", None)]


def test_an_unknown_mode_is_refused_naming_the_site_file_and_field(tiny):
    site = write_site(tiny, "odd", bytecode="sometimes")
    proc = run_envport("show", "tiny", "--site", site, root=tiny, timeout=120)
    assert proc.returncode == 2, fail_with(proc, "envport show --site odd")
    assert "odd.yaml" in proc.stderr and "bytecode" in proc.stderr and "first-import" in proc.stderr, proc.stderr


def _pycs(env: Path) -> list[str]:
    return sorted(p.name for p in env.glob("lib/python*/site-packages/envport_ta/__pycache__/*.pyc"))


@pytest.mark.parametrize("installer,bytecode,compiled", [("pip", None, True), ("pip", "first-import", False),
                                                         ("uv", None, False), ("uv", "build", True)])
def test_a_venv_build_compiles_at_build_or_leaves_it_to_the_first_import(tiny, tmp_path, installer, bytecode,
                                                                          compiled):
    fields = {"installer": installer, **({"bytecode": bytecode} if bytecode else {})}
    site = write_site(tiny, "here", **fields)
    envs = tmp_path / "envs"
    proc = run_envport("build", "tiny", "--target", "venv", "--site", site, root=tiny,
                       env=cli_env(ENVPORT_ENVS_DIR=str(envs), ENVPORT_STATE_DIR=str(tmp_path / "state")),
                       timeout=600)
    assert proc.returncode == 0, fail_with(proc, f"envport build --target venv ({fields})")
    env = envs / "tiny"
    assert bool(_pycs(env)) is compiled, _pycs(env)
    if not compiled:
        # The env is writable: its first import writes the bytecode the build left out.
        # (without PYTHONDONTWRITEBYTECODE, which this project's CI machine sets)
        quiet = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        imported = subprocess.run([str(env / "bin" / "python"), "-c", "import envport_ta"], capture_output=True,
                                  text=True, timeout=120, env=quiet)
        assert imported.returncode == 0, imported.stderr
        assert _pycs(env), "the first import wrote no bytecode"

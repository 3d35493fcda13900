"""The first hour of a new user (issue 27): what the commands typed after the quickstart say.

Each test runs the real CLI on a copy of the project (tests/fixtures.py `project`).
"""

from __future__ import annotations

import re

from .support import run_envport, unique, write_spec

WORKFLOW = ".github/workflows/envs.yml"


def _fixes(text: str) -> list[str]:
    """Every command a line tells the user to run (`run `X``)."""
    return re.findall(r"run `([^`]+)`", text)


def test_render_one_then_check_all_gives_one_fix(project):
    # The project keeps the generated workflow, as the checkout does.
    run_envport("matrix", "--format", "github", root=project, timeout=120, check=True)
    name = unique("newcomer")
    write_spec(project, name)
    run_envport("render", name, root=project, timeout=120, check=True)
    proc = run_envport("render", "--all", "--check", root=project, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"drift: {WORKFLOW}\n" in proc.stderr, proc.stderr
    # One fix, the one that clears the workflow too (`render NAME` just ran and did not).
    assert _fixes(proc.stderr) == ["envport render --all"], proc.stderr
    run_envport("render", "--all", root=project, timeout=120, check=True)
    assert run_envport("render", "--all", "--check", root=project, timeout=120).returncode == 0


def test_render_check_of_named_specs_names_them_in_its_fix(project):
    name = unique("newcomer")
    write_spec(project, name)
    proc = run_envport("render", name, "--check", root=project, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert _fixes(proc.stderr) == [f"envport render {name}"], proc.stderr

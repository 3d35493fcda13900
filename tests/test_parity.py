"""Render parity: every target's recipe, parsed back, holds the plan's ordered steps.

Dockerfiles are parsed with dockerfile-parse and `.def` files with spython's
SingularityParser, classifying instructions by what they run; the setup
scripts by their `# envport-step` markers.
"""

from __future__ import annotations

import shlex

import pytest

from envport.spec.loader import all_spec_names, load_spec
from envport.plan.steps import make_plan
from tests.recipe_steps import def_markers, def_recipe, dockerfile_steps, pip_args_of, script_markers
from envport.renderers import render_target
from envport.recipe.identity import portable

from .support import REPO

ROOTS = [REPO, REPO / "tests" / "golden"]
CASES = [(root, name) for root in ROOTS for name in all_spec_names(root)]
IDS = [f"{r.name}:{n}" for r, n in CASES]


def _plan_and_hash(root, name):
    loaded = load_spec(name, root)
    return make_plan(loaded), portable(loaded).hash


@pytest.mark.parametrize("root,name", CASES, ids=IDS)
def test_dockerfile_parity(root, name):
    plan, h = _plan_and_hash(root, name)
    steps = dockerfile_steps(render_target("docker", plan, h)["Dockerfile"])
    assert [m for m, _ in steps] == plan.markers()
    # Each pip phase is one RUN whose arguments are exactly the phase's, in order.
    pip_runs = [v for m, v in steps if m.startswith("pip-")]
    pip_steps = [s for s in plan.steps if s.kind == "pip"]
    assert [pip_args_of(v) for v in pip_runs] == [s.pip_args() for s in pip_steps]


@pytest.mark.parametrize("root,name", CASES, ids=IDS)
def test_def_parity(root, name):
    plan, h = _plan_and_hash(root, name)
    text = render_target("apptainer", plan, h)[f"{name}.def"]
    assert def_markers(text) == plan.markers()
    stage = def_recipe(text)
    assert stage.fromHeader == plan.steps[0].image
    pip_lines = [ln for ln in stage.install if ln.startswith("python -m pip install")]
    assert [shlex.split(ln)[6:] for ln in pip_lines] == [s.pip_args() for s in plan.steps if s.kind == "pip"]
    assert any(lb == f"envport.hash {h}" for lb in stage.labels)


@pytest.mark.parametrize("root,name", CASES, ids=IDS)
@pytest.mark.parametrize("flavour", ["venv", "conda"])
def test_script_parity(root, name, flavour):
    plan, h = _plan_and_hash(root, name)
    text = render_target("shell", plan, h)[f"setup-{flavour}.sh"]
    assert script_markers(text) == plan.markers()
    for step in plan.steps:
        if step.kind == "pip":
            assert "-m pip install --disable-pip-version-check " + " ".join(
                shlex.quote(a) for a in step.pip_args()) in text

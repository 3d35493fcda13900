"""Render parity: every target's recipe, parsed back, holds the plan's ordered steps.

Dockerfiles are parsed with dockerfile-parse and `.def` files with spython's
SingularityParser, classifying instructions by what they run; the setup
scripts line by line, also by what each command does (`script_steps`). None
of them reads envport's own step markers or titles: those are written from
the plan's list, so comparing them with it would compare the list with itself.
"""

from __future__ import annotations

import re
import shlex

import pytest

from envport.spec.loader import all_spec_names, load_spec
from envport.plan.steps import make_plan
from tests.recipe_steps import def_markers, def_recipe, dockerfile_steps, pip_args_of
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
    assert [pip_args_of(v) for v in pip_runs] == [s.install_args() for s in pip_steps]


@pytest.mark.parametrize("root,name", CASES, ids=IDS)
def test_def_parity(root, name):
    plan, h = _plan_and_hash(root, name)
    text = render_target("apptainer", plan, h)[f"{name}.def"]
    assert def_markers(text) == plan.markers()
    stage = def_recipe(text)
    assert stage.fromHeader == plan.steps[0].image
    pip_lines = [ln for ln in stage.install if ln.startswith("python -m pip install")]
    assert [shlex.split(ln)[6:] for ln in pip_lines] == [s.install_args() for s in plan.steps if s.kind == "pip"]
    assert any(lb == f"envport.hash {h}" for lb in stage.labels)


HEREDOC = re.compile(r"<<'(\w+)'\s*$")
# (kind, what a line of that step runs), first match wins; a line that matches none is bookkeeping
# (say, step, mark_done, if/fi, refuse, checks of the result).
SCRIPT_KINDS = [
    ("base", re.compile(r"^say '  base image ")),
    ("ca", re.compile(r"PIP_CERT|ca-bundle")),
    ("system", re.compile(r"^for pkg in .*; do$")),
    ("python", re.compile(r' -m venv "\$\w+"$| create -y -n ')),
    ("env", re.compile(r"^export [A-Za-z_][A-Za-z0-9_]*=")),
    ("pip", re.compile(r'^"\$PY" -m pip install ')),
    ("files", re.compile(r'^base64 -d > "\$dest"')),
    ("run", re.compile(r'^cd "\$\w+"$')),
    ("weights", re.compile(r'^mkdir -p "\$ENVPORT_ROOT"')),
    ("labels", re.compile(r'> "\$\w+/\.envport/hash"$')),
]


def script_steps(text: str) -> list[str]:
    """The steps a setup script performs, in order, recovered from its commands (heredoc bodies skipped;
    consecutive lines of one kind are one step, except pip: each install is its own phase)."""
    steps: list[str] = []
    pip_n = 0
    lines = iter(text.splitlines())
    for raw in lines:
        line = raw.strip()
        kind = next((k for k, rx in SCRIPT_KINDS if rx.search(line)), None)
        if kind == "pip":
            pip_n += 1
            kind = f"pip-{pip_n}"
        if kind is not None and (not steps or steps[-1] != kind):
            steps.append(kind)
        end = HEREDOC.search(line)
        if end:
            for body in lines:
                if body == end.group(1):
                    break
    return steps


def test_script_steps_reads_commands_not_markers():
    text = "# envport-step 1/2 pip-1 0\nstep 1 pip-1 'x'\n  \"$PY\" -m pip install a\n" \
           "cat > f <<'ENVPORT_ENV'\nexport A=1\nENVPORT_ENV\n# envport-step 2/2 env 0\nexport B=2\n"
    assert script_steps(text) == ["pip-1", "env"]
    assert script_steps(text.replace("export B=2\n", "")) == ["pip-1"]  # a marker alone is no step


@pytest.mark.parametrize("root,name", CASES, ids=IDS)
@pytest.mark.parametrize("flavour", ["venv", "conda"])
def test_script_parity(root, name, flavour):
    plan, h = _plan_and_hash(root, name)
    text = render_target("shell", plan, h)[f"setup-{flavour}.sh"]
    assert script_steps(text) == plan.markers()
    for step in plan.steps:
        if step.kind == "pip":
            # A locked phase reads the requirements the script writes into the env it builds.
            req = f' -r "$BUILD/.envport/locks/{step.marker}.txt"' if step.locked else ""
            assert "-m pip install --disable-pip-version-check " + " ".join(
                shlex.quote(a) for a in step.install_args("")) + req in text

"""Round trip: every committed spec, rendered to a Dockerfile and a `.def`, imports back to the same plan.

Compared at `make_plan(...)` level: the same ordered steps, pip phases with
their options, env, shim files (dest, sha256, mode), run commands, weight
mount points and labels.  What a recipe cannot carry is left out of the
comparison, and only that:

- description, witnesses, resources and sm_range never reach a recipe (they
  are not in the plan either);
- a shim file's source name under specs/files/ (the import puts copies under
  specs/files/NAME/; the bytes are compared through sha256 and mode);
- a weight dir's name (recipes carry only its mount point);
- a locked phase's lock (`locked`): the lock is specs/NAME.lock, not part of
  the recipe; a locked recipe installs every phase `--no-deps`, so such a
  phase's own no_deps/pre flags are not in the recipe either.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from envport.plan.steps import make_plan
from envport.porting.run import import_recipe
from envport.recipe.render import render_spec
from envport.spec.loader import all_spec_names, load_spec

ROOT = Path(__file__).resolve().parent.parent
SPECS = all_spec_names(ROOT)


def comparable(plan, locked: set) -> list[dict]:
    """The plan's steps without what a recipe cannot carry; LOCKED: the source's locked phase numbers."""
    out = []
    for step in plan.canonical():
        step = dict(step)
        if step["kind"] == "files":
            step["files"] = [{k: v for k, v in f.items() if k != "source"} for f in step["files"]]
        elif step["kind"] == "weights":
            step["mounts"] = [path for _, path in step["mounts"]]
        elif step["kind"] == "pip":
            step.pop("locked", None)
            if step["index"] in locked:
                step.pop("no_deps")
                step.pop("pre")
                # A locked recipe installs the locked set; the request shows only in the step title
                # (its first three requirements). Either reading is the same phase of the same env.
                got = set(step.pop("packages"))
                step["installs"] = "the phase" if got in locked[step["index"]] else sorted(got)
        out.append(step)
    return out


def test_every_committed_spec_is_covered():
    assert len(SPECS) >= 5, SPECS


@pytest.mark.parametrize("recipe", ["Dockerfile", "def"])
@pytest.mark.parametrize("name", SPECS)
def test_rendered_recipe_imports_to_the_same_plan(name: str, recipe: str, tmp_path: Path):
    loaded = load_spec(name, ROOT)
    rendering = render_spec(loaded, ("docker", "apptainer"))
    context = tmp_path / "context"
    for rel, (data, _mode) in rendering.files.items():
        (context / rel).parent.mkdir(parents=True, exist_ok=True)
        (context / rel).write_bytes(data)
    project = tmp_path / "project"
    (project / "specs").mkdir(parents=True)
    source = context / ("Dockerfile" if recipe == "Dockerfile" else f"{name}.def")

    result = import_recipe(source, project, name=name)

    assert result.valid, (result.problems, result.output.fill)
    imported = load_spec(name, project)
    want = make_plan(loaded)
    locked = {s.index: ({f"{d['name']}=={d['version']}" for d in c["locked"]}, set(s.packages))
              for s, c in zip(want.steps, want.canonical()) if s.kind == "pip" and c.get("locked")}
    assert comparable(make_plan(imported), locked) == comparable(want, locked), result.output.text
    assert make_plan(imported).markers() == make_plan(loaded).markers()

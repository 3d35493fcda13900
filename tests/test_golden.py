"""Golden files: every renderer's output for every spec, reviewed like code.

The project's own specs render to the committed images/ (their goldens); the
edge-case specs under tests/golden/specs render to tests/golden/images.
Regenerate after a deliberate change with `envport render --all` and
`envport -C tests/golden render --all`, then review the diff.
"""

from __future__ import annotations

import pytest

from envport.spec.loader import all_spec_names, load_spec
from envport.recipe.render import drift, render_spec

from .support import REPO

ROOTS = [REPO, REPO / "tests" / "golden"]
CASES = [(root, name) for root in ROOTS for name in all_spec_names(root)]


@pytest.mark.parametrize("root,name", CASES, ids=[f"{r.name}:{n}" for r, n in CASES])
def test_rendering_matches_golden(root, name):
    rendering = render_spec(load_spec(name, root))
    assert {"Dockerfile", f"{name}.def", "setup-venv.sh", "setup-conda.sh"} <= set(rendering.files)
    assert drift(root, rendering) == []


@pytest.mark.parametrize("root,name", CASES, ids=[f"{r.name}:{n}" for r, n in CASES])
def test_rendering_is_byte_deterministic(root, name):
    first = render_spec(load_spec(name, root)).files
    second = render_spec(load_spec(name, root)).files
    assert first == second


def test_every_project_spec_is_covered():
    assert len(all_spec_names(REPO)) >= 4
    assert {"demo-cpu", "proteomics-gpu", "chai-lab"} <= set(all_spec_names(REPO))

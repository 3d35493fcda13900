"""Golden files: every renderer's output for every spec, reviewed like code.

The project's own specs render to the committed images/ (their goldens); the
edge-case specs under tests/golden/specs render to tests/golden/images.
Regenerate after a deliberate change with `envport render --all` and
`envport -C tests/golden render --all`, then review the diff.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

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


# Renders every case in a fresh interpreter and prints {case: {file: sha256}}; run under several hash seeds.
DIGESTS = """
import hashlib, json, sys
from pathlib import Path
from envport.spec.loader import all_spec_names, load_spec
from envport.recipe.render import render_spec
out = {}
for root in map(Path, sys.argv[1:]):
    for name in all_spec_names(root):
        files = render_spec(load_spec(name, root)).files
        out[f"{root.name}:{name}"] = {rel: hashlib.sha256(data).hexdigest() for rel, (data, _) in files.items()}
print(json.dumps(out, sort_keys=True))
"""


def test_rendering_is_byte_identical_across_processes_and_hash_seeds():
    """One process has one string-hash seed, so iterating a set or dict built from one looks stable there;
    only separate interpreters with different PYTHONHASHSEEDs show set-order nondeterminism."""
    runs = {}
    for seed in ("0", "1", "4242"):
        proc = subprocess.run([sys.executable, "-c", DIGESTS, *map(str, ROOTS)], capture_output=True, text=True,
                              timeout=300, env={**os.environ, "PYTHONHASHSEED": seed})
        assert proc.returncode == 0, proc.stderr
        runs[seed] = json.loads(proc.stdout)
    assert set(runs["0"]) == {f"{r.name}:{n}" for r, n in CASES}
    for seed, digests in runs.items():
        differ = sorted(f"{case}/{rel}" for case in digests for rel in digests[case]
                        if digests[case][rel] != runs["0"][case].get(rel))
        assert digests.keys() == runs["0"].keys() and not differ, \
            f"PYTHONHASHSEED={seed} renders differently from PYTHONHASHSEED=0: {differ}"


def test_every_project_spec_is_covered():
    assert len(all_spec_names(REPO)) >= 4
    assert {"demo-cpu", "proteomics-gpu", "chai-lab"} <= set(all_spec_names(REPO))

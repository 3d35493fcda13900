"""`envport build` and `envport up`'s build step are one step (flow/build.py) recording one set of facts (issue 36).

Before, `up` recorded its build without what changed, the distributions or `interrupted`. Here the real CLI
builds the same tiny venv env twice (tests/tinywheels.py: local wheels, no network) in two projects, the
second build through `build` in one and through `up` in the other: the two build records hold the same facts.
A signal during `up`'s build is recorded as `interrupted`, as `build` records it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

from envport.report import ledger

from .support import REPO
from .test_interrupt_build import signalled_in_pip_phase
from .tinywheels import ShellProject, make_wheelhouse, spec_data

NAME = "tiny-step"
# Facts of where and when, not of what was built.
VOLATILE = {"when", "seconds", "host", "key"}


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory):
    return make_wheelhouse(tmp_path_factory.mktemp("wheels"))


def _project(base, wheelhouse) -> ShellProject:
    proj = ShellProject.make(base, wheelhouse)
    shutil.copytree(REPO / "sites", proj.root / "sites")
    proj.extra_env = {"ENVPORT_STATE_DIR": str(base / "state")}
    return proj


def _up_argv(proj, name, *args) -> list[str]:
    return [sys.executable, "-m", "envport", "-C", str(proj.root), "up", name, "--target", "venv", "--json", *args]


def _builds(proj, name) -> list[dict]:
    old = os.environ.get(ledger.STATE_DIR_VAR)
    os.environ[ledger.STATE_DIR_VAR] = proj.extra_env["ENVPORT_STATE_DIR"]
    try:
        return [r for r in ledger.read(proj.root, name) if r["kind"] == "build"]
    finally:
        if old is None:
            os.environ.pop(ledger.STATE_DIR_VAR)
        else:
            os.environ[ledger.STATE_DIR_VAR] = old


def _facts(rec: dict, proj: ShellProject) -> dict:
    """RECORD without its time and place, its project paths as PROJECT."""
    text = json.dumps({k: v for k, v in rec.items() if k not in VOLATILE})
    return json.loads(text.replace(str(proj.root), "PROJECT"))


def test_build_and_up_record_the_same_facts_for_the_same_build(tmp_path, wheelhouse):
    first = spec_data(NAME, [["alpha==1.0", "epsilon==1.0"]], env={"GREETING": "hi"})
    second = spec_data(NAME, [["alpha==2.0", "gamma==1.0"]], env={"GREETING": "hello"})
    by_build, by_up = _project(tmp_path / "b", wheelhouse), _project(tmp_path / "u", wheelhouse)
    for proj in (by_build, by_up):
        proj.write(first)
        assert proj.build(NAME).verdict == "OK"
        proj.write(second)
    rebuilt = by_build.build(NAME)
    assert rebuilt.verdict == "OK", rebuilt.why()
    up = subprocess.run(_up_argv(by_up, NAME), cwd=by_up.root, capture_output=True, text=True, timeout=600,
                        env=by_up.env())
    steps = {s["step"]: s for s in json.loads(up.stdout)["steps"]}
    assert steps["build"]["verdict"] == "OK", up.stdout + up.stderr[-3000:]

    b, u = _builds(by_build, NAME)[-1], _builds(by_up, NAME)[-1]
    assert b["changes"]["distributions"] and {"alpha": "2.0", "delta": "1.1", "gamma": "1.0"}.items() <= b["dists"].items(), b
    assert _facts(u, by_up) == _facts(b, by_build)
    # up's build step shows what changed, as `envport build` does.
    assert any(ln.startswith(f"changed since {NAME}@") for ln in steps["build"]["lines"]), steps["build"]


def test_a_signal_during_ups_build_is_recorded_as_interrupted(tmp_path, wheelhouse):
    proj = _project(tmp_path / "p", wheelhouse)
    proj.write(spec_data(NAME, [["alpha==1.0"]], run_commands=["sleep 300"]))
    signalled_in_pip_phase(_up_argv(proj, NAME), proj, signal.SIGINT)
    builds = _builds(proj, NAME)
    assert builds and builds[-1]["verdict"] == "interrupted", builds

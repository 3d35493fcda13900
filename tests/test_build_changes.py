"""A rebuild names what it changed (issue 27 row 6): spec fields and distributions, old -> new.

The diff itself is pure (envport/plan/changes.py, shared with `inspect` and `lock`); the build test runs the
real CLI, the real setup script and real pip installs of tiny local wheels (tests/tinywheels.py), twice.
"""

from __future__ import annotations

import shutil
import subprocess

from envport.plan.changes import changed_paths, dist_lines, spec_lines
from envport.report.ledger import previous_build

from .support import REPO
from .tinywheels import ShellProject, make_wheelhouse, spec_data


def test_spec_lines_name_each_field_old_to_new():
    old = {"env": {"OMP_NUM_THREADS": "4", "GONE": "x"}, "system_pkgs": ["git"],
           "pip_phases": [{"packages": ["torch==2.13.0"], "no_deps": False},
                          {"packages": ["scipy==1.17.1", "six"], "no_deps": False}],
           "run_commands": ["a", "b"], "python": "3.11"}
    new = {"env": {"OMP_NUM_THREADS": "8", "NEW": "y"}, "system_pkgs": ["git", "libgomp1"],
           "pip_phases": [{"packages": ["torch==2.13.0"], "no_deps": False},
                          {"packages": ["scipy==1.16.3", "numpy==1.26.4"], "no_deps": True},
                          {"packages": ["extra==1.0"], "no_deps": False}],
           "run_commands": ["b", "a"], "python": "3.11"}
    assert spec_lines(old, new) == [
        "env.GONE: removed (was x)",
        "env.NEW: added, y",
        "env.OMP_NUM_THREADS: 4 -> 8",
        "pip_phases[1].no_deps: false -> true",
        "pip_phases[1].packages: scipy==1.17.1 -> scipy==1.16.3, + numpy==1.26.4, - six",
        'pip_phases[2]: added, {"packages":["extra==1.0"]}',
        "run_commands: reordered: b, a",
        "system_pkgs: + libgomp1",
    ]
    assert changed_paths(old, new) == ["env.GONE (removed)", "env.NEW (added)", "env.OMP_NUM_THREADS",
                                       "pip_phases[1].no_deps", "pip_phases[1].packages", "pip_phases[2] (added)",
                                       "run_commands", "system_pkgs"]
    assert spec_lines(old, old) == [] and changed_paths(new, new) == []


def test_dist_lines_name_each_distribution_old_to_new():
    assert dist_lines({"scipy": "1.17.1", "numpy": "2.0.2", "six": "1.16.0", "gone": "1"},
                      {"scipy": "1.16.3", "numpy": "1.26.4", "six": "1.16.0", "new": "2"}) == [
        "gone: gone (was 1)", "new: new, 2", "numpy: 2.0.2 -> 1.26.4", "scipy: 1.17.1 -> 1.16.3"]
    # With file digests (a lock), the same version from another file moved too; without one it did not.
    assert dist_lines({"six": ("1.16.0", "a" * 64)}, {"six": ("1.16.0", "b" * 64)}) == [
        f"six: 1.16.0, another file (sha256 {'a' * 12} -> {'b' * 12})"]
    assert dist_lines({"six": ("1.16.0", "a" * 64)}, {"six": "1.16.0"}) == []


def test_previous_build_is_the_replaced_one_or_the_last_good_one_of_another_hash():
    records = [{"kind": "build", "target": "venv", "verdict": "OK", "hash": "a" * 64},
               {"kind": "build", "target": "venv", "verdict": "OK", "hash": "b" * 64, "ssh_host": "far"},
               {"kind": "verify", "target": "venv", "verdict": "OK", "hash": "c" * 64},
               {"kind": "build", "target": "docker", "verdict": "OK", "hash": "d" * 64},
               {"kind": "build", "target": "venv", "verdict": "FAILED", "hash": "e" * 64},
               {"kind": "build", "target": "venv", "verdict": "present", "hash": "f" * 64}]
    assert previous_build(records, "venv", hash_prefix="a" * 12) is records[0]
    assert previous_build(records, "venv", hash_prefix="b" * 12) is None  # built on another host
    assert previous_build(records, "venv", ssh_host="far", other_than="f" * 64) is records[1]
    assert previous_build(records, "venv", other_than="f" * 64) is records[0]
    assert previous_build(records, "venv", other_than="x" * 64) is records[5]
    assert previous_build(records, "venv", hash_prefix="e" * 12) is None  # a failed build left no env


def test_a_venv_rebuild_names_the_spec_fields_and_versions_it_changed(tmp_path):
    proj = ShellProject.make(tmp_path / "project", make_wheelhouse(tmp_path / "wheels"))
    shutil.copytree(REPO / "sites", proj.root / "sites")
    proj.write(spec_data("tiny", [["alpha==1.0", "epsilon==1.0"]], env={"GREETING": "hi"}))
    first = proj.build("tiny")
    assert first.verdict == "OK", first.why()
    assert not any(ln.startswith("changed since") for ln in first.last["lines"]), first.last  # nothing before it
    was = first.last["detail"].split("@", 1)[1][:12]  # `tiny@<hash12> at PREFIX`

    proj.write(spec_data("tiny", [["alpha==2.0", "gamma==1.0"]], env={"GREETING": "hello"}))
    argv = [a for a in proj.argv("tiny") if a != "--json"]
    proc = subprocess.run(argv, cwd=proj.root, capture_output=True, text=True, timeout=300, env=proj.env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"building: the env at {proj.prefix('tiny')} is {was}" in proc.stderr, proc.stderr
    shown = [ln.removeprefix("    | ") for ln in proc.stdout.splitlines() if ln.startswith("    | ")]
    assert shown[0].startswith(f"changed since tiny@{was} (built "), shown
    assert shown[0].endswith("this machine's ledger): 2 spec field(s), 4 distribution(s)"), shown
    assert shown[1:] == ["spec env.GREETING: hi -> hello",
                         "spec pip_phases[0].packages: alpha==1.0 -> alpha==2.0, + gamma==1.0, - epsilon==1.0",
                         "package alpha: 1.0 -> 2.0", "package delta: new, 1.1", "package epsilon: gone (was 1.0)",
                         "package gamma: new, 1.0"], proc.stdout

    again = proj.build("tiny")
    assert again.verdict == "present" and again.last["lines"] == [], again.why()  # nothing changed

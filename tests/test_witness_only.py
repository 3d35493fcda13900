"""`envport witness --only CHECK` for a check the spec has no witness of: SKIPPED, saying so (issue 27 row 11).

Before, `--only kernel` ran kernel.py anyway and an env without torch printed
`FAILED kernel ModuleNotFoundError: torch` for a check nobody declared.  The env is
this interpreter (`--python`): a tiny spec with no torch, nothing to build.
"""

from __future__ import annotations

import json
import sys

from .support import fail_with, run_envport, write_spec


def test_only_kernel_for_a_spec_without_one_is_skipped_saying_so(project):
    write_spec(project, "tiny-nokernel", witnesses={"imports": ["json"]})
    proc = run_envport("witness", "tiny-nokernel", "--target", "venv", "--python", sys.executable, "--only", "kernel",
                       "--no-ledger", root=project, timeout=300)
    assert proc.returncode == 0, fail_with(proc, "witness --only kernel, no kernel witness")
    row = next((ln.split() for ln in proc.stdout.splitlines() if "kernel" in ln.split()), None)
    assert row and row[0] == "skipped" and " ".join(row[3:]) == "the spec asks for no kernel witness", proc.stdout
    assert "FAILED" not in proc.stdout and "ModuleNotFoundError" not in proc.stdout, proc.stdout


def test_each_unasked_only_check_is_skipped_and_the_asked_ones_run(project):
    write_spec(project, "tiny-nodist", witnesses={"imports": ["json"]})
    proc = run_envport("witness", "tiny-nodist", "--target", "venv", "--python", sys.executable, "--only",
                       "imports,cli,kernel,collectives,dtensor", "--no-ledger", "--json", root=project, timeout=300)
    assert proc.returncode == 0, fail_with(proc, "witness --only with checks the spec does not ask for")
    steps = {s["step"]: s for s in json.loads(proc.stdout)["steps"]}
    assert steps["import json"]["verdict"] == "OK", steps
    for check in ("cli", "kernel", "collectives", "dtensor"):
        assert steps[check]["verdict"] == "skipped", steps
        assert steps[check]["detail"] == f"the spec asks for no {check} witness", steps

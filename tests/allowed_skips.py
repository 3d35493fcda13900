"""The skips CI accepts: the only place they are declared (read by .ci/check_skips.py).

In CI every other skip fails the run: a skipped test proves nothing, and a
suite that skipped every docker, Slurm and SSH test once reported green. An
entry allows a skip when the test's node id matches ``tests`` (fnmatch) AND the
skip message matches ``reason`` (re.search); ``why`` says why this machine
truly cannot run it, and .ci/run prints it with the count.

To allow a new skip, add an entry here with its why; keep the list short.
A GPU test's skip message must say "needs a GPU" (or "no GPU"); a test that
needs the apptainer binary must say "apptainer not installed".
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Allowed:
    tests: str  # fnmatch pattern over node ids: tests/test_x.py::test_name[param]
    reason: str  # regex searched in the skip message
    why: str  # why this machine cannot run it, printed by .ci/run

    def matches(self, nodeid: str, message: str) -> bool:
        return fnmatch.fnmatchcase(nodeid, self.tests) and re.search(self.reason, message) is not None


ALLOWED: tuple[Allowed, ...] = (
    Allowed(tests="tests/*",
            reason=r"(?i)\b(needs? an? |no )(nvidia )?(gpu|accelerator)\b|this host has a GPU",
            why="GPU tests: the CI machine has no GPU (and a CPU-only test skips where one is present)"),
    Allowed(tests="tests/*",
            reason=r"(?i)\b(apptainer|singularity)\b[^\n]*\bnot installed\b",
            why="the apptainer/singularity binary is not packaged for Debian 12; SIF files are checked with siftool"),
)


def allowed(nodeid: str, message: str) -> Allowed | None:
    """The entry that allows this skip, or None."""
    return next((a for a in ALLOWED if a.matches(nodeid, message)), None)

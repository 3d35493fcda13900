#!/usr/bin/env python3
"""Where the suite's time went, from the JUnit report: the slowest tests and the time per test file.

.ci/run prints this after every run (issue 25: the suite's time is a budget, spent on purpose), so a
test that grows from 20 s to 300 s is seen in the run that made it so.  A test case's time in the
report is its setup + call + teardown (pytest's default `junit_duration_report = total`), so a
session fixture's build is charged to the first test that asked for it.
    usage: slowest.py [REPORT [N [ROOTDIR]]]   (default reports/junit.xml, the 25 slowest, the checkout)
    exit 0: printed; 2: the report is missing or unreadable.  The exit never reflects the tests'
    own verdicts: .ci/run takes those from pytest's exit code.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from check_skips import nodeid  # noqa: E402  (one JUnit classname -> node id rule for both scripts)


@dataclass(frozen=True)
class Case:
    test: str  # pytest node id
    seconds: float
    outcome: str  # passed, failed, error, skipped

    @property
    def file(self) -> str:
        return self.test.split("::", 1)[0]


def cases(report: Path, rootdir: Path = REPO) -> list[Case]:
    out = []
    for case in ET.parse(report).getroot().iter("testcase"):
        outcome = next((kind for kind in ("failure", "error", "skipped") if case.find(kind) is not None), "passed")
        out.append(Case(nodeid(case.get("classname", ""), case.get("name", ""), rootdir),
                        float(case.get("time") or 0.0), {"failure": "failed"}.get(outcome, outcome)))
    return out


def per_file(found: list[Case]) -> list[tuple[str, float, int]]:
    """(file, seconds, tests), the costliest first; ties by name so the table is deterministic."""
    seconds: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for c in found:
        seconds[c.file] += c.seconds
        counts[c.file] += 1
    return sorted(((f, s, counts[f]) for f, s in seconds.items()), key=lambda row: (-row[1], row[0]))


def table(found: list[Case], n: int = 25) -> str:
    total = sum(c.seconds for c in found) or 1.0
    lines = [f"{len(found)} tests, {total:.0f}s in the JUnit report; the {min(n, len(found))} slowest:",
             f"  {'seconds':>8} {'share':>6}  test"]
    for c in sorted(found, key=lambda c: (-c.seconds, c.test))[:n]:
        mark = "" if c.outcome == "passed" else f"  [{c.outcome}]"
        lines.append(f"  {c.seconds:8.1f} {c.seconds / total:6.1%}  {c.test}{mark}")
    rows = per_file(found)
    lines += ["", f"time per test file ({len(rows)} files):", f"  {'seconds':>8} {'share':>6} {'tests':>5}  file"]
    lines += [f"  {s:8.1f} {s / total:6.1%} {k:5d}  {f}" for f, s, k in rows]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    report = Path(argv[1] if len(argv) > 1 else REPO / "reports" / "junit.xml")
    n = int(argv[2]) if len(argv) > 2 else 25
    rootdir = Path(argv[3]) if len(argv) > 3 else REPO
    try:
        found = cases(report, rootdir)
    except (OSError, ET.ParseError) as exc:
        print(f"slowest: cannot read the JUnit report {report}: {exc}", file=sys.stderr)
        return 2
    print(table(found, n))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

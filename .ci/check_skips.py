#!/usr/bin/env python3
"""Fail CI when the JUnit report holds a skip that tests/allowed_skips.py does not allow.

A skipped test proves nothing, so a green CI may contain only the skips declared
(with why) in tests/allowed_skips.py. Prints how many skips were allowed and why,
and names every other one with its reason.
    usage: check_skips.py [REPORT [ROOTDIR]]   (default reports/junit.xml, the checkout)
    exit 0: every skip is allowed; 1: a skip is not, or the report has no tests;
    2: the report is missing or unreadable
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.allowed_skips import allowed  # noqa: E402


def _without_group(name: str) -> str:
    """test_z[param]@group -> test_z[param]: the group follows the parameters, which may hold an @ of their own."""
    head, at, group = name.rpartition("@")
    return head if at and "[" not in group and "]" not in group and "/" not in group else name


def nodeid(classname: str, name: str, rootdir: Path = REPO) -> str:
    """JUnit's dotted classname back to a pytest node id: the longest dotted prefix that is a file under
    ROOTDIR is the module, the rest are classes (tests.test_x.TestY + test_z -> tests/test_x.py::TestY::test_z).
    The `@GROUP` that `--dist loadgroup` appends to a test's name is not part of its id."""
    name = _without_group(name)
    parts = classname.split(".")
    for i in range(len(parts), 0, -1):
        path = "/".join(parts[:i]) + ".py"
        if (rootdir / path).is_file():
            return "::".join([path, *parts[i:], name])
    return f"{classname}::{name}"


def skips(report: Path, rootdir: Path = REPO) -> tuple[int, list[tuple[str, str]]]:
    """(number of test cases, [(node id, skip message)])."""
    root = ET.parse(report).getroot()
    cases = list(root.iter("testcase"))
    found = []
    for case in cases:
        for skipped in case.findall("skipped"):
            message = skipped.get("message") or (skipped.text or "").strip()
            found.append((nodeid(case.get("classname", ""), case.get("name", ""), rootdir), message))
    return len(cases), found


def main(argv: list[str]) -> int:
    report = Path(argv[1] if len(argv) > 1 else REPO / "reports" / "junit.xml")
    rootdir = Path(argv[2]) if len(argv) > 2 else REPO
    try:
        total, found = skips(report, rootdir)
    except (OSError, ET.ParseError) as exc:
        print(f"check_skips: cannot read the JUnit report {report}: {exc}", file=sys.stderr)
        return 2
    if total == 0:
        print(f"check_skips: FAILED: {report} holds no test cases", file=sys.stderr)
        return 1
    why = Counter()
    refused = []
    for test, message in found:
        entry = allowed(test, message)
        if entry is None:
            refused.append((test, message))
        else:
            why[entry.why] += 1
    print(f"check_skips: {total} tests, {len(found)} skipped, {sum(why.values())} of them allowed "
          "(tests/allowed_skips.py)")
    for reason, n in sorted(why.items()):
        print(f"  allowed {n}: {reason}")
    if refused:
        print(f"check_skips: FAILED: {len(refused)} skip(s) not allowed in CI; each must run here, or be "
              "added to tests/allowed_skips.py with why this machine cannot run it:", file=sys.stderr)
        for test, message in refused:
            print(f"  SKIPPED {test}: {message}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

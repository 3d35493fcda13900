#!/usr/bin/env python3
"""Where the test suite's time goes: its wall time, its slowest tests, and its 10 costliest fixtures.

Runs pytest in this process, serially (`-n 0`; CI's run uses two workers: tests/README.md "Two
workers"; otherwise the same tests, services and options CI's `python3 -m pytest` takes) with a small plugin that times every fixture's setup and teardown, measured,
never estimated: a fixture's setup is timed inside pytest's `pytest_fixture_setup` (its own body
only: pytest sets up the fixtures it depends on before that hook), its teardown from its first
finalizer to `pytest_fixture_post_finalizer`.  Then prints the suite's wall time, the slowest
tests from the JUnit report (.ci/slowest.py's table), and the 10 fixtures that cost the most,
each with its share of the wall time: the numbers issue 25's time budget is spent by.

    python bench/bench_suite.py [--top N] [--json FILE] [PYTEST ARGS...]   (default: the whole suite)
    python bench/bench_suite.py tests/test_build_kill.py -m "not slow"

Exit: pytest's own exit code (0 green; 5 nothing collected).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / ".ci"))

from slowest import cases, table  # noqa: E402  (the same JUnit reading and table as .ci/run prints)


@dataclass
class FixtureCost:
    name: str
    scope: str
    where: str  # the directory or module that defines it (pytest's baseid), "" for a plugin's
    setups: int = 0
    setup_s: float = 0.0
    teardown_s: float = 0.0

    @property
    def total(self) -> float:
        return self.setup_s + self.teardown_s


class FixtureTimer:
    """The pytest plugin: fixture -> measured setup and teardown seconds (a plain class: pluggy hashes it)."""

    def __init__(self) -> None:
        self.costs: dict[tuple, FixtureCost] = {}
        self._teardown_from: dict[int, float] = {}

    def _cost(self, fixturedef) -> FixtureCost:
        key = (fixturedef.argname, fixturedef.scope, fixturedef.baseid)
        if key not in self.costs:
            self.costs[key] = FixtureCost(*key)
        return self.costs[key]

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef, request):
        start = time.perf_counter()
        try:
            return (yield)
        finally:
            cost = self._cost(fixturedef)
            cost.setups += 1
            cost.setup_s += time.perf_counter() - start
            # Added after the fixture's own teardown finalizer, so (last in, first out) it runs first:
            # the moment the fixture's teardown begins.
            fixturedef.addfinalizer(lambda d=fixturedef: self._teardown_from.__setitem__(id(d), time.perf_counter()))

    def pytest_fixture_post_finalizer(self, fixturedef, request):
        began = self._teardown_from.pop(id(fixturedef), None)
        if began is not None:
            self._cost(fixturedef).teardown_s += time.perf_counter() - began


def costliest(costs: list[FixtureCost], top: int) -> list[FixtureCost]:
    return sorted(costs, key=lambda c: (-c.total, c.name, c.where))[:top]


def fixture_table(costs: list[FixtureCost], wall: float, top: int) -> str:
    ranked = costliest(costs, top)
    share = sum(c.total for c in ranked) / wall if wall else 0.0
    lines = [f"the {len(ranked)} costliest fixtures: {sum(c.total for c in ranked):.1f}s, {share:.1%} of the "
             f"{wall:.0f}s wall time (setup + teardown, each fixture's own body):",
             f"  {'seconds':>8} {'share':>6} {'setup':>8} {'teardown':>8} {'setups':>6}  fixture (scope, defined in)"]
    for c in ranked:
        lines.append(f"  {c.total:8.1f} {c.total / wall if wall else 0:6.1%} {c.setup_s:8.1f} {c.teardown_s:8.1f} "
                     f"{c.setups:6d}  {c.name} ({c.scope}, {c.where or 'plugin'})")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--top", type=int, default=10, help="how many fixtures to list (default 10)")
    ap.add_argument("--json", type=Path, help="also write the numbers to this file")
    args, pytest_args = ap.parse_known_args(argv)
    timer = FixtureTimer()
    os.chdir(REPO)  # the rootdir, testpaths and options of pyproject.toml, as CI runs them
    with tempfile.TemporaryDirectory(prefix="envport-bench-suite-") as tmp:
        junit = Path(tmp) / "junit.xml"
        start = time.perf_counter()
        # `-n 0`: the fixtures are timed in this process; under the two workers of pyproject's addopts they
        # would run in the workers, and the table would be empty.  A later `-n` in PYTEST ARGS wins (its
        # wall time is then the parallel run's, and the fixture table says nothing).
        rc = int(pytest.main(["-p", "no:cacheprovider", "-n", "0", f"--junitxml={junit}", *pytest_args],
                             plugins=[timer]))
        wall = time.perf_counter() - start
        found = cases(junit) if junit.is_file() else []
    costs = list(timer.costs.values())
    print(f"\n== bench_suite: {len(found)} tests in {wall:.0f}s wall (pytest exit {rc}); args: "
          f"{' '.join(pytest_args) or '(the whole suite)'}")
    if found:
        print(table(found, 25))
    print()
    print(fixture_table(costs, wall, args.top))
    if args.json:
        args.json.write_text(json.dumps({
            "args": pytest_args, "wall_s": round(wall, 1), "tests": len(found), "pytest_exit": rc,
            "slowest": [{"test": c.test, "s": round(c.seconds, 1)} for c in sorted(found, key=lambda c: -c.seconds)[:25]],
            "fixtures": [{"fixture": c.name, "scope": c.scope, "where": c.where, "setups": c.setups,
                          "setup_s": round(c.setup_s, 2), "teardown_s": round(c.teardown_s, 2)}
                         for c in costliest(costs, args.top)],
        }, indent=2) + "\n")
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

#!/usr/bin/env python3
"""Benchmark `envport render --all --check` and prove rendering stays light.

Times the real CLI in a subprocess (a few runs, the median), next to the bare
interpreter start and `envport --version` measured in the same run, so the
ratios hold on any machine.  Then runs `python -X importtime -m envport render
--all --check` once and lists every module the render imported: torch, docker
and spython (the builders' and verifiers' libraries) must not be among them;
`envport render` is what a login node or a CI lint job runs.

    python bench/bench_render.py [--runs N] [-C ROOT]

Prints the numbers and a PASS/FAIL line; exits 1 if a heavy module was
imported, 2 if the render itself failed (exit other than 0, or 1 for drift).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HEAVY = ("torch", "docker", "spython")
# Not forbidden, but nothing rendering needs: listed when present.
WATCH = ("dockerfile_parse", "testinfra", "paramiko", "requests", "numpy", "hypothesis")
REPO = Path(__file__).resolve().parent.parent


def timed(cmd: list[str], cwd: Path, runs: int) -> tuple[list[float], subprocess.CompletedProcess]:
    times, proc = [], None
    for _ in range(runs):
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
        times.append(time.perf_counter() - start)
    return times, proc


def imported_modules(importtime_stderr: str) -> set[str]:
    """Top-level names from `-X importtime` lines: 'import time: self | cumulative | name'."""
    names = set()
    for line in importtime_stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            name = line.rsplit("|", 1)[1].strip()
            if name and name != "imported package":
                names.add(name.split(".")[0])
    return names


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="timed runs of each command (default 5)")
    parser.add_argument("-C", "--root", type=Path, default=REPO, help="project root (default: this checkout)")
    args = parser.parse_args()
    root = args.root.resolve()
    py = sys.executable
    render = [py, "-m", "envport", "-C", str(root), "render", "--all", "--check"]

    bare, _ = timed([py, "-c", "pass"], root, args.runs)
    version, _ = timed([py, "-m", "envport", "--version"], root, args.runs)
    renders, proc = timed(render, root, args.runs)
    n_specs = len(list((root / "specs").glob("*.yaml")))
    med = {k: statistics.median(v) for k, v in (("bare", bare), ("version", version), ("render", renders))}

    print(f"envport render --all --check  ({n_specs} specs in {root}, {args.runs} runs each, median)")
    print(f"  python -c pass                {med['bare'] * 1000:8.1f} ms")
    print(f"  envport --version             {med['version'] * 1000:8.1f} ms   x{med['version'] / med['bare']:.2f} bare python")
    print(f"  envport render --all --check  {med['render'] * 1000:8.1f} ms   x{med['render'] / med['bare']:.2f} bare python, "
          f"x{med['render'] / med['version']:.2f} --version  (min {min(renders) * 1000:.1f}, max {max(renders) * 1000:.1f})")
    print(f"  per spec                      {(med['render'] - med['version']) / max(n_specs, 1) * 1000:8.1f} ms "
          "(render minus --version, over the specs)")

    status = 0
    if proc.returncode == 1:
        print("  note: render --check reports drift (images/ differs from the specs); timing still covers a full render")
    elif proc.returncode != 0:
        print(f"FAIL     render exited {proc.returncode}:\n{proc.stderr[-2000:]}")
        status = 2

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPROFILEIMPORTTIME"}
    traced = subprocess.run([py, "-X", "importtime", *render[1:]], cwd=root, capture_output=True, text=True, env=env)
    modules = imported_modules(traced.stderr)
    heavy = sorted(m for m in HEAVY if m in modules)
    watched = sorted(m for m in WATCH if m in modules)
    print(f"  modules imported by the render: {len(modules)} top-level; "
          f"heavy ({', '.join(HEAVY)}): {', '.join(heavy) or 'none'}; also present: {', '.join(watched) or 'none'}")
    if not modules:
        print("FAIL     -X importtime reported no imports; cannot prove anything")
        return 2
    if heavy:
        print(f"FAIL     rendering imported {', '.join(heavy)}: import it lazily where it is used")
        return 1
    if status:
        return status
    print(f"PASS     render --all --check: {med['render'] * 1000:.0f} ms median; imports none of {', '.join(HEAVY)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

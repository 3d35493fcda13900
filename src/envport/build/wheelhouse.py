"""`envport wheelhouse NAME`: every pip phase's distributions, on the host.

Downloads go through the host's own pip configuration (its index, find-links
and certificates), so an air-gapped cluster, or a container that cannot reach
the host's wheel files, installs with `--no-index --find-links`.  A manifest
records which phases the wheelhouse holds; a matching manifest is `present`.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

from envport.spec.loader import Loaded
from envport.plan.steps import PipStep, make_plan
from envport.core.progress import Progress, tail
from envport.core.verdict import StepResult, Verdict
from envport.core.files import write_atomic

MANIFEST = ".envport-wheelhouse.json"


def _phases(loaded: Loaded) -> list[PipStep]:
    return [s for s in make_plan(loaded).steps if isinstance(s, PipStep)]


def phase_key(python: str, step: PipStep) -> str:
    """What a phase's downloads depend on: the interpreter and the phase's pip arguments."""
    return hashlib.sha256(json.dumps([python, list(step.pip_args())]).encode()).hexdigest()[:16]


def _read_manifest(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data.get("phases"), dict) else {"phases": {}}
    except (OSError, ValueError):
        return {"phases": {}}


def download_args(step: PipStep, dest: Path, python: str, site_pip_args: list[str]) -> list[str]:
    args = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "-d", str(dest)]
    host = "%d.%d" % sys.version_info[:2]
    if python != host:
        # Another interpreter's wheels: binary only, pip cannot build for it.
        args += ["--python-version", python, "--only-binary=:all:"]
    args += step.source_args() + site_pip_args
    if step.no_deps:
        args.append("--no-deps")
    if step.pre:
        args.append("--pre")
    return args + list(step.packages)


def ensure_wheelhouse(loaded: Loaded, site, root: Path, progress: Progress, refresh: bool = False) -> StepResult:
    """Download the phases the wheelhouse does not hold yet.

    Phases are recorded one by one, so editing the last phase downloads only
    that phase again (torch stays), and a crash mid-way keeps what finished.
    """
    dest = site.wheelhouse_path(root, loaded.spec.name)
    mpath = dest / MANIFEST
    start = time.monotonic()
    manifest = {"phases": {}} if refresh else _read_manifest(mpath)
    steps = _phases(loaded)
    todo = [s for s in steps if phase_key(loaded.spec.python, s) not in manifest["phases"]]
    if not todo:
        n = len([p for p in dest.iterdir() if p.name != MANIFEST])
        return StepResult("wheelhouse", Verdict.PRESENT, f"{dest} ({n} files)")
    dest.mkdir(parents=True, exist_ok=True)
    site_args = site.pip_source_args()
    for step in todo:
        progress(f"envport: [wheelhouse] phase {step.index}/{len(steps)}: {' '.join(step.packages)}")
        proc = subprocess.run(download_args(step, dest, loaded.spec.python, site_args),
                              capture_output=True, text=True)
        if proc.returncode != 0:
            return StepResult("wheelhouse", Verdict.FAILED, f"pip download failed for phase {step.index}",
                              lines=tail(proc.stdout + proc.stderr), seconds=time.monotonic() - start)
        manifest["phases"][phase_key(loaded.spec.python, step)] = {"phase": step.index, "args": step.pip_args()}
        manifest.update(env=loaded.spec.name, python=loaded.spec.python)
        write_atomic(mpath, json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    n = len([p for p in dest.iterdir() if p.name != MANIFEST])
    return StepResult("wheelhouse", Verdict.OK, f"{dest} ({n} files, {len(todo)} phase(s) downloaded)",
                      seconds=time.monotonic() - start)

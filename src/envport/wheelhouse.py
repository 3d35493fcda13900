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

from .loader import Loaded
from .plan import PipStep, make_plan
from .progress import Progress, tail
from .verdict import StepResult, Verdict

MANIFEST = ".envport-wheelhouse.json"


def _phases(loaded: Loaded) -> list[PipStep]:
    return [s for s in make_plan(loaded).steps if isinstance(s, PipStep)]


def manifest_for(loaded: Loaded) -> dict:
    phases = [list(s.pip_args()) for s in _phases(loaded)]
    key = hashlib.sha256(json.dumps([loaded.spec.python, phases]).encode()).hexdigest()
    return {"env": loaded.spec.name, "python": loaded.spec.python, "phases": phases, "key": key}


def download_args(step: PipStep, dest: Path, python: str, site_pip_args: list[str]) -> list[str]:
    args = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "-d", str(dest)]
    host = "%d.%d" % sys.version_info[:2]
    if python != host:
        # Another interpreter's wheels: binary only, pip cannot build for it.
        args += ["--python-version", python, "--only-binary=:all:"]
    if step.index_url:
        args += ["--index-url", step.index_url]
    for url in step.extra_index_urls:
        args += ["--extra-index-url", url]
    for link in step.find_links:
        args += ["--find-links", link]
    args += site_pip_args
    if step.no_deps:
        args.append("--no-deps")
    if step.pre:
        args.append("--pre")
    return args + list(step.packages)


def ensure_wheelhouse(loaded: Loaded, site, root: Path, progress: Progress, refresh: bool = False) -> StepResult:
    dest = site.wheelhouse_path(root, loaded.spec.name)
    manifest = manifest_for(loaded)
    mpath = dest / MANIFEST
    start = time.monotonic()
    if not refresh and mpath.is_file():
        try:
            if json.loads(mpath.read_text())["key"] == manifest["key"]:
                n = len([p for p in dest.iterdir() if p.name != MANIFEST])
                return StepResult("wheelhouse", Verdict.PRESENT, f"{dest} ({n} files)")
        except (ValueError, KeyError):
            pass
    dest.mkdir(parents=True, exist_ok=True)
    mpath.unlink(missing_ok=True)
    site_args = site.pip_source_args()
    steps = _phases(loaded)
    for step in steps:
        progress(f"envport: [wheelhouse] phase {step.index}/{len(steps)}: {' '.join(step.packages)}")
        proc = subprocess.run(download_args(step, dest, loaded.spec.python, site_args),
                              capture_output=True, text=True)
        if proc.returncode != 0:
            return StepResult("wheelhouse", Verdict.FAILED, f"pip download failed for phase {step.index}",
                              lines=tail(proc.stdout + proc.stderr), seconds=time.monotonic() - start)
    mpath.write_text(json.dumps(manifest, indent=2) + "\n")
    n = len([p for p in dest.iterdir() if p.name != MANIFEST])
    return StepResult("wheelhouse", Verdict.OK, f"{dest} ({n} files)", seconds=time.monotonic() - start)

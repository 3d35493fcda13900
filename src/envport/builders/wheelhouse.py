"""`envport wheelhouse NAME`: every pip phase's distributions, on the host.

Downloads go through the host's own pip configuration (its index, find-links
and certificates), so an air-gapped cluster, or a container that cannot reach
the host's wheel files, installs with `--no-index --find-links`.  A manifest
records which phases the wheelhouse holds; a matching manifest is `present`.

With a lock (specs/<name>.lock) the wheelhouse is exactly the locked files:
each phase is downloaded `--no-deps --require-hashes` from its requirements,
and every file's sha256 is compared with the lock before a build uses it
(again whenever its size or mtime moved), so a swapped or truncated wheel is
FAILED by name with both digests before anything is installed.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Optional

from envport.spec.loader import Loaded
from envport.plan.steps import PipStep, make_plan
from envport.plan.lock import sha256_file
from envport.core.proc import run
from envport.core.progress import Progress, tail
from envport.core.verdict import StepResult, Verdict
from envport.core.files import write_atomic

MANIFEST = ".envport-wheelhouse.json"


def _phases(loaded: Loaded, locked: bool = True) -> list[PipStep]:
    return [s for s in make_plan(loaded, locked=locked).steps if isinstance(s, PipStep)]


def phase_key(python: str, step: PipStep) -> str:
    """What a phase's downloads depend on: the interpreter and the phase's pip arguments (and its lock)."""
    what = [python, list(step.pip_args())] + ([step.requirements_text()] if step.locked else [])
    return hashlib.sha256(json.dumps(what).encode()).hexdigest()[:16]


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
    if step.locked:
        return args + ["--no-deps", "--require-hashes", "-r", str(dest / f".{step.marker}.txt")]
    if step.no_deps:
        args.append("--no-deps")
    if step.pre:
        args.append("--pre")
    return args + list(step.packages)


def mismatches(dest: Path, steps: list[PipStep], manifest: dict) -> list[str]:
    """Each locked file in the wheelhouse whose sha256 is not the lock's, named with both digests.

    A file is hashed again only when its size or mtime moved since it was last found right
    (manifest["verified"]), so a present wheelhouse costs a stat per file, not 200 MB of reading."""
    seen = manifest.setdefault("verified", {})
    out = []
    for d in sorted({d for s in steps for d in s.locked}, key=lambda d: d.file):
        path = dest / d.file
        if not path.is_file():
            continue
        st = path.stat()
        stamp = [st.st_size, st.st_mtime_ns, d.sha256]
        if seen.get(d.file) == stamp:
            continue
        got = sha256_file(path)
        if got != d.sha256:
            seen.pop(d.file, None)
            out.append(f"{path}: sha256 {got}, the lock says {d.sha256}")
        else:
            seen[d.file] = stamp
    return out


def missing_files(dest: Path, steps: list[PipStep]) -> list[str]:
    return sorted({d.file for s in steps for d in s.locked if not (dest / d.file).is_file()})


def wheelhouse_for(loaded: Loaded, site, root: Path, plan, progress: Progress) -> Optional[StepResult]:
    """`ensure_wheelhouse`'s step when PLAN installs from the wheelhouse (the site's `wheelhouse: true`), else
    None: a builder that copies the wheelhouse into its context has it made first, never a missing folder."""
    if not any(s.kind == "pip" and s.uses_wheelhouse for s in plan.steps):
        return None
    return ensure_wheelhouse(loaded, site, root, progress)


def ensure_wheelhouse(loaded: Loaded, site, root: Path, progress: Progress, refresh: bool = False) -> StepResult:
    """Download the phases the wheelhouse does not hold yet; with a lock, check every locked file.

    Phases are recorded one by one, so editing the last phase downloads only
    that phase again (torch stays), and a crash mid-way keeps what finished.
    """
    dest = site.wheelhouse_path(root, loaded.spec.name)
    mpath = dest / MANIFEST
    start = time.monotonic()
    manifest = {"phases": {}} if refresh else _read_manifest(mpath)
    steps = _phases(loaded, locked=site.lock)
    todo = [s for s in steps if phase_key(loaded.spec.python, s) not in manifest["phases"]
            or (s.locked and missing_files(dest, [s]))]
    if not todo:
        bad = mismatches(dest, steps, manifest)
        write_atomic(mpath, json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        if bad:
            return _mismatch_result(bad, start)
        n = len([p for p in dest.iterdir() if p.name != MANIFEST and not p.name.startswith(".")])
        return StepResult("wheelhouse", Verdict.PRESENT, f"{dest} ({n} files"
                          f"{', every locked file checked' if any(s.locked for s in steps) else ''})")
    dest.mkdir(parents=True, exist_ok=True)
    site_args = site.pip_source_args()
    for step in todo:
        progress(f"envport: [wheelhouse] phase {step.index}/{len(steps)}: {' '.join(step.packages)}"
                 f"{f' (locked: {len(step.locked)} files)' if step.locked else ''}")
        if step.locked:
            write_atomic(dest / f".{step.marker}.txt", step.requirements_text())
        # No timeout: a phase's downloads are as large as its packages (torch alone is GBs), not envport's.
        proc = run(download_args(step, dest, loaded.spec.python, site_args), timeout=None)
        if not proc.ok:
            return StepResult("wheelhouse", Verdict.FAILED, f"pip download failed for phase {step.index}",
                              lines=tail(proc.text), seconds=time.monotonic() - start)
        manifest["phases"][phase_key(loaded.spec.python, step)] = {"phase": step.index, "args": step.pip_args()}
        manifest.update(env=loaded.spec.name, python=loaded.spec.python)
        write_atomic(mpath, json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    bad = mismatches(dest, steps, manifest)
    write_atomic(mpath, json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    if bad:
        return _mismatch_result(bad, start)
    n = len([p for p in dest.iterdir() if p.name != MANIFEST and not p.name.startswith(".")])
    return StepResult("wheelhouse", Verdict.OK, f"{dest} ({n} files, {len(todo)} phase(s) downloaded)",
                      seconds=time.monotonic() - start)


def _mismatch_result(bad: list[str], start: float) -> StepResult:
    return StepResult("wheelhouse", Verdict.FAILED,
                      f"{len(bad)} file(s) in the wheelhouse are not the locked ones; nothing was installed "
                      "(remove them and run `envport wheelhouse NAME --refresh`, or re-lock if the lock is wrong)",
                      reason="hash_mismatch", lines=bad, seconds=time.monotonic() - start)

"""`envport lock NAME`: resolve each pip phase in order, against the env the earlier ones left.

That is what pip does at build time, so it is what a lock has to record: a
single resolve over every phase would describe another env (a phase that
pins numpy after one that pulled a newer numpy ends with the pin; one global
resolve never has the newer numpy at all).  So, in a scratch venv made with
the spec's python on this machine, for each phase in order:

1. `pip install --dry-run --report` with the phase's own arguments (through
   the host's pip configuration plus the site's sources) says what the phase
   installs or replaces, and from which file;
2. each file's sha256 comes from the index's digest in that report, or from
   the file itself (a find-links file on disk; a remote file with no digest
   is downloaded once to be hashed);
3. the phase is replayed exactly as a locked build installs it
   (`--no-deps --require-hashes` from its requirements), so the next phase
   resolves against what the lock says and a lock that cannot be replayed
   fails here, not on a cluster.

At the end the scratch env's `pip freeze` must equal what the lock promises.

A lock that moves only what changed: where a lock is already there (for this python and platform), each
phase resolves preferring the versions that phase had in it (`-c` constraints, as pip-compile and uv keep
existing pins), so an edit to the last phase does not move an untouched phase's unpinned dependency
(measured before: editing demo-cpu's last phase moved filelock in phase 1, and every later phase's layer
with it). Where the preferred versions cannot satisfy the phase as edited, it resolves without them for the
distributions it names itself, then without any, and says so. `--upgrade` prefers nothing;
`--upgrade-package NAME` leaves NAME out of the preference.

A resolver must never pick a CUDA torch here: it is a multi-GB download (the
host holds a CPU torch wheel on disk for the pinned version).  A phase whose
dry run would fetch torch, triton or an nvidia-* wheel from the network is
REFUSED `remote_cuda_stack` before anything is downloaded.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import time
from pathlib import Path
from urllib.parse import unquote, urlparse

from packaging.requirements import InvalidRequirement, Requirement

from envport.core.files import write_atomic
from envport.core.proc import Ran, run
from envport.core.progress import Progress, tail
from envport.core.verdict import StepResult, Verdict
from envport.plan.lock import (Lock, LockedDist, LockedPhase, canonical_name, inputs_digest, lock_path,
                               sha256_file, this_platform, write_text)
from envport.plan.steps import PipStep, make_plan

# Distributions pip freeze leaves out: a venv's own seed, not the env's packages.
FREEZE_HIDDEN = ("pip", "setuptools", "wheel", "distribute")
HEAVY = ("torch", "triton")


def _heavy(name: str) -> bool:
    return name in HEAVY or name.startswith("nvidia-")


def _pip(python: Path, *args: str, timeout: float = 3600) -> Ran:
    return run([str(python), "-m", "pip", *args, "--disable-pip-version-check"], timeout=timeout)


def _locked_args(step: PipStep, site_args: list[str]) -> list[str]:
    """Where a phase's files come from while locking: the site's sources, then the phase's own."""
    return list(site_args) + step.source_args()


def _report_digest(item: dict) -> str | None:
    info = item.get("download_info", {}).get("archive_info", {})
    sha = (info.get("hashes") or {}).get("sha256")
    if not sha and str(info.get("hash", "")).startswith("sha256="):
        sha = info["hash"].split("=", 1)[1]
    return sha


def _file_digest(url: str, python: Path, work: Path) -> tuple[str | None, str]:
    """(sha256, why not) of the file behind `url`: read on disk, or downloaded once by pip."""
    parsed = urlparse(url)
    if parsed.scheme == "file":
        path = Path(unquote(parsed.path))
        return (sha256_file(path), "") if path.is_file() else (None, f"{path} is not a file")
    dest = work / "downloads"
    proc = _pip(python, "download", "--no-deps", "-d", str(dest), url)
    got = dest / unquote(Path(parsed.path).name)
    if proc.returncode != 0 or not got.is_file():
        return None, "; ".join(tail(proc.text, 3))
    return sha256_file(got), ""


def _spec_urls(packages: tuple[str, ...]) -> dict[str, str]:
    """{canonical name: URL} of the phase's direct references, as the spec writes them."""
    out = {}
    for text in packages:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if req.url:
            out[canonical_name(req.name)] = req.url
    return out


def _dists(report: dict, python: Path, work: Path, phase: int,
           packages: tuple[str, ...] = ()) -> tuple[list[LockedDist], str]:
    """The phase's distributions from pip's report, or ('', why) when one cannot be locked."""
    out, spec_urls = [], _spec_urls(packages)
    for item in report.get("install", []):
        meta, info = item.get("metadata", {}), item.get("download_info", {})
        name, version, url = canonical_name(meta.get("name", "")), meta.get("version", ""), info.get("url", "")
        if "vcs_info" in info:
            return [], (f"phase {phase}: {name} comes from a VCS checkout ({url}); pip cannot hash a checkout "
                        "(--require-hashes refuses it), so there is no digest to lock: build a wheel at that "
                        "commit and require it as `name @ file:///…whl#sha256=…` (or publish it to an index or "
                        "a find-links dir), or build this spec unlocked (--no-lock)")
        if "dir_info" in info:
            return [], (f"phase {phase}: {name} comes from a directory ({url}); only an "
                        "archive has a digest to lock: publish it to an index or a find-links dir")
        spec_url = ""
        if item.get("is_direct"):
            # `name @ URL` to a wheel or archive: the URL is part of the spec, so the lock line keeps it
            # (`name @ URL --hash=…`); the file has no other source a site could supply.
            spec_url = spec_urls.get(name, "")
            if not spec_url:
                return [], (f"phase {phase}: {name} is a direct reference ({url}) that is not one of the phase's "
                            "own requirements; require it as `name @ URL#sha256=…` in that phase")
        sha = _report_digest(item)
        if not sha:
            sha, why = _file_digest(url, python, work)
            if not sha:
                return [], f"phase {phase}: cannot read {url} to hash it: {why}"
        out.append(LockedDist(name, version, unquote(Path(urlparse(url).path).name), sha, spec_url))
    return sorted(out, key=lambda d: d.name), ""


def find_python(version: str) -> str | None:
    return shutil.which(f"python{version}")


def _freeze(python: Path) -> list[str]:
    """`pip freeze` as `name==version` lines; a `name @ URL` line (a direct reference: pip freeze prints
    its URL, not its version) gets the installed version from `pip list`."""
    proc = _pip(python, "freeze")
    lines = [ln.strip() for ln in proc.stdout.splitlines()]
    direct = [ln.split(" @ ", 1)[0] for ln in lines if " @ " in ln and not ln.startswith("-e ")]
    if direct:
        listed = json.loads(_pip(python, "list", "--format=json").stdout or "[]")
        versions = {canonical_name(p["name"]): p["version"] for p in listed}
        lines = [ln for ln in lines if " @ " not in ln] + \
            [f"{n}=={versions[canonical_name(n)]}" for n in direct if canonical_name(n) in versions]
    return sorted((ln for ln in lines if "==" in ln), key=lambda ln: canonical_name(ln.split("==")[0]))


def normalize_freeze(lines: list[str]) -> list[str]:
    """`name==version` lines with canonical names, sorted, pip's own seed left out."""
    out = []
    for ln in lines:
        name, sep, version = ln.strip().partition("==")
        if sep and canonical_name(name) not in FREEZE_HIDDEN:
            out.append(f"{canonical_name(name)}=={version.strip()}")
    return sorted(out)


def lock_spec(loaded, site, root: Path, progress: Progress, *, upgrade: bool = False,
              upgrade_packages: tuple[str, ...] = ()) -> StepResult:
    """Resolve, hash and replay every phase; write specs/<name>.lock when the replay matches. The lock there
    before is preferred phase by phase (module docstring) unless UPGRADE; UPGRADE_PACKAGES are never held."""
    spec = loaded.spec
    before = _previous(lock_path(loaded))
    prefer = preferences(before, spec.python, upgrade, upgrade_packages)
    step = f"lock {spec.name}"
    start = time.monotonic()
    python = find_python(spec.python)
    if python is None:
        return StepResult(step, Verdict.REFUSED, f"python{spec.python} is not on PATH; a lock is made with the "
                          "spec's own python: install it, or lock on a machine that has it", reason="no_python")
    steps = [s for s in make_plan(loaded, locked=False).steps if isinstance(s, PipStep)]
    site_args = site.pip_source_args()
    phases: list[LockedPhase] = []
    with tempfile.TemporaryDirectory(prefix=f"envport-lock-{spec.name}-") as tmp:
        work = Path(tmp)
        venv = work / "venv"
        progress(f"envport: [lock] scratch venv with {python}")
        made = run([python, "-m", "venv", str(venv)], timeout=600)
        if not made.ok:
            return StepResult(step, Verdict.FAILED, f"{python} -m venv failed", lines=tail(made.stderr or made.why))
        vpy = venv / "bin" / "python"
        held: list[str] = []
        for s in steps:
            result = _lock_phase(s, len(steps), vpy, work, site_args, progress, prefer.get(s.index, {}), held)
            if isinstance(result, StepResult):
                result.step, result.seconds = step, time.monotonic() - start
                return result
            phases.append(result)
        lock = Lock(spec.name, spec.python, this_platform(), inputs_digest(spec), tuple(phases))
        got = normalize_freeze(_freeze(vpy))
        want = normalize_freeze(lock.freeze())
    if got != want:
        extra, missing = sorted(set(got) - set(want)), sorted(set(want) - set(got))
        return StepResult(step, Verdict.FAILED, "replaying the phases did not give the env they resolved to",
                          lines=[f"not in the lock: {', '.join(extra) or '-'}",
                                 f"in the lock, not installed: {', '.join(missing) or '-'}"],
                          seconds=time.monotonic() - start)
    path = lock_path(loaded)
    try:
        rel = str(loaded.path.relative_to(root))
    except ValueError:
        rel = loaded.path.name
    text = write_text(lock, rel)
    changed = not path.is_file() or path.read_text(encoding="utf-8") != text
    if changed:
        write_atomic(path, text)
    n = len(lock.final())
    moved = changes(before, lock, spec) if before is not None else []
    said = f"; {len(moved)} change(s) from the lock before" if moved else ""
    return StepResult(step, Verdict.OK, f"{path.name}: {n} distributions in {len(phases)} phase(s)"
                      f"{'' if changed else ' (unchanged)'}{said}", lines=moved + held,
                      seconds=time.monotonic() - start,
                      data={"lock": str(path), "distributions": n, "changed": changed, "changes": moved,
                            "preferred": "none (--upgrade)" if upgrade else "the lock before" if prefer else "none"})


def _previous(path: Path) -> Lock | None:
    """The lock about to be replaced, to say what moved; one that cannot be read has nothing to compare."""
    from envport.plan.lock import LockError, read

    try:
        return read(path)
    except LockError:
        return None


def changes(before: Lock, after: Lock, spec) -> list[str]:
    """What moved between two locks, in words: the spec's phases (when they were edited) and every
    distribution the env ends with, `name old -> new`, new or gone, sorted by name."""
    from envport.plan.changes import dist_lines
    from envport.plan.lock import stale_detail

    out = [f"spec: {stale_detail(before, spec)}"] if before.inputs != after.inputs else []
    return out + dist_lines(*({n: (d.version, d.sha256) for n, d in lock.final().items()} for lock in (before, after)))


def preferences(before: Lock | None, python: str, upgrade: bool,
                upgrade_packages: tuple[str, ...]) -> dict[int, dict[str, str]]:
    """{phase index: {name: version}} the lock BEFORE had in each phase, to prefer when resolving again; none
    with UPGRADE, for another python or platform (its versions may not exist here), or for a direct
    reference (its URL is the spec's); UPGRADE_PACKAGES left out."""
    if before is None or upgrade or before.python != python or before.platform != this_platform():
        return {}
    free = {canonical_name(n) for n in upgrade_packages}
    return {p.index: {d.name: d.version for d in p.dists if not d.url and d.name not in free}
            for p in before.phases}


def _named(packages: tuple[str, ...]) -> set[str]:
    """The distributions a phase's requirements name themselves (an edit there governs their version)."""
    out = set()
    for req in packages:
        try:
            out.add(canonical_name(Requirement(req).name))
        except InvalidRequirement:
            continue
    return out


def _resolve(s: PipStep, vpy: Path, work: Path, site_args: list[str], prefer: dict[str, str],
             held: list[str]) -> tuple[Ran, Path]:
    """The phase's dry run, preferring PREFER's versions (`-c`): all of them, then all but those the phase
    names itself, then none; a fallback is said in HELD."""
    report_path = work / f"report-{s.index}.json"
    named = _named(s.packages)
    tries = [prefer, {n: v for n, v in prefer.items() if n not in named}, {}] if prefer else [{}]
    proc = None
    for n, pins in enumerate(dict.fromkeys(tuple(sorted(t.items())) for t in tries)):
        constraints = work / f"prefer-{s.index}-{n}.txt"
        constraints.write_text("".join(f"{name}=={version}\n" for name, version in pins))
        proc = _pip(vpy, "install", "--dry-run", "--quiet", "--report", str(report_path),
                    *_locked_args(s, site_args), *s.flag_args(), *(["-c", str(constraints)] if pins else []),
                    *s.packages)
        if proc.returncode == 0 and report_path.is_file():
            if prefer and len(pins) < len(prefer):
                held.append(f"phase {s.index}: the lock before's versions do not satisfy it as edited; resolved "
                            + ("without them for what it names" if pins else "afresh"))
            break
    return proc, report_path


def _lock_phase(s: PipStep, total: int, vpy: Path, work: Path, site_args: list[str],
                progress: Progress, prefer: dict[str, str], held: list[str]) -> LockedPhase | StepResult:
    kept = f" (preferring the lock before's {len(prefer)} version(s))" if prefer else ""
    progress(f"envport: [lock] phase {s.index}/{total}: resolving {' '.join(s.packages)}{kept}")
    proc, report_path = _resolve(s, vpy, work, site_args, prefer, held)
    if proc.returncode != 0 or not report_path.is_file():
        return StepResult("", Verdict.FAILED, f"phase {s.index} does not resolve: {' '.join(s.packages)}",
                          lines=tail(proc.text))
    report = json.loads(report_path.read_text())
    remote_heavy = sorted(
        canonical_name(i.get("metadata", {}).get("name", "")) for i in report.get("install", [])
        if _heavy(canonical_name(i.get("metadata", {}).get("name", "")))
        and urlparse(i.get("download_info", {}).get("url", "")).scheme != "file")
    if remote_heavy:
        return StepResult("", Verdict.REFUSED,
                          f"phase {s.index} would download {', '.join(remote_heavy)} from the network (a CUDA "
                          "stack is several GB); pin the version this host holds on disk (`pip config list` "
                          "shows its find-links) or lock on a machine meant to fetch it",
                          reason="remote_cuda_stack")
    dists, why = _dists(report, vpy, work, s.index, s.packages)
    if why:
        return StepResult("", Verdict.REFUSED, why, reason="unlockable")
    phase = LockedPhase(s.index, s.packages, s.force_reinstall, tuple(dists))
    progress(f"envport: [lock] phase {s.index}/{total}: {len(dists)} distribution(s); replaying it locked")
    reqs = work / f"pip-{s.index}.txt"
    reqs.write_text(phase.requirements_text())
    if dists:
        again = _pip(vpy, "install", "--quiet", *_locked_args(s, site_args), "--no-deps", "--require-hashes",
                     *(["--force-reinstall"] if s.force_reinstall else []), "-r", str(reqs))
        if again.returncode != 0:
            return StepResult("", Verdict.FAILED, f"phase {s.index} resolved but does not install from its "
                              "own lock (--no-deps --require-hashes)", lines=tail(again.text))
    return phase


def check_spec(loaded) -> StepResult:
    """`envport lock --check`: the lock exists and was made from the spec's phases as they are now."""
    from envport.plan.lock import load_for, problems

    step = f"lock {loaded.spec.name}"
    lock = load_for(loaded)
    path = lock_path(loaded)
    if lock is None:
        return StepResult(step, Verdict.FAILED, f"{path.name} does not exist; run `envport lock "
                          f"{loaded.spec.name}`", reason="no_lock")
    found = [p for p in problems(lock, loaded, lock.platform)]
    if found:
        return StepResult(step, Verdict.FAILED, found[0].message, reason=found[0].reason)
    return StepResult(step, Verdict.OK, f"{path.name} matches {loaded.path.name} "
                      f"({len(lock.final())} distributions, {lock.python}, {lock.platform})")


_PIP_FROM = re.compile(r"^\s*(\S+==\S+) from (\S+?)(?: \(from .*\))?:?\s*$")
# A direct reference, as pip prints it: `name@ URL from URL (from -r … (line 1)):`.
_PIP_DIRECT = re.compile(r"^\s*(\S+)@ (\S+) from (\S+?)(?: \(from .*\))?:?\s*$")
_UV_FOR = re.compile(r"[Hh]ash mismatch for `([^`]+)`")
_HEX = re.compile(r"\b([0-9a-f]{64})\b")


def hash_mismatches(lines: list[str]) -> list[str]:
    """From pip's or uv's output, each file whose sha256 is not the lock's: `WHAT: sha256 GOT, the
    lock says WANT`.  Both installers check every hash of a phase before installing any of it, so a
    mismatch leaves that phase not half-installed; this names the file for the FAILED verdict."""
    out, what, want, label = [], None, None, None
    for ln in lines:
        m = _PIP_FROM.match(ln) or _PIP_DIRECT.match(ln) or _UV_FOR.search(ln)
        if m:
            if m.re is _PIP_DIRECT:
                what = unquote(m.group(2).split("#", 1)[0].rsplit("/", 1)[-1])
            elif m.re is _PIP_FROM:
                what = m.group(2).rsplit("/", 1)[-1]
            else:
                what = m.group(1)
            want, label = None, None
            continue
        text = ln.strip()
        if text.startswith("Expected"):
            label = "want"
        elif text.startswith(("Got", "Computed")):
            label = "got"
        digest = _HEX.search(text)
        if what and digest and label == "want":
            want = digest.group(1)
        elif what and digest and label == "got" and want:
            out.append(f"{what}: sha256 {digest.group(1)}, the lock says {want}")
            what = want = label = None
    return out

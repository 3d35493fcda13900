"""The docker build context: rendered recipe, shim files, CA bundle and per-phase wheels.

Each pip phase mounts `wheelhouse/pip-N` (see renderers/Dockerfile.j2), and
that folder holds only the wheels phase N resolves to.  BuildKit keys a bind
mount by its content, so a phase's layer stays cached as long as its own
wheels do: editing the last phase (a new wheel in the wheelhouse) no longer
reinstalls torch in phase 1.  Which wheels a phase needs is asked of pip
itself (`pip install --dry-run --report` against the wheelhouse, offline,
on the host) and cached next to the contexts, keyed by the wheelhouse's
listing and the phase's arguments.

Wheels are hard-linked into the context (a copy where the wheelhouse lives on
another filesystem), so a 200 MB torch wheel costs nothing to stage.

The context sits at one path per env (`.cache/docker-build/contexts/<name>`),
kept between builds: the docker CLI keys what BuildKit already received of a
context by the context's path, so a rebuild sends only the files that changed
(the hard-linked wheels keep their mtimes) instead of the whole wheelhouse
again (seconds for torch).  One build per env holds that path (a lock beside
it); a concurrent build of the same env uses a fresh directory instead.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from urllib.parse import unquote, urlparse

from packaging.utils import (InvalidSdistFilename, InvalidWheelFilename, canonicalize_name,
                             parse_sdist_filename, parse_wheel_filename)

from envport.plan.steps import PipStep, Plan, step_marker
from envport.recipe.render import WHEELHOUSE_CONTEXT_NAME, Rendering
from envport.core.files import write_atomic
from envport.core.proc import run

InvalidFilename = (InvalidSdistFilename, InvalidWheelFilename)

BUILD_DIR = Path(".cache") / "docker-build"
CONTEXTS = "contexts"  # one kept build context per env, under BUILD_DIR
PHASES_CACHE = "phase-wheels.json"
# The host pip must see only the wheelhouse: no config file, no PIP_* variable
# (this machine's PIP_FIND_LINKS would add its own wheel dir), no index.
PIP_ENV_KEEP = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR")


def build_dir(root: Path) -> Path:
    return root / BUILD_DIR


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale(root: Path) -> None:
    """Work dirs of builds that were killed (their pid is gone): nothing else removes them."""
    base = build_dir(root)
    if not base.is_dir():
        return
    for d in base.iterdir():
        parts = d.name.rsplit("-", 2)
        if d.is_dir() and len(parts) == 3 and parts[1].isdigit() and not _pid_alive(int(parts[1])):
            shutil.rmtree(d, ignore_errors=True)


def make_workdir(root: Path, name: str) -> Path:
    """`<root>/.cache/docker-build/<name>-<pid>-XXXX`: next to the wheelhouse, so hard links work."""
    base = build_dir(root)
    base.mkdir(parents=True, exist_ok=True)
    remove_stale(root)
    return Path(tempfile.mkdtemp(prefix=f"{name}-{os.getpid()}-", dir=base))


@contextlib.contextmanager
def env_context(root: Path, name: str, fallback: Path):
    """An empty directory to fill with NAME's build context: the env's kept path when no other build
    of it holds that (see the module docstring), else FALLBACK (made here, removed by its owner)."""
    base = build_dir(root) / CONTEXTS
    base.mkdir(parents=True, exist_ok=True)
    fd = os.open(base / f".{name}.lock", os.O_CREAT | os.O_RDWR, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fallback.mkdir()
            yield fallback
            return
        context = base / name
        shutil.rmtree(context, ignore_errors=True)
        context.mkdir()
        yield context
    finally:
        os.close(fd)


def _link(src: Path, dest: Path) -> None:
    try:
        os.link(src, dest)
    except OSError:  # another filesystem, or links not allowed: copy
        shutil.copy2(src, dest)


def _wheel_files(wheelhouse: Path) -> list[Path]:
    return sorted(p for p in wheelhouse.iterdir() if p.is_file() and not p.name.startswith("."))


def _dry_run_argv(step: PipStep, wheelhouse: Path, python: str, report: Path) -> list[str]:
    argv = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
            "--disable-pip-version-check", "--no-index", "--find-links", str(wheelhouse), "--report", str(report)]
    if python != "%d.%d" % sys.version_info[:2]:
        argv += ["--python-version", python, "--only-binary=:all:"]
    if step.no_deps:
        argv.append("--no-deps")
    if step.pre:
        argv.append("--pre")
    return argv + list(step.packages)


def _resolve_phase(step: PipStep, wheelhouse: Path, python: str) -> list[str] | None:
    """File names in the wheelhouse that this phase installs, or None when pip cannot tell offline."""
    env = {k: os.environ[k] for k in PIP_ENV_KEEP if k in os.environ}
    env["PIP_CONFIG_FILE"] = os.devnull
    with tempfile.TemporaryDirectory(prefix="envport-pip-report-") as tmp:
        report = Path(tmp) / "report.json"
        proc = run(_dry_run_argv(step, wheelhouse, python, report), env=env, timeout=600)
        if not proc.ok or not report.is_file():
            return None
        data = json.loads(report.read_text())
    names = []
    for item in data.get("install", []):
        url = item.get("download_info", {}).get("url", "")
        path = Path(unquote(urlparse(url).path))
        if path.parent != wheelhouse.resolve() and path.parent != wheelhouse:
            return None
        names.append(path.name)
    return sorted(names)


def _project(fname: str) -> str:
    try:
        if fname.endswith(".whl"):
            return canonicalize_name(parse_wheel_filename(fname)[0])
        return canonicalize_name(parse_sdist_filename(fname)[0])
    except InvalidFilename:
        return fname


def phase_wheels(plan: Plan, wheelhouse: Path, cache_file: Path, progress=None) -> dict[str, list[str]]:
    """marker (pip-N) -> wheelhouse file names for every phase that installs from the wheelhouse.

    A cached answer holds while the wheelhouse's files of the projects it
    names are unchanged (a wheel another phase added does not matter to this
    one).  A phase pip cannot resolve offline gets the whole wheelhouse
    (correct, only less cacheable); the build then reports the real problem.
    """
    files = _wheel_files(wheelhouse)
    listing: dict[str, list] = {}
    for p in files:
        listing.setdefault(_project(p.name), []).append([p.name, p.stat().st_size])
    try:
        cache = json.loads(cache_file.read_text())
    except (OSError, ValueError):
        cache = {}
    out = {}
    changed = False
    for step in plan.steps:
        if not (isinstance(step, PipStep) and step.uses_wheelhouse):
            continue
        if step.locked:
            # A locked phase needs exactly its locked files: no resolver is asked.
            out[step_marker(step)] = sorted(d.file for d in step.locked)
            continue
        key = hashlib.sha256(json.dumps([plan.python, step.pip_args()]).encode()).hexdigest()
        hit = cache.get(key)
        if hit and all(listing.get(proj) == seen for proj, seen in hit["listing"].items()):
            out[step_marker(step)] = hit["files"]
            continue
        names = _resolve_phase(step, wheelhouse, plan.python)
        if names is None:
            if progress:
                progress(f"envport: [docker] {step_marker(step)}: pip cannot resolve it offline from the "
                         "wheelhouse; mounting the whole wheelhouse for it")
            names = [p.name for p in files]
        projects = sorted({_project(n) for n in names})
        cache[key] = {"files": names, "listing": {proj: listing.get(proj, []) for proj in projects}}
        changed = True
        out[step_marker(step)] = names
    if changed:
        write_atomic(cache_file, json.dumps(cache, indent=1, sort_keys=True))
    return out


def write_context(context: Path, rendering: Rendering, plan: Plan, wheelhouse: Path | None,
                  cache_file: Path, progress=None) -> None:
    """Fill `context` with the rendered files and, per wheelhouse phase, its wheels."""
    for rel, (data, mode) in rendering.files.items():
        path = context / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        os.chmod(path, mode)
    if wheelhouse is None:
        return
    for marker, names in phase_wheels(plan, wheelhouse, cache_file, progress).items():
        dest = context / WHEELHOUSE_CONTEXT_NAME / marker
        dest.mkdir(parents=True)
        for fname in names:
            _link(wheelhouse / fname, dest / fname)

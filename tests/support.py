"""Plain helpers and constants shared by the tests; no fixtures (those live in tests/fixtures.py).

- ``copy_project``: a throwaway copy of the project (PROJECT_DIRS), so tests never touch the checkout.
- ``copy_tracked``: the tracked files, for package builds that must leave nothing in the checkout.
- ``run_envport``: the real CLI in a subprocess on a project root, the way a user runs it.
- ``cli_env``: this process's environment with the local test env folder (LOCAL_ENVS_DIR), which keeps
  its venv between sessions: a build whose hash matches is `present` in about a second. (The folder over
  SSH is fresh each session: tests/fixtures.py ``ssh_venv``, under SSH_ENVS_DIR.XXXXXX.)
- ``write_spec`` / ``write_site``: small specs (six only, no torch: they build in seconds) and site profiles.
- ``torch_python``: an interpreter with the pinned CPU torch (from TORCH_WHEELS), for the witness tests.
- ``missing``: skip with the reason locally, fail in CI (``required_in_ci``).
- ``examples``: a property test's number of examples, CI's count or (``--deep``) the deep count.
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
PROJECT_DIRS = ("specs", "images", "docs", "sites", "slurm")
ENV_NAME = "demo-cpu"
# This interpreter's "X.Y": a spec with it builds from this machine's python, no download of another.
PY = "%d.%d" % sys.version_info[:2]
BUILD_TIMEOUT = 900

# One per xdist worker (a suffix "-gw0", "-gw1"): two workers building an env of one name into one folder
# would take each other's build lock, or replace each other's env between build and verify.
LOCAL_ENVS_DIR = os.environ.get("ENVPORT_TEST_ENVS_DIR", "/var/tmp/envport-test-envs") + (
    f"-{os.environ['PYTEST_XDIST_WORKER']}" if os.environ.get("PYTEST_XDIST_WORKER") else "")
# The prefix of the per-session folders the `ssh_venv` fixture makes on the SSH host (mktemp -d PREFIX.XXXXXX).
SSH_ENVS_DIR = os.environ.get("ENVPORT_TEST_SSH_ENVS_DIR", "/var/tmp/envport-ssh-envs")


# --- projects and the CLI ----------------------------------------------------------------


def copy_project(dest: Path) -> Path:
    """Copy the checkout's PROJECT_DIRS into DEST; returns DEST."""
    for d in PROJECT_DIRS:
        if (REPO / d).is_dir():
            shutil.copytree(REPO / d, dest / d)
    return dest


def copy_tracked(dest: Path) -> Path:
    """The checkout's tracked files (`git ls-files`, as they are in the working tree) copied into DEST, so a
    package build (`pip install .`, `pip wheel .`) leaves its build/ and *.egg-info there, never in the
    checkout. Fails when the checkout is not a git work tree: CI runs on a clone."""
    proc = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True)
    assert proc.returncode == 0, f"git ls-files failed in {REPO} (these tests need a git checkout): {proc.stderr!r}"
    for rel in filter(None, proc.stdout.decode().split("\0")):
        path = REPO / rel
        if path.is_file():  # a tracked file deleted in the working tree is not copied
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dest / rel)
    return dest


def cli_env(**extra: str) -> dict:
    """This process's environment with the local test env folder, without a witness fault. The env folder
    over SSH is the `ssh_venv` fixture's own (fresh each session): pass ENVPORT_SSH_ENVS_DIR from it."""
    env = dict(os.environ)
    env.pop("ENVPORT_SSH_ENVS_DIR", None)
    env.update(ENVPORT_ENVS_DIR=LOCAL_ENVS_DIR)
    env.pop("ENVPORT_WITNESS_FAULT", None)
    env.update(extra)
    return env


def fail_with(proc: subprocess.CompletedProcess, what: str) -> str:
    return f"{what} exited {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"


def run_envport(*args: str, root: Path, env: dict | None = None, timeout: float = BUILD_TIMEOUT,
                check: bool = False) -> subprocess.CompletedProcess:
    """`envport -C ROOT ARGS...` in a subprocess, in ROOT; ENV None: this process's environment."""
    proc = subprocess.run([sys.executable, "-m", "envport", "-C", str(root), *args], cwd=root,
                          capture_output=True, text=True, timeout=timeout, env=env)
    if check and proc.returncode != 0:
        raise AssertionError(fail_with(proc, f"envport {' '.join(args)}"))
    return proc


def proven(step: dict) -> bool:
    """A witness row that holds: OK, or a docs row `present` (this env passed the same doc before, as the
    ledger of this run's state dir, or a kept test user's, says)."""
    return step["verdict"] == "OK" or (step["step"].startswith("docs ") and step["verdict"] == "present")


def as_json(proc: subprocess.CompletedProcess) -> dict:
    try:
        return json.loads(proc.stdout)
    except ValueError:
        raise AssertionError(f"not JSON (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}") from None


def write_spec(root: Path, name: str, /, **fields) -> Path:
    """specs/<name>.yaml from a small default (no torch: builds in seconds) updated by fields."""
    data = {
        "name": name,
        "base": "envport/debian-bookworm:base",
        "python": "3.11",
        "pip_phases": [["six==1.16.0"]],
        "env": {"TINY_GREETING": "hello from tiny"},
    }
    data.update(fields)
    path = root / "specs" / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def write_site(root: Path, name: str, **fields) -> str:
    """sites/<name>.yaml: the local site with some fields changed; returns the --site value."""
    data = yaml.safe_load((REPO / "sites" / "local.yaml").read_text())
    data.update(name=name, **fields)
    (root / "sites" / f"{name}.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return name


def unique(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(3)}"


def tags_of(client, name: str) -> list[str]:
    return sorted(t for img in client.images.list(name=f"envport/{name}") for t in img.tags)


# --- what the session fixtures hand out ---------------------------------------------------


@dataclass(frozen=True)
class DemoImage:
    """demo-cpu built by the docker builder (`envport build demo-cpu --target docker --rebuild --json`)."""

    root: Path  # the session project it was built from
    tag: str  # envport/demo-cpu:<hash12>
    id: str  # the engine's image id
    result: dict  # the build's --json output
    stderr: str  # the build's progress lines


@dataclass(frozen=True)
class BuiltVenv:
    root: Path  # the project copy it was built from
    prefix: str  # the env folder (on this host, or on the SSH host)
    envs_dir: str
    host: str | None = None

    @property
    def python(self) -> str:
        return f"{self.prefix}/bin/python"


# --- how many examples a property test draws (issue 25) ----------------------------------
#
# A property test's number of examples is a choice, made here in the open: CI's count keeps the suite
# inside its time budget (tests/README.md "Time budget"), `--deep` (tests/conftest.py, which sets
# ENVPORT_TEST_DEEP=1 so subprocesses see it too) draws the deep count, for a change to the code under
# test or a nightly run. A test's own variable (ENVPORT_FUZZ_EXAMPLES, ...) overrides both.

DEEP_ENV = "ENVPORT_TEST_DEEP"


def deep() -> bool:
    return os.environ.get(DEEP_ENV) == "1"


def examples(ci: int, deep_count: int, override: str | None = None) -> int:
    """The number of examples: OVERRIDE's value if that variable is set, else DEEP_COUNT under --deep, else CI."""
    if override and os.environ.get(override):
        return int(os.environ[override])
    return deep_count if deep() else ci


# --- what CI requires ------------------------------------------------------------------


def required_in_ci() -> bool:
    """CI (`.ci/run` sets ENVPORT_REQUIRE_SERVICES=1; most CI systems set CI=true): what a test needs
    must be there. A skip there would turn "not tested" into a green run."""
    return os.environ.get("ENVPORT_REQUIRE_SERVICES") == "1" or os.environ.get("CI", "").lower() == "true"


def missing(why: str) -> None:
    """Something a test needs is missing: skip with WHY locally, fail (naming it) in CI."""
    if required_in_ci():
        pytest.fail(f"required in CI (ENVPORT_REQUIRE_SERVICES=1 or CI=true), missing: {why}", pytrace=False)
    pytest.skip(why)


def needs_bwrap() -> None:
    """The weights' read-only binds on venv/SSH need a working bubblewrap here (launchers/local.py)."""
    from envport.witness.launchers.local import bwrap_problem

    bwrap, problem = bwrap_problem()
    if bwrap is None:
        missing(f"bubblewrap: {problem}")


# --- an interpreter with torch for the witness tests --------------------------------------
#
# The one source of torch for the tests: the pinned CPU wheel torch==2.13.0 in TORCH_WHEELS
# (ENVPORT_TORCH_WHEELS, else the default TORCH_WHEELS below), named on
# pip's command line rather than trusted to the machine's pip config. It goes into a venv under
# .cache/witness-venv (gitignored), created once (~30 s); this interpreter is used instead when it
# already has that torch. Never an unpinned torch: a resolver would pull a multi-GB CUDA build.
# Failing to get it fails in CI and skips, with the reason, elsewhere.

TORCH_PIN = "2.13.0"
TORCH_WHEELS = Path(os.environ.get("ENVPORT_TORCH_WHEELS", "/opt/wheels"))
WITNESS_VENV = REPO / ".cache" / "witness-venv"


def torch_version(python: str) -> str | None:
    try:
        out = subprocess.run([python, "-c", "import torch, sys; sys.stdout.write(torch.__version__)"],
                             capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def torch_wheel() -> Path | None:
    """The pinned CPU wheel in TORCH_WHEELS, if it is there."""
    found = sorted(TORCH_WHEELS.glob(f"torch-{TORCH_PIN}+cpu-*.whl"))
    return found[0] if found else None


@functools.lru_cache(maxsize=1)
def _find_or_make_torch_python() -> tuple[str | None, str]:
    here = torch_version(sys.executable)
    if here and here.split("+")[0] == TORCH_PIN:
        return sys.executable, ""
    python = WITNESS_VENV / "bin" / "python"
    WITNESS_VENV.parent.mkdir(parents=True, exist_ok=True)
    with open(WITNESS_VENV.parent / "witness-venv.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # parallel test workers create it once
        version = torch_version(str(python)) if python.exists() else None
        if version is None:
            wheel = torch_wheel()
            if wheel is None:
                return None, (f"no torch=={TORCH_PIN} wheel in {TORCH_WHEELS} (set ENVPORT_TORCH_WHEELS to the "
                              f"folder holding torch-{TORCH_PIN}+cpu-*.whl)")
            # The wheel by path; its dependencies (sympy, filelock, ...) from the configured index.
            steps = [[sys.executable, "-m", "venv", "--clear", str(WITNESS_VENV)],
                     [str(python), "-m", "pip", "install", "-q", "--find-links", str(TORCH_WHEELS), str(wheel)]]
            for argv in steps:
                proc = subprocess.run(argv, capture_output=True, text=True, timeout=900,
                                      env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
                if proc.returncode != 0:
                    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
                    return None, f"could not install {wheel.name} into {WITNESS_VENV}: {' | '.join(tail)}"
            version = torch_version(str(python))
        if version is None or version.split("+")[0] != TORCH_PIN:
            return None, f"{python} has torch {version}, expected {TORCH_PIN} (remove {WITNESS_VENV} to recreate it)"
    return str(python), ""


def torch_python() -> str:
    """An interpreter with torch==2.13.0 from TORCH_WHEELS; skips with the reason, or fails in CI."""
    python, why = _find_or_make_torch_python()
    if python is None:
        missing(why)
    return python


BEGIN_LINE = re.compile(r"^slurm: job (\d+): begin dist world 2$")


def begun_job(err_lines: list[str]) -> str:
    """The job id from `envport slurm submit`'s stderr once the dist witness has begun, else ""."""
    return next((m.group(1) for m in map(BEGIN_LINE.match, map(str.rstrip, list(err_lines))) if m), "")


def wait_until(what: str, cond, proc=None, timeout: float = 180):
    """Poll COND (every 0.2 s, bounded by TIMEOUT) until it returns something truthy, and return that; a
    test waits for an event this way, never by a fixed sleep. PROC (a Popen): fail at once if it ends first."""
    deadline = time.monotonic() + timeout
    while not (got := cond()):
        assert proc is None or proc.poll() is None, f"the process ended (exit {proc.returncode}) before {what}"
        assert time.monotonic() < deadline, f"no {what} within {timeout:.0f}s"
        time.sleep(0.2)
    return got

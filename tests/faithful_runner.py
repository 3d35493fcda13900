"""A hosted ubuntu runner played on this host, for the generated workflow's jobs (issue 38).

What a job gets here, as GitHub's ubuntu-24.04 runner gives it:
- the user `runner` (.ci/faithful-runner.sh: unprivileged, password-less sudo, the docker group, a subordinate
  id range for rootless podman), every `run:` step executed as that user in `bash --noprofile --norc -eo
  pipefail` (GitHub's `bash -e` for `shell: bash`), in the workspace, with the job's and the step's `env:`,
  `$GITHUB_PATH` lines put first on PATH and `$GITHUB_ENV` lines exported for the steps after;
- `if:`s evaluated for the matrix row and `${{ }}` expressions substituted from it; one this module cannot
  evaluate fails the job, so a template change cannot skip a step unseen;
- no pip configuration of this machine: `env -i`, PIP_CONFIG_FILE=/dev/null and no PIP_* variable, so pip sees
  PyPI and the sources the job's own commands give it, nothing else;
- a fresh HOME (its podman store empty, as on a new runner), XDG_RUNTIME_DIR, RUNNER_TEMP; pip's cache
  (XDG_CACHE_HOME) may be shared by the jobs of one test session, to save their downloads.

What is played, and how:
- `actions/checkout` = the project's tracked files copied into a fresh workspace;
- `actions/setup-python` = a python of that version under a fresh tool cache (`python3.11 -m venv --copies`
  of the host's, owned by the runner user), its bin/ first on PATH and `pythonLocation` set, as the action does;
- `actions/cache` = nothing (a cold cache); `actions/upload-artifact` = nothing (it uploads, it runs nothing).
Nothing else is stood in for: a step that needs a source this host cannot reach (the apptainer PPA, which
only self-hosted rows install) fails the job here, so a template change cannot pass unseen.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from .support import REPO, missing
from .test_workflow import _runs

RUNNER_USER = os.environ.get("ENVPORT_RUNNER_USER", "runner")
SETUP = REPO / ".ci" / "faithful-runner.sh"
# The ubuntu images' system PATH (before setup-python's bin/ and $GITHUB_PATH lines go first).
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/snap/bin"
PYTHON = "3.11"
HOST_PYTHON = "/usr/bin/python3.11"
_EXPR = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")


def ensure_runner() -> pwd.struct_passwd:
    """The runner user, made by .ci/faithful-runner.sh (host-changing: a user, a sudoers line, sudo)."""
    for tool in ("runuser", "podman", "docker", "bash"):
        if shutil.which(tool) is None:
            missing(f"{tool} not installed (.ci/install.sh installs it): the faithful runner needs it")
    if os.geteuid() != 0:
        missing("the faithful runner makes its user and runs steps as it: run the tests as root")
    proc = subprocess.run(["bash", str(SETUP)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{SETUP} failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
    return pwd.getpwnam(RUNNER_USER)


def _value(expr: str, ctx: dict) -> str:
    if expr in ctx:
        return ctx[expr]
    raise AssertionError(f"the faithful runner cannot evaluate the expression ${{{{ {expr} }}}}: teach it")


def substitute(text: str, ctx: dict) -> str:
    return _EXPR.sub(lambda m: _value(m[1], ctx), text)


def context(row: dict, workspace: Path) -> dict:
    """The `${{ }}` values the workflow uses: the matrix row's fields and the workspace."""
    ctx = {f"matrix.{k}": ("true" if v is True else "false" if v is False else str(v)) for k, v in row.items()}
    ctx["github.workspace"] = str(workspace)
    return ctx


@dataclass
class Step:
    name: str
    run: str | None  # None: a `uses:` action, played: `why` says how
    env: dict = field(default_factory=dict)
    why: str = ""


def job_steps(workflow: dict, row: dict, workspace: Path) -> list[Step]:
    """The steps the job runs for ROW, `if:`s evaluated, expressions substituted."""
    job = workflow["jobs"]["up"]
    ctx = context(row, workspace)
    out = []
    for i, step in enumerate(job["steps"]):
        if not _runs(step.get("if", ""), row):
            continue
        name = step.get("name") or step.get("uses") or f"step {i}"
        uses = step.get("uses", "")
        if uses:
            action = uses.split("@")[0]
            assert action in ("actions/checkout", "actions/setup-python", "actions/cache",
                              "actions/upload-artifact"), f"step {i} uses {uses}: the faithful runner cannot play it"
            out.append(Step(name, None, why=f"{action} played (tests/faithful_runner.py)"))
            continue
        assert "run" in step, f"step {i} has neither run nor uses"
        env = {k: substitute(str(v), ctx) for k, v in (step.get("env") or {}).items()}
        out.append(Step(name, substitute(step["run"], ctx), env))
    return out


@dataclass
class Job:
    top: Path
    home: Path
    runtime: Path
    workspace: Path
    toolcache: Path
    temp: Path
    cache: Path  # pip's cache folder, shared by one session's jobs (see new_job)
    env: dict = field(default_factory=dict)  # the job's own `env:`, substituted
    log: list[str] = field(default_factory=list)

    @property
    def python_bin(self) -> Path:
        return self.toolcache / "Python" / PYTHON / "x64" / "bin"


def new_cache(pw: pwd.struct_passwd) -> Path:
    """A folder for pip's cache that one session's jobs share (the runner user's)."""
    cache = Path(tempfile.mkdtemp(prefix="envport-runner-cache-", dir="/var/tmp"))
    shutil.chown(cache, pw.pw_uid, pw.pw_gid)
    return cache


def new_job(pw: pwd.struct_passwd, project: Path, cache: Path) -> Job:
    """A fresh runner: HOME, runtime dir, workspace (a copy of PROJECT, as checkout gives it), tool cache;
    CACHE (new_cache) is the one thing carried between jobs: pip's downloads, through XDG_CACHE_HOME."""
    if not Path(HOST_PYTHON).exists():
        missing(f"{HOST_PYTHON} not installed: setup-python's interpreter is played by a copy of it")
    top = Path(tempfile.mkdtemp(prefix="envport-runner-", dir="/var/tmp"))
    job = Job(top, top / "home", top / "run", top / "work" / project.name, top / "toolcache", top / "temp", cache)
    for d in (job.home, job.runtime, job.toolcache, job.temp):
        d.mkdir(parents=True)
    job.runtime.chmod(0o700)
    # The images' rootless podman uses native overlay (podman.sh configures the same for CI's podman user).
    (job.home / ".config" / "containers").mkdir(parents=True)
    (job.home / ".config" / "containers" / "storage.conf").write_text('[storage]\ndriver = "overlay"\n')
    shutil.copytree(project, job.workspace, symlinks=True)
    subprocess.run(["chown", "-R", f"{pw.pw_uid}:{pw.pw_gid}", str(top)], check=True)
    top.chmod(0o755)
    return job


def _runner_env(job: Job, pw: pwd.struct_passwd, path: str, extra: dict) -> list[str]:
    env = {"HOME": str(job.home), "USER": pw.pw_name, "LOGNAME": pw.pw_name, "PATH": path, "LANG": "C.UTF-8",
           "XDG_RUNTIME_DIR": str(job.runtime), "XDG_CACHE_HOME": str(job.cache), "CI": "true", "GITHUB_ACTIONS": "true",
           "GITHUB_WORKSPACE": str(job.workspace), "GITHUB_PATH": str(job.top / "github_path"),
           "GITHUB_ENV": str(job.top / "github_env"), "RUNNER_TEMP": str(job.temp), "RUNNER_OS": "Linux",
           "RUNNER_TOOL_CACHE": str(job.toolcache), "ImageOS": "ubuntu24",
           "pythonLocation": str(job.python_bin.parent), "Python3_ROOT_DIR": str(job.python_bin.parent),
           # No pip configuration of this machine: its files are skipped, and env -i drops its PIP_* variables.
           "PIP_CONFIG_FILE": os.devnull, **extra}
    return ["env", "-i", *(f"{k}={v}" for k, v in env.items())]


def as_runner(job: Job, pw: pwd.struct_passwd, argv: list[str], *, path: str | None = None, env: dict | None = None,
              timeout: float = 1800) -> subprocess.CompletedProcess:
    argv = ["runuser", "-u", pw.pw_name, "--", *_runner_env(job, pw, path or SYSTEM_PATH, env or {}), *argv]
    return subprocess.run(argv, cwd=job.workspace, capture_output=True, text=True, timeout=timeout)


def setup_python(job: Job, pw: pwd.struct_passwd) -> None:
    """actions/setup-python: an interpreter of PYTHON under the tool cache, owned by the runner user."""
    proc = as_runner(job, pw, [HOST_PYTHON, "-m", "venv", "--copies", str(job.python_bin.parent)], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    job.log.append(f"::step:: actions/setup-python played: {job.python_bin}")


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def run_step(job: Job, pw: pwd.struct_passwd, step: Step) -> subprocess.CompletedProcess:
    """One `run:` step as GitHub runs it, with $GITHUB_PATH and $GITHUB_ENV from the steps before."""
    script = job.top / "step.sh"
    script.write_text(step.run)
    script.chmod(0o644)
    path = ":".join([*reversed(_lines(job.top / "github_path")), str(job.python_bin), SYSTEM_PATH])
    exported = dict(line.split("=", 1) for line in _lines(job.top / "github_env") if "=" in line)
    return as_runner(job, pw, ["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)], path=path,
                     env={**exported, **job.env, **step.env})


def run_job(job: Job, pw: pwd.struct_passwd, workflow: dict, row: dict) -> tuple[bool, list[Step]]:
    """Every step of ROW's job in order, stopping at the first that fails (as GitHub does); (passed, steps)."""
    ctx = context(row, job.workspace)
    job.env = {k: substitute(str(v), ctx) for k, v in (workflow["jobs"]["up"].get("env") or {}).items()}
    steps = job_steps(workflow, row, job.workspace)
    for step in steps:
        if step.run is None:
            if step.name.startswith("actions/setup-python"):
                setup_python(job, pw)
            else:
                job.log.append(f"::step:: {step.name}: {step.why}")
            continue
        job.log.append(f"::step:: {step.name}")
        started = time.monotonic()
        proc = run_step(job, pw, step)
        job.log.append(proc.stdout[-4000:] + proc.stderr[-4000:])
        job.log.append(f"::done:: {step.name} in {time.monotonic() - started:.0f} s")
        if proc.returncode != 0:
            job.log.append(f"::failed:: {step.name} (exit {proc.returncode})")
            return False, steps
    return True, steps


def remove_job(job: Job, pw: pwd.struct_passwd) -> None:
    """The job's podman store (in its HOME) and folders; what it built in docker's store is the caller's."""
    as_runner(job, pw, ["podman", "system", "reset", "-f"], timeout=300)
    # Rootless podman's pause process outlives its runtime dir (removed below): end it, by the pid it wrote.
    pause = job.runtime / "libpod" / "tmp" / "pause.pid"
    if pause.is_file() and pause.read_text().strip().isdigit():
        subprocess.run(["kill", pause.read_text().strip()], capture_output=True)
    shutil.rmtree(job.top, ignore_errors=True)

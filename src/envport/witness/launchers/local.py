"""Run witnesses with an interpreter on this host: a venv's bin/python, or sys.executable.

The weights folders a launcher is given are bound read-only for the run where
bubblewrap works (`read_only_argv`: `bwrap --dev-bind / / --ro-bind DIR DIR`),
so a write under them fails with EROFS as in a container's `:ro` mount; where
it does not (no bwrap, unprivileged user namespaces off) the run goes as it is
and the witness is told why the folders stay writable (WRITABLE_ENV).
"""

from __future__ import annotations

import functools
import os
import shutil
import sys
from pathlib import Path
from typing import Mapping, Optional, Sequence

from envport.core.verdict import EXIT_FAILED, StepResult, Verdict
from envport.witness.launchers.base import WITNESS_DIR, Invocation, Launcher


def activated_env(prefix: str | os.PathLike, base: Mapping[str, str]) -> dict[str, str]:
    """What activating a host env gives a process: BASE, the env's bin/ first on PATH,
    VIRTUAL_ENV, and whatever the env's `.envport/env.sh` exports (the spec's env,
    ENVPORT_HASH, ENVPORT_ROOT), read by sourcing it in a real bash so quoting is bash's."""
    from envport.core.errors import EnvportError
    from envport.core.proc import run
    from envport.verify.checks import parse_env0

    prefix = Path(prefix)
    env = dict(base)
    env["PATH"] = f"{prefix / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(prefix)
    script = prefix / ".envport" / "env.sh"
    if script.is_file():
        # Bytes: a value may hold any byte, and a newline (env -0 ends each pair with a NUL).
        ran = run(["bash", "-c", '. "$1" && env -0', "envport-env", str(script)], env=env, timeout=60,
                  binary=True)
        if not ran.ok:
            said = ran.why if ran.returncode is None else \
                (ran.stderr.strip().splitlines() or [f"exit {ran.returncode}"])[-1]
            raise EnvportError(f"{script}: sourcing it in bash failed: {said} (fix: correct the script, or "
                               "rebuild the env it belongs to with `envport build`)", EXIT_FAILED)
        env = {k.decode(errors="surrogateescape"): v.decode(errors="surrogateescape")
               for k, v in parse_env0(ran.stdout).items()}
    return env


# The witness's weight step reads why its folders are writable here from this variable.
WRITABLE_ENV = "ENVPORT_WEIGHTS_WRITABLE"
BWRAP_FIX = "apt install bubblewrap"
# bwrap forwards no signal and, with --die-with-parent, SIGKILLs its child when it dies: so bwrap runs with
# TERM/INT/HUP ignored (a process-group kill then reaches the witness, which can dump its stacks, and bwrap
# exits with it), and the witness's interpreter gets the default dispositions back before it execs.
IGNORE_SIGNALS = 'trap "" TERM INT HUP; exec "$@"'
RESTORE_SIGNALS = ("import os, signal, sys\n"
                   "for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):\n"
                   "    signal.signal(s, signal.SIG_DFL)\n"
                   "os.execv(sys.argv[1], sys.argv[1:])")


def read_only_argv(dirs: Sequence[str], argv: Sequence[str], bwrap: str = "bwrap") -> list[str]:
    """ARGV (an interpreter, then its arguments) under bwrap with each of DIRS bound read-only at itself
    (an absent one is skipped: --ro-bind-try); dies with its parent; signals reach ARGV (IGNORE_SIGNALS)."""
    out = ["/bin/sh", "-c", IGNORE_SIGNALS, "sh", bwrap, "--dev-bind", "/", "/", "--die-with-parent"]
    for folder in dict.fromkeys(dirs):
        out += ["--ro-bind-try", folder, folder]
    return out + ["--", argv[0], "-c", RESTORE_SIGNALS, *argv]


@functools.lru_cache(maxsize=8)
def _bwrap_problem(bwrap: Optional[str]) -> Optional[str]:
    if bwrap is None:
        return f"no bwrap on this host ({BWRAP_FIX})"
    from envport.core.proc import run

    ran = run([bwrap, "--dev-bind", "/", "/", "true"], timeout=30)
    if ran.returncode is None:
        return f"{bwrap} did not run: {ran.why}"
    if ran.returncode != 0:
        said = (ran.stderr.strip().splitlines() or [f"exit {ran.returncode}"])[-1]
        return f"{bwrap} does not work on this host: {said} (unprivileged user namespaces off?)"
    return None


def bwrap_problem(path: Optional[str] = None) -> tuple[Optional[str], Optional[str]]:
    """(bwrap's path, None) where `bwrap --dev-bind / / true` exits 0 (probed once per path), else
    (None, why not) — looked up on PATH (the given one, else this process's)."""
    bwrap = shutil.which("bwrap", path=path)
    problem = _bwrap_problem(bwrap)
    return (None, problem) if problem else (bwrap, None)


class LocalLauncher(Launcher):
    name = "local"

    def __init__(self, python: str | os.PathLike = sys.executable, witness_dir: Path = WITNESS_DIR,
                 base_env: Optional[Mapping[str, str]] = None, missing_fix: str = "",
                 read_only: Sequence[str] = ()):
        self.python = str(python)
        self.read_only = list(read_only)  # host folders (the weights) bound read-only where bwrap works
        self.witness_dir = Path(witness_dir)
        self.base_env = base_env  # None: this process's environment at launch time
        self.missing_fix = missing_fix or "build the env first, or pass --python PATH"

    def witness_path(self, script: str) -> str:
        return str(self.witness_dir / script)

    def invocation(self, script: str, args: Sequence[str], env: Mapping[str, str]) -> Invocation:
        full = dict(os.environ if self.base_env is None else self.base_env)
        full.update(env)
        argv = [self.python, self.witness_path(script), *args]
        if self.read_only:
            bwrap, problem = bwrap_problem(full.get("PATH"))
            if bwrap:
                argv = read_only_argv(self.read_only, argv, bwrap)
            else:
                full[WRITABLE_ENV] = str(problem)
        return Invocation(argv, env=full, label=self.python)

    def preflight(self) -> Optional[StepResult]:
        path = Path(self.python)
        if not (path.is_file() and os.access(path, os.X_OK)):
            return StepResult("launcher", Verdict.REFUSED, f"no interpreter at {self.python}",
                              reason="env_missing", lines=[f"fix: {self.missing_fix}"])
        return None

    def describe(self) -> str:
        return f"local {self.python}"

"""Run witnesses with an interpreter on this host: a venv's bin/python, or sys.executable."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Mapping, Optional, Sequence

from envport.core.verdict import StepResult, Verdict
from envport.witness.launchers.base import WITNESS_DIR, Invocation, Launcher


def activated_env(prefix: str | os.PathLike, base: Mapping[str, str]) -> dict[str, str]:
    """What activating a host env gives a process: BASE, the env's bin/ first on PATH,
    VIRTUAL_ENV, and whatever the env's `.envport/env.sh` exports (the spec's env,
    ENVPORT_HASH, ENVPORT_ROOT), read by sourcing it in a real bash so quoting is bash's."""
    import subprocess

    from envport.verify.checks import parse_env0

    prefix = Path(prefix)
    env = dict(base)
    env["PATH"] = f"{prefix / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(prefix)
    script = prefix / ".envport" / "env.sh"
    if script.is_file():
        out = subprocess.run(["bash", "-c", '. "$1" && env -0', "envport-env", str(script)], env=env,
                             capture_output=True, check=True).stdout
        env = {k.decode(errors="surrogateescape"): v.decode(errors="surrogateescape")
               for k, v in parse_env0(out).items()}
    return env


class LocalLauncher(Launcher):
    name = "local"

    def __init__(self, python: str | os.PathLike = sys.executable, witness_dir: Path = WITNESS_DIR,
                 base_env: Optional[Mapping[str, str]] = None, missing_fix: str = ""):
        self.python = str(python)
        self.witness_dir = Path(witness_dir)
        self.base_env = base_env  # None: this process's environment at launch time
        self.missing_fix = missing_fix or "build the env first, or pass --python PATH"

    def witness_path(self, script: str) -> str:
        return str(self.witness_dir / script)

    def invocation(self, script: str, args: Sequence[str], env: Mapping[str, str]) -> Invocation:
        full = dict(os.environ if self.base_env is None else self.base_env)
        full.update(env)
        return Invocation([self.python, self.witness_path(script), *args], env=full, label=self.python)

    def preflight(self) -> Optional[StepResult]:
        path = Path(self.python)
        if not (path.is_file() and os.access(path, os.X_OK)):
            return StepResult("launcher", Verdict.REFUSED, f"no interpreter at {self.python}",
                              reason="env_missing", lines=[f"fix: {self.missing_fix}"])
        return None

    def describe(self) -> str:
        return f"local {self.python}"

"""The interpreter with torch that the witness tests run, and a check that it is the pinned one.

Witness tests need a real torch: this interpreter when it has torch==2.13.0,
else a venv under .cache/witness-venv (gitignored) created once with
`python -m venv` + `pip install torch==2.13.0`, which takes the CPU wheel from
local disk (~30 s). Never an unpinned torch: a resolver would pull a CUDA build.
Other witness test files import `torch_python` from here.
"""

from __future__ import annotations

import fcntl
import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TORCH_PIN = "2.13.0"
VENV = REPO / ".cache" / "witness-venv"


def _torch_version(python: str) -> str | None:
    try:
        out = subprocess.run([python, "-c", "import torch, sys; sys.stdout.write(torch.__version__)"],
                             capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


@functools.lru_cache(maxsize=1)
def _find_or_make() -> tuple[str | None, str]:
    here = _torch_version(sys.executable)
    if here and here.split("+")[0] == TORCH_PIN:
        return sys.executable, ""
    python = VENV / "bin" / "python"
    VENV.parent.mkdir(parents=True, exist_ok=True)
    with open(VENV.parent / "witness-venv.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # parallel test workers create it once
        version = _torch_version(str(python)) if python.exists() else None
        if version is None:
            steps = [[sys.executable, "-m", "venv", str(VENV)],
                     [str(python), "-m", "pip", "install", "-q", f"torch=={TORCH_PIN}"]]
            for argv in steps:
                proc = subprocess.run(argv, capture_output=True, text=True, timeout=900,
                                      env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
                if proc.returncode != 0:
                    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
                    return None, f"could not create {VENV} with torch=={TORCH_PIN}: {' | '.join(tail)}"
            version = _torch_version(str(python))
        if version is None or version.split("+")[0] != TORCH_PIN:
            return None, f"{python} has torch {version}, expected {TORCH_PIN}"
    return str(python), ""


def torch_python() -> str:
    """An interpreter with torch==2.13.0; skips (with the reason) when none can be had."""
    python, why = _find_or_make()
    if python is None:
        pytest.skip(why)
    return python


def test_witness_interpreter_has_the_pinned_cpu_torch():
    python = torch_python()
    version = _torch_version(python)
    assert version is not None and version.split("+")[0] == TORCH_PIN

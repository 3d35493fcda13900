"""Shared fixtures.  Real services (docker, slurm, sshd) come from tests/services.py."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytest_plugins = ["tests.services"]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A throwaway copy of the project (specs, images, docs, sites, slurm), so tests never touch the checkout."""
    for d in ("specs", "images", "docs", "sites", "slurm"):
        if (REPO / d).is_dir():
            shutil.copytree(REPO / d, tmp_path / d)
    return tmp_path


def envport(*args: str, cwd: Path | None = None, check: bool = False, timeout: float = 120,
            env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess (the way a user does)."""
    proc = subprocess.run([sys.executable, "-m", "envport", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env=env)
    if check and proc.returncode != 0:
        raise AssertionError(f"envport {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc

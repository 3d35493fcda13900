"""Helpers for the docker build/verify/secrets tests (their fixtures: tests/docker_fixtures.py):
project copies with sites/, small specs and site profiles, the CLI in a subprocess."""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from .conftest import REPO

PROJECT_DIRS = ("specs", "images", "docs", "sites")
BUILD_TIMEOUT = 900


def copy_project(dest: Path) -> Path:
    for d in PROJECT_DIRS:
        if (REPO / d).is_dir():
            shutil.copytree(REPO / d, dest / d)
    return dest


def run_envport(*args: str, root: Path, env: dict | None = None, timeout: float = BUILD_TIMEOUT,
                check: bool = False) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "envport", "-C", str(root), *args], cwd=root,
                          capture_output=True, text=True, timeout=timeout, env=env)
    if check and proc.returncode != 0:
        raise AssertionError(f"envport {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


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

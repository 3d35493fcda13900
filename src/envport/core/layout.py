"""Where envport keeps things outside the checkout: host envs and the per-user state.

One definition, so a venv built by `envport build`, verified by `envport
verify` and run by `envport witness` or a Slurm job is always the same folder.
The rendered setup scripts apply the same default in shell
(`${ENVPORT_ENVS_DIR:-$HOME/.envport/envs}`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

ENVS_DIR_VAR = "ENVPORT_ENVS_DIR"
DEFAULT_ENVS_DIR = "~/.envport/envs"


def envs_dir(explicit: Optional[str] = None) -> str:
    """The folder holding host envs: an explicit choice, else $ENVPORT_ENVS_DIR, else ~/.envport/envs (unexpanded)."""
    return explicit or os.environ.get(ENVS_DIR_VAR) or DEFAULT_ENVS_DIR


def env_prefix(name: str, explicit_dir: Optional[str] = None) -> Path:
    """This host's folder for env `name`."""
    return Path(os.path.expanduser(envs_dir(explicit_dir))) / name

"""Launchers: how a witness script is started inside a built env.

A launcher turns (witness script, args, env) into an argv and runs it under a
deadline.  `local` runs a given interpreter on this host (a venv's
bin/python); `docker` runs the image with the witness folder bind-mounted
read-only.  Wrappers such as srun or `apptainer exec --nv` are further
Launcher subclasses that take another launcher's Invocation and prefix it.
"""

from .base import WITNESS_DIR, Invocation, Launcher, LaunchResult, run_with_deadline
from .docker import DockerLauncher
from .local import LocalLauncher

__all__ = [
    "WITNESS_DIR",
    "Invocation",
    "Launcher",
    "LaunchResult",
    "run_with_deadline",
    "LocalLauncher",
    "DockerLauncher",
]

"""Run witnesses in a built image: `docker run --rm --init --network host`, witnesses mounted read-only.

The image stays clean (nothing of envport is baked in): the witness folder is
bind-mounted at run time, and so are the env's weights, read-only, each at its
spec path (the image's ENV already points the weight's variable there).  Each run gets a unique container name so a timeout
or Ctrl-C can remove exactly that container; a killed docker client would
otherwise leave it running.
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Mapping, Optional, Sequence

from envport.core.verdict import StepResult, Verdict
from envport.engines.docker import engine_problem, image_exists
from envport.witness.launchers.base import WITNESS_DIR, Invocation, Launcher

MOUNT_POINT = "/opt/envport/witnesses"


class DockerLauncher(Launcher):
    name = "docker"

    def __init__(self, image: str, python: str = "python3", gpus: bool = False, ipc_host: bool = True,
                 shm_size: Optional[str] = None, docker: str = "docker", witness_dir: Path = WITNESS_DIR,
                 extra_args: Sequence[str] = (), name_prefix: str = "envport-witness", missing_fix: str = "",
                 mounts: Sequence[tuple[str, str]] = ()):
        self.image = image
        self.python = python  # resolved on the image's PATH (its venv comes first there)
        self.gpus = gpus  # the caller decides: the spec asks for GPUs AND the host has them
        self.ipc_host = ipc_host  # ranks share tensors through /dev/shm; 64 MB default is too small
        self.shm_size = shm_size  # used instead of --ipc host when given
        self.docker = docker
        self.witness_dir = Path(witness_dir)
        self.extra_args = list(extra_args)
        self.name_prefix = name_prefix
        self.missing_fix = missing_fix or "envport build NAME --target docker, or pass --image TAG"
        # (host folder, path in the image): weights, mounted read-only so a tool cannot change what was pinned.
        self.mounts = list(mounts)

    def witness_path(self, script: str) -> str:
        return f"{MOUNT_POINT}/{script}"

    def container_name(self) -> str:
        return f"{self.name_prefix}-{uuid.uuid4().hex[:12]}"

    def run_args(self, name: str, env: Mapping[str, str]) -> list[str]:
        """`docker run` options up to (not including) the image: wrappers reuse them."""
        args = ["run", "--rm", "--init", "--network", "host", "--name", name,
                "-v", f"{self.witness_dir}:{MOUNT_POINT}:ro"]
        for host_path, path in self.mounts:
            args += ["-v", f"{host_path}:{path}:ro"]
        if self.shm_size:
            args += ["--shm-size", self.shm_size]
        elif self.ipc_host:
            args += ["--ipc", "host"]
        if self.gpus:
            args += ["--gpus", "all"]
        for key, value in sorted(env.items()):
            args += ["-e", f"{key}={value}"]
        return args + self.extra_args

    def invocation(self, script: str, args: Sequence[str], env: Mapping[str, str]) -> Invocation:
        name = self.container_name()
        argv = [self.docker, *self.run_args(name, env), self.image, self.python,
                self.witness_path(script), *args]
        return Invocation(argv, env=None, cleanup=[[self.docker, "rm", "-f", name]], label=name)

    def preflight(self) -> Optional[StepResult]:
        if shutil.which(self.docker) is None:
            return StepResult("launcher", Verdict.REFUSED, f"no {self.docker} client on PATH",
                              reason="docker_unreachable", lines=["fix: install docker (Debian: docker.io)"])
        problem = engine_problem(self.docker)
        if problem:
            return StepResult("launcher", Verdict.REFUSED, f"the docker engine does not answer: {problem}",
                              reason="docker_unreachable", lines=["fix: start dockerd, or check DOCKER_HOST"])
        if not image_exists(self.image, self.docker):
            return StepResult("launcher", Verdict.REFUSED, f"image {self.image} is not on this engine",
                              reason="image_missing",
                              lines=[f"fix: {self.missing_fix}"])
        return None

    def describe(self) -> str:
        return f"docker {self.image}" + (" --gpus all" if self.gpus else "")





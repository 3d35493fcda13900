"""`podman run` for witnesses: the docker launcher's options (podman takes them as docker does), a private
/dev/shm instead of --ipc host (rootless podman has no /dev/mqueue here), and podman's own preflight."""

from __future__ import annotations

from typing import Optional

from envport.core.verdict import StepResult, Verdict
from envport.engines import podman as engine
from envport.witness.launchers.docker import DockerLauncher

NAME = "podman"

class PodmanLauncher(DockerLauncher):
    """`podman run` with the docker launcher's options and podman's own preflight."""

    name = NAME

    def preflight(self) -> Optional[StepResult]:
        refused = engine.problem("launcher")
        if refused is not None:
            return refused
        if engine.image(self.image) is None:
            return StepResult("launcher", Verdict.REFUSED, f"image {self.image} is not in this user's podman "
                              "storage", reason="image_missing", lines=[f"fix: {self.missing_fix}"])
        return None

    def describe(self) -> str:
        return f"podman {self.image}"


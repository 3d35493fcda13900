"""Local base images built from Debian (debootstrap + docker import).

For offline sites and the tests: no registry is needed.  The work is done by
the packaged script data/debian-base-image.sh (debootstrap is a shell tool;
the script locks, caches the rootfs tarball so a re-import takes seconds, and
bounds every wait); this module gives it envport's verdicts.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from envport.core.proc import run, spawn
from envport.core.progress import Progress, tail
from envport.core.verdict import StepResult, Verdict

SCRIPT = Path(__file__).parent / "data" / "debian-base-image.sh"
RECIPES = {"debian-bookworm": "envport/debian-bookworm:base"}


def build_base(name: str, progress: Progress, tag: str | None = None, rebuild: bool = False) -> StepResult:
    # Imported here: `envport --help` registers this command and must not pay for the engine module.
    from envport.engines.docker import engine_problem, image_exists

    tag = tag or RECIPES[name]
    step = f"base {name}"
    start = time.monotonic()
    if not shutil.which("docker"):
        return StepResult(step, Verdict.REFUSED, "no docker client; apt-get install docker.io",
                          reason="docker_unreachable")
    problem = engine_problem()
    if problem:
        return StepResult(step, Verdict.REFUSED, f"the docker engine does not answer ({problem}); "
                          "start dockerd or set DOCKER_HOST", reason="docker_unreachable")
    if image_exists(tag):
        if not rebuild:
            return StepResult(step, Verdict.PRESENT, tag, seconds=time.monotonic() - start)
        run(["docker", "image", "rm", tag], timeout=120)  # the import below replaces it either way
    if not shutil.which("debootstrap"):
        return StepResult(step, Verdict.REFUSED, "debootstrap is not installed; apt-get install debootstrap",
                          reason="no_debootstrap")
    progress(f"envport: [base] {tag}: debootstrap + docker import (30-60 s cold, seconds from the cached rootfs)")
    proc = spawn(["bash", str(SCRIPT), tag], text=True)
    lines = []
    assert proc.stdout
    for line in proc.stdout:
        lines.append(line.rstrip("\n"))
        progress(f"envport: [base] {lines[-1]}")
    if proc.wait() != 0:
        return StepResult(step, Verdict.FAILED, "building the base image failed", lines=tail("\n".join(lines)),
                          seconds=time.monotonic() - start)
    return StepResult(step, Verdict.OK, tag, seconds=time.monotonic() - start)

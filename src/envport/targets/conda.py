"""conda: the rendered setup-conda.sh run here, or on an SSH host (--host), with micromamba, mamba or conda."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Optional

from envport.targets.base import GC, PUSH, SBOM, SLURM, WITNESS
from envport.targets.host import HostTarget

SOLVERS = ("micromamba", "mamba", "conda")


class Conda(HostTarget):
    name = "conda"
    summary = "a conda env made by micromamba, mamba or conda from images/<name>/setup-conda.sh, here or on an SSH host"
    probe_env_keys = ("PATH", "HOME", "LANG")
    hosted_job_unplayed = ("a conda job on a hosted ubuntu-24.04 runner (its own $CONDA and channels) is not played "
                           "by envport's faithful-runner test, which every emitted hosted job passes (no conda "
                           "channel is reachable where envport is tested)")
    unsupported = {
        WITNESS: "envport has no witness launcher for a conda env yet (verify checks its contents; "
                 "the witnesses run in docker, venv and apptainer envs)",
        SLURM: "witness/slurm_job.py has no conda task wrapper yet (the job activates a venv or runs a container)",
        GC: "a conda env is one per name, replaced whole by its next build: no old hash is left beside it "
            "(`micromamba env remove -n NAME` removes the env itself)",
        PUSH: "a conda env is a folder of this host, not an image or SIF a registry holds (push --target docker, "
              "podman or apptainer)",
        SBOM: "the SBOM reader knows a venv's site-packages and a container's dpkg status, not a conda "
              "prefix's conda-meta yet (sbom --target venv, docker, podman or apptainer)",
    }

    def env_disk(self, spec, project_root):
        return Path.home()  # micromamba's root prefix and pkgs cache sit under $HOME by default

    def runtime_what(self, spec) -> str:
        return "micromamba, mamba or conda"

    def runtime_findings(self, ctx) -> list:
        from envport.core.finding import Finding

        if ctx.host:
            return []  # the remote setup script refuses with its own reason (no_conda)
        if not any(shutil.which(c) for c in SOLVERS):
            return [Finding("runtime_missing", "no micromamba, mamba or conda on PATH",
                            "install micromamba, or use --target venv")]
        return []

    def parity_unavailable(self) -> Optional[str]:
        if not any(shutil.which(c) for c in SOLVERS):
            return "no_conda: no micromamba, mamba or conda on PATH"
        return None

    def probe_script(self, prefix: str) -> str:
        return (f"P={prefix}; [ -f \"$P/.envport/env.sh\" ] && . \"$P/.envport/env.sh\"; "
                "exec \"$P/bin/python\" - \"$@\"")


TARGET = Conda()

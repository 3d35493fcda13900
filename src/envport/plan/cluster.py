"""Cluster profiles (slurm/clusters/<name>.yaml): how to get a job onto one cluster, validated like a spec."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator

from envport.core.errors import EnvportError
from envport.spec.yamlfile import load_model

CLUSTERS_DIR = Path("slurm") / "clusters"
# Slurm's words that are safe inside a #SBATCH line without quoting tricks.
_SLURM_WORD = re.compile(r"^[A-Za-z0-9_.,:@%+=/-]+$")
_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|m|h)?$")
_MEM = re.compile(r"^\d+[KMGT]?$")


def parse_duration(value) -> float:
    """Seconds from 90, "90s", "2m", "1.5h"."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    m = _DURATION.match(str(value).strip())
    if not m:
        raise ValueError(f"{value!r} is not a duration; write seconds (90) or 90s, 2m, 1h")
    return float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, None: 1}[m.group(2)]


def slurm_time_seconds(value: str) -> float:
    """Seconds of a Slurm time limit: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS."""
    m = _TIME.match(value)
    if not m:
        raise ValueError(f"{value!r} is not a Slurm time (MM, HH:MM:SS or D-HH:MM:SS)")
    days, a, b, c = m.group(1), int(m.group(2)), m.group(3), m.group(4)
    if days is not None:  # D-HH[:MM[:SS]]
        return int(days) * 86400 + a * 3600 + int(b or 0) * 60 + int(c or 0)
    if c is not None:  # HH:MM:SS
        return a * 3600 + int(b) * 60 + int(c)
    if b is not None:  # MM:SS
        return a * 60 + int(b)
    return a * 60  # MM


class ClusterProfile(BaseModel):
    """slurm/clusters/<name>.yaml: how to get a job onto one cluster. Unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    description: str = ""
    partition: Optional[str] = Field(default=None, description="sbatch --partition")
    account: Optional[str] = Field(default=None, description="sbatch --account")
    time: str = Field(default="00:30:00", description="sbatch --time (MM, HH:MM:SS, D-HH:MM:SS)")
    gres: Optional[str] = Field(default=None, description="sbatch --gres, e.g. gpu:4")
    cpus: int = Field(default=1, ge=1, le=4096, description="sbatch --cpus-per-task")
    mem: Optional[str] = Field(default=None, description="sbatch --mem per node, e.g. 64G")
    constraint: Optional[str] = Field(default=None, description="sbatch --constraint (node features)")
    activation: list[str] = Field(default=[], description="shell lines run in the job before the tasks")
    container_runtime: Literal["docker", "apptainer", "none"] = Field(
        default="none", description="what runs container targets on the nodes")
    envs_dir: Optional[str] = Field(default=None, description="ENVPORT_ENVS_DIR of venv envs on the nodes "
                                    "(default: this shell's, else ~/.envport/envs)")
    cache_dir: str = Field(default="~/.cache/envport/slurm", description="job folders; shared with the nodes")
    tmp_dir: Optional[str] = Field(default=None, description="TMPDIR inside the job")
    max_pending: float = Field(default=600.0, gt=0, description="seconds (or 90s/10m/1h) a job may stay "
                               "PENDING before it is cancelled and REFUSED")
    slurm_conf: Optional[str] = Field(default=None, description="SLURM_CONF for every Slurm command envport runs "
                                      "and inside the job: a cluster whose slurm.conf is not the default one")
    env: dict[str, str] = Field(default={}, description="environment of every task (docker: -e), e.g. "
                                "GLOO_SOCKET_IFNAME: the interface of the network between the nodes")
    docker_master_addr: Optional[str] = Field(
        default=None, description="MASTER_ADDR of docker tasks instead of the first node's address: where "
        "`docker run --network host` puts containers in a network the nodes are not in (nodes emulated in "
        "network namespaces: dockerd's is the host's)")

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        for key in v:
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
                raise ValueError(f"{key!r} is not an environment variable name")
        return v

    @field_validator("partition", "account", "gres", "mem", "constraint")
    @classmethod
    def _slurm_word(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not _SLURM_WORD.match(v):
            raise ValueError(f"{v!r}: use letters, digits and _ . , : @ % + = / - only")
        return v

    @field_validator("mem")
    @classmethod
    def _mem(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not _MEM.match(v):
            raise ValueError(f"{v!r} is not a Slurm memory size (e.g. 4000, 16G)")
        return v

    @field_validator("time")
    @classmethod
    def _time(cls, v: str) -> str:
        slurm_time_seconds(v)
        return v

    @field_validator("max_pending", mode="before")
    @classmethod
    def _duration(cls, v):
        return parse_duration(v)

    @property
    def time_s(self) -> float:
        return slurm_time_seconds(self.time)


def packaged_clusters_dir() -> Path:
    from importlib.resources import files

    return Path(str(files("envport.slurm_files"))) / "clusters"


def cluster_names(root: Optional[Path]) -> list[str]:
    names = set()
    for d in ([root / CLUSTERS_DIR] if root else []) + [packaged_clusters_dir()]:
        if d.is_dir():
            names |= {p.stem for p in d.glob("*.yaml")}
    return sorted(names)


def load_cluster(ref: str, root: Optional[Path]) -> ClusterProfile:
    """A profile by name (the project's slurm/clusters/, then the packaged ones) or by path."""
    if ref.endswith((".yaml", ".yml")):
        path = Path(ref)
    else:
        candidates = ([root / CLUSTERS_DIR / f"{ref}.yaml"] if root else []) + \
                     [packaged_clusters_dir() / f"{ref}.yaml"]
        path = next((p for p in candidates if os.path.lexists(p)), candidates[0])
    # lexists, not is_file: a directory, FIFO or unreadable file is reported by the reader, not as missing.
    if not os.path.lexists(path):
        known = ", ".join(cluster_names(root)) or "none"
        raise EnvportError(f"cluster profile {path} not found (known: {known}); "
                           f"copy slurm/clusters/example-gpu.yaml to slurm/clusters/{ref}.yaml")
    return load_model(path, ClusterProfile, "cluster profile", "slurm/clusters/example-gpu.yaml")

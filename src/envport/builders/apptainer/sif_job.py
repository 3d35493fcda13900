"""The batch job that builds an env's SIF on a cluster node (`envport slurm build`)."""

from __future__ import annotations

import os
from pathlib import Path

from envport.engines.slurm import sbatch_jinja
from envport.plan.cluster import ClusterProfile


def render_sif_build(name: str, hash12: str, profile: ClusterProfile, job_dir: Path, context: Path, def_name: str,
                     sif: Path) -> str:
    """The batch script that builds SIF with `apptainer build [--fakeroot]` on a node, APPTAINER_CACHEDIR and
    APPTAINER_TMPDIR under the cluster profile's cache_dir and tmp_dir."""
    cache = Path(os.path.expanduser(profile.cache_dir))
    directives = [("--job-name", f"envport-sif-{name}"), ("--output", str(job_dir / "job.log")), ("--ntasks", "1"),
                  ("--cpus-per-task", str(profile.cpus)), ("--time", profile.time)]
    for flag, value in (("--partition", profile.partition), ("--account", profile.account),
                        ("--mem", profile.mem), ("--constraint", profile.constraint)):
        if value:
            directives.append((flag, value))
    return sbatch_jinja().get_template("sif-build.sbatch.j2").render(
        name=name, hash12=hash12, cluster=profile.name, directives=directives, context=str(context),
        def_name=def_name, sif=str(sif), sif_dir=str(sif.parent), partial=str(sif.parent / f".{sif.name}.partial"),
        cache_dir=str(cache / "apptainer-cache"), tmp_dir=str(Path(profile.tmp_dir or cache) / "apptainer-tmp"),
        activation=profile.activation, script_path=str(job_dir / "job.sbatch"), log_path=str(job_dir / "job.log"))

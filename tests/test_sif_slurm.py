"""The Slurm templates for SIFs: the build job (`envport slurm build`) and the witness job's SIF cleanup.

Rendered with --dry-run and checked as scripts (bash -n, shellcheck where installed); the build job
itself needs apptainer on a node, which no machine here has: its run is not tested.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from .support import REPO, run_envport


def _check_script(text: str, tmp_path) -> None:
    path = tmp_path / "job.sbatch"
    path.write_text(text)
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0
    if shutil.which("shellcheck"):
        proc = subprocess.run(["shellcheck", "-S", "warning", str(path)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout


def test_sif_build_job_uses_the_profile_dirs_and_never_leaves_a_partial(tmp_path):
    proc = run_envport("slurm", "build", "demo-cpu", "--cluster", "local", "--dry-run", root=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert "export APPTAINER_CACHEDIR=/var/tmp/envport-slurm/apptainer-cache" in text
    assert "export APPTAINER_TMPDIR=/tmp/apptainer-tmp" in text
    assert '"$APPTAINER" build --force "${FAKEROOT[@]}" "$PARTIAL" demo-cpu.def' in text
    assert "trap 'rm -f \"$PARTIAL\"' EXIT" in text and "#SBATCH --partition=debug" in text
    _check_script(text, tmp_path)


def test_witness_job_with_the_sif_launcher_unmounts_in_its_cleanup(tmp_path):
    if shutil.which("mksquashfs") is None:
        pytest.skip("mksquashfs not installed (apt-get install squashfs-tools)")
    from envport.sif.format import write_sif

    (tmp_path / "tree").mkdir()
    subprocess.run(["mksquashfs", str(tmp_path / "tree"), str(tmp_path / "x.sqfs"), "-noappend", "-quiet",
                    "-no-progress"], check=True)
    sif = tmp_path / "x.sif"  # the launcher reads the partition's offset from it
    write_sif(sif, deffile=b"Bootstrap: docker\nFrom: x\n", inspect_metadata=b"{}", squashfs_path=tmp_path / "x.sqfs",
              created=0, uuid=b"\0" * 16)
    proc = run_envport("slurm", "submit", "demo-cpu", "--cluster", "local", "--target", "apptainer", "--sif",
                       str(sif), "--check", "collectives", "--dry-run", root=REPO, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = proc.stdout
    assert "\n  envport_sif_sweep /tmp/envport-sif-" in text  # the EXIT trap (tests/test_security_mounts.py: F7)
    assert "ch-run" in text and "/.singularity.d/actions/exec python3 /mnt/dist.py" in text
    _check_script(text, tmp_path)

"""The docs level inside a Slurm job (issue 40): the doc's transcripts run on the node, inside the env there,
through the same task launchers as the CLI witnesses, with the weights from the weights root the nodes share
(on CI's one-node cluster, this host's); one row per doc, judged as a local run is. The session's venv and
docker image (no env is built here)."""

from __future__ import annotations

import re

import pytest
import yaml

from .support import ENV_NAME, cli_env, copy_project
from .test_docs_witness import DOC_STEP, DRIFTED, drift_lines
from .test_slurm import jobs_dir, submit, write_profile  # noqa: F401  (the module's job folder)


def _docs_row(out: dict, step: str = DOC_STEP) -> dict:
    steps = {s["step"]: s for s in out["steps"]}
    assert step in steps, steps
    assert steps[f"slurm job {out['job_id']}"]["verdict"] == "OK", steps
    return steps[step]


@pytest.mark.slurm
def test_the_demo_doc_passes_in_a_slurm_job_with_the_venv(slurm, local_venv, jobs_dir):
    root = local_venv.root
    name = write_profile(root, "t-docs-venv", jobs_dir)
    code, out, err = submit(root, "--cluster", name, "--target", "venv", "--check", "docs", "--no-ledger",
                            env=cli_env(ENVPORT_ENVS_DIR=local_venv.envs_dir))
    row = _docs_row(out)
    assert code == 0 and row["verdict"] == "OK", (row, err[-3000:])
    assert row["data"]["commands"] == 8 and row["data"]["norun"] == 1, row


@pytest.mark.slurm
@pytest.mark.docker
def test_the_demo_doc_passes_in_a_slurm_job_with_docker_run(slurm, demo_image, jobs_dir):
    root = demo_image.root
    name = write_profile(root, "t-docs-docker", jobs_dir)
    code, out, err = submit(root, "--cluster", name, "--target", "docker", "--image", demo_image.tag, "--check",
                            "docs", "--no-ledger")
    row = _docs_row(out)
    assert code == 0 and row["verdict"] == "OK", (row, err[-3000:])


@pytest.mark.slurm
def test_a_drifted_doc_fails_in_a_slurm_job_naming_each_line(slurm, local_venv, jobs_dir, tmp_path):
    # A copy of the project whose spec names a drifted doc; the venv on the nodes is the session's.
    root = copy_project(tmp_path / "project")
    doc = "files/demo-cpu/DRIFTED.md"
    (root / "specs" / doc).write_text(DRIFTED)
    spec = root / "specs" / f"{ENV_NAME}.yaml"
    data = yaml.safe_load(spec.read_text())
    data["witnesses"]["docs"] = [doc]
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    name = write_profile(root, "t-docs-drift", jobs_dir)
    code, out, _ = submit(root, "--cluster", name, "--target", "venv", "--check", "docs", "--no-ledger",
                          env=cli_env(ENVPORT_ENVS_DIR=local_venv.envs_dir))
    row = _docs_row(out, f"docs {doc}")
    said = [re.sub(r" \(\+\d+ more\)$", "", row["detail"])] + row["lines"]
    assert code == 1 and row["verdict"] == "FAILED", row
    for line in drift_lines(doc):
        assert line in said, (line, said)

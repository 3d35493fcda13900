"""envport doctor: runs on this host, validates against its committed schema, maps GPU counts."""

from __future__ import annotations

import json
import shutil

import jsonschema
import pytest

from envport.report.doctor import collect, env_arch, gpu_configurations, render_infra_md, render_text
from .support import REPO, run_envport, torch_python

SCHEMA = json.loads((REPO / "docs" / "doctor.schema.json").read_text())
NO_GPU = shutil.which("nvidia-smi") is None


def validate(report: dict) -> None:
    jsonschema.validate(report, SCHEMA, cls=jsonschema.Draft202012Validator)


def test_schema_is_a_valid_schema():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


@pytest.mark.parametrize("free,tier,route,mesh", [
    (0, "none", "slurm", None), (1, "none", "slurm", None), (3, "none", "slurm", None),
    (4, "limited", "local", [2, 2]), (7, "limited", "local", [2, 2]),
    (8, "full", "local", [2, 2]), (9, "full", "local", [3, 3]),
])
def test_gpu_count_maps_to_configurations(free, tier, route, mesh):
    t = gpu_configurations(free)
    assert (t["tier"], t["route"], t["mesh_2d"]) == (tier, route, mesh)
    assert t["cpu_gloo"] is True


def test_cli_text_runs_here(project):
    infra = project / "docs" / "infra.md"
    before = infra.read_text() if infra.exists() else None
    proc = run_envport("doctor", "--no-torch", root=project, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "verdict:" in out and "/dev/shm" in out and "disk:" in out
    if NO_GPU:
        assert "no GPU" in out and "Slurm" in out
    assert (infra.read_text() if infra.exists() else None) == before  # only --write-docs writes it


def test_cli_json_validates(project):
    proc = run_envport("doctor", "--json", "--no-torch", root=project, timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    validate(report)
    if NO_GPU:
        assert report["gpus"]["gpus"] == [] and report["testable"]["route"] == "slurm"
        assert "Slurm" in report["verdict"]


def test_torch_probe_validates_with_an_interpreter_that_has_torch():
    report = collect(python=torch_python())
    validate(report)
    assert report["torch"]["available"] and report["torch"]["version"].startswith("2.13.0")
    assert report["torch"]["gloo"] and report["torch"]["dtensor"]
    text = render_text(report)
    assert "torch 2.13.0" in text


def test_missing_torch_is_reported_not_fatal(tmp_path):
    report = collect(python=str(tmp_path / "no-such-python"))
    validate(report)
    assert report["torch"]["available"] is False and report["torch"]["error"]


def test_env_arch_verdict_without_a_gpu(project):
    proc = run_envport("doctor", "--json", "--no-torch", "--env", "cuda-torch", root=project, timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    validate(report)
    env = report["env"]
    assert env["flavour"] == "cu124" and env["ok"] is True and "sm_90" in env["arch_list"]


def test_env_arch_refuses_a_range_the_build_cannot_cover(project):
    spec = project / "specs" / "cuda-torch.yaml"
    spec.write_text(spec.read_text().replace("sm_range: [sm_50, sm_90]", "sm_range: [sm_80, sm_120]"))
    proc = run_envport("doctor", "--no-torch", "--env", "cuda-torch", root=project, timeout=120)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "REFUSED" in proc.stdout and "sm_120" in proc.stdout


def test_env_arch_unknown_flavour_is_not_a_refusal():
    from envport.spec.model import Spec

    spec = Spec(name="x", base="debian:bookworm", python="3.11", pip_phases=[["torch==2.13.0"]],
                sm_range=["sm_80", "sm_90"])
    e = env_arch(spec)
    assert e["ok"] is None and "probe" in e["detail"]


def test_write_docs_writes_infra_md(project):
    (project / "docs" / "infra.md").unlink(missing_ok=True)
    proc = run_envport("doctor", "--no-torch", "--write-docs", root=project, timeout=120)
    assert proc.returncode == 0, proc.stderr
    text = (project / "docs" / "infra.md").read_text()
    assert "## Launch recipe" in text and "TORCH_NCCL_ASYNC_ERROR_HANDLING=1" in text
    assert "srun" in text and "MASTER_PORT" in text


def test_infra_md_from_a_gpu_report_names_the_mesh():
    report = collect(probe_torch=False)
    report["gpus"]["gpus"] = [{"index": i, "uuid": f"GPU-{i}", "name": "NVIDIA H200", "memory_total_mib": 143771.0,
                               "memory_used_mib": 0.0, "compute_capability": "9.0", "processes": 0,
                               "in_use": False} for i in range(4)]
    report["testable"] = gpu_configurations(4)
    validate(report)
    text = render_infra_md(report)
    assert "tier limited" in text and "H200" in text

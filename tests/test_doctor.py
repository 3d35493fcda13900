"""envport doctor: runs on this host, validates against its committed schema, maps GPU counts."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import jsonschema
import pytest

from envport.report.doctor import (collect, driver_check, env_arch, gpu_configurations, render_infra_md, render_text,
                                   usable_gpus)
from .fake_gpu import H200, TOPO_4_NVLINK, fake_nvidia_smi, path_with
from .support import REPO, run_envport, torch_python

SCHEMA = json.loads((REPO / "docs" / "doctor.schema.json").read_text())
NO_GPU = shutil.which("nvidia-smi") is None


def validate(report: dict) -> None:
    jsonschema.validate(report, SCHEMA, cls=jsonschema.Draft202012Validator)


def test_schema_is_a_valid_schema():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


@pytest.mark.parametrize("free,tier,route,mesh", [
    (0, "none", "slurm", None), (1, "basic", "local", None), (3, "basic", "local", None),
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

    # A torch newer than the recorded lists: judged unknown (probe the env), never guessed.
    spec = Spec(name="x", base="debian:bookworm", python="3.11", pip_phases=[["torch==2.14.0"]],
                sm_range=["sm_80", "sm_90"])
    e = env_arch(spec)
    assert e["ok"] is None and "probe" in e["detail"] and e["flavour"] is None


def test_env_arch_of_a_pypi_torch_213_uses_its_cu130_list():
    from envport.spec.model import Spec

    spec = Spec(name="x", base="debian:bookworm", python="3.11", pip_phases=[["torch==2.13.0"]],
                sm_range=["sm_70", "sm_90"])
    e = env_arch(spec)
    assert e["flavour"] == "cu130" and e["ok"] is False and "sm_70" in e["detail"]


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
    assert "2-D mesh 2x2 on NCCL here" in text and "tier limited" in text
    assert "[3] NVIDIA H200, cc 9.0, 143771 MiB, free" in text


# --- a fake nvidia-smi on PATH (no GPU can be had here; tests/fake_gpu.py) -------------------


def doctor_with(tmp_path, project, gpus, *args, **smi):
    fake_nvidia_smi(tmp_path / "bin", gpus, **smi)
    env = {**os.environ, "PATH": path_with(tmp_path / "bin")}
    return run_envport("doctor", "--no-torch", *args, root=project, env=env, timeout=120)


@pytest.mark.parametrize("n,tier,route", [(0, "none", "slurm"), (1, "basic", "local"), (4, "limited", "local")])
def test_route_follows_the_gpus_nvidia_smi_lists(tmp_path, project, n, tier, route):
    proc = doctor_with(tmp_path, project, [dict(H200) for _ in range(n)], "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    validate(report)
    assert (report["testable"]["tier"], report["testable"]["route"]) == (tier, route)
    assert report["census"] == {"nvidia_smi": n, "torch": None, "count": n, "where": "this host", "note": ""}
    if n == 1:
        assert report["testable"]["note"].startswith("1 free GPU: the kernel witness, NCCL up to world 1")


@pytest.mark.parametrize("n", [0, 1, 4])
def test_write_docs_for_each_gpu_count(tmp_path, project, n):
    proc = doctor_with(tmp_path, project, [dict(H200) for _ in range(n)], "--write-docs",
                       topo=TOPO_4_NVLINK if n == 4 else None)
    assert proc.returncode == 0, proc.stderr
    text = (project / "docs" / "infra.md").read_text()
    expect = {0: "**0 free GPU(s), tier none, route slurm**", 1: "**1 free GPU(s), tier basic, route local**",
              4: "**4 free GPU(s), tier limited, route local**"}[n]
    assert expect in text
    if n == 4:
        assert "GPU0 <-> GPU1: NV18 (nvlink: 18 NVLink(s))" in text
        assert "GPU1 <-> GPU3: PIX (pcie: one PCIe switch)" in text


def test_write_docs_with_na_memory(tmp_path, project):
    """--write-docs crashed on [N/A] memory (TypeError formatting None)."""
    na = dict(H200, memory_total="[N/A]", memory_used="[N/A]", uuid="[N/A]")
    proc = doctor_with(tmp_path, project, [na], "--write-docs", driver="[N/A]")
    assert proc.returncode == 0, proc.stderr
    text = (project / "docs" / "infra.md").read_text()
    assert "[0] NVIDIA H200, cc 9.0, ? MiB, free" in text and "driver ?" in text
    assert "? MiB" in proc.stdout  # the text report too


def test_torch_sees_a_gpu_nvidia_smi_does_not(tmp_path, project):
    """A sandbox (gVisor) without nvidia-smi: the GPU torch sees is routed locally.  The torch
    probe's answer is a fake interpreter printing what torch 2.11.0+cu130 printed on such a host
    (an H200's reading); no CUDA torch can run here."""
    fake = tmp_path / "fake-python"
    rec = {"python": str(fake), "python_version": "3.12.3", "available": True, "version": "2.11.0+cu130",
           "cuda": "13.0", "arch_list": ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"],
           "cuda_available": True, "warnings": [], "devices": [{"index": 0, "name": "NVIDIA H200", "capability": "9.0"}],
           "nccl": "2.27.7", "distributed": True, "gloo": True, "nccl_backend": True, "dtensor": True}
    fake.write_text(f"#!/bin/sh\necho 'ENVPORT-DOCTOR {json.dumps(rec)}'\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": "/usr/bin:/bin"}  # no nvidia-smi
    proc = run_envport("doctor", "--json", "--python", str(fake), root=project, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    validate(report)
    assert report["census"]["count"] == 1 and report["census"]["nvidia_smi"] is None
    assert (report["testable"]["tier"], report["testable"]["route"]) == ("basic", "local")
    assert report["arch"][0]["detail"] == "sm_90 runs via sm_90"
    assert report["driver"]["floor"] == "580" and report["driver"]["ok"] is None
    proc = run_envport("doctor", "--python", str(fake), "--write-docs", root=project, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "GPUs torch sees: 1 ([0] NVIDIA H200 cc 9.0)" in proc.stdout
    text = (project / "docs" / "infra.md").read_text()
    assert "- GPUs torch sees: 1 ([0] NVIDIA H200, cc 9.0)" in text
    assert "**1 free GPU(s), tier basic, route local**" in text


@pytest.mark.parametrize("driver,driver_cuda,torch_cuda,ok,floor", [
    ("550.54.15", "12.4", "13.0", False, "580"),  # a cu130 wheel on an R550 driver
    ("580.95.05", "13.0", "13.0", True, "580"),
    ("570.26", "12.8", "12.8", True, "525.60.13"),
    ("520.61.05", "11.8", "12.4", False, "525.60.13"),
    (None, None, "12.8", None, "525.60.13"),  # no nvidia-smi: the floor is still named
    ("550.54.15", "12.4", None, None, None),  # CPU torch: nothing to meet
])
def test_driver_against_torchs_cuda_build(driver, driver_cuda, torch_cuda, ok, floor):
    d = driver_check(driver, driver_cuda, torch_cuda)
    assert (d["ok"], d["floor"]) == (ok, floor)
    if ok is False:
        assert f">= {floor}" in d["detail"] and "fix: upgrade the driver" in d["detail"]


# --- nvidia-smi and torch disagree (issue 28, defect 4) ------------------------------------


@pytest.mark.parametrize("n", [1, 8])
def test_gpus_a_cpu_torch_cannot_use_are_not_testable(tmp_path, project, n):
    """nvidia-smi (fake) lists N H200s; the probed torch is the real CPU build.  The doctor claimed "kernel
    witness, NCCL up to world N run here, route local"; it now counts what torch can use and says why."""
    fake_nvidia_smi(tmp_path / "bin", [dict(H200) for _ in range(n)])
    env = {**os.environ, "PATH": path_with(tmp_path / "bin")}
    proc = run_envport("doctor", "--json", "--python", torch_python(), root=project, env=env, timeout=180)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    validate(report)
    t = report["testable"]
    assert (t["free_gpus"], t["tier"], t["route"]) == (0, "none", "slurm")
    assert f"nvidia-smi lists {n} free GPU(s) but torch 2.13.0+cpu" in t["note"]
    assert "can use 0: it is a CPU-only build; counted 0" in t["note"]
    assert "kernel witness" not in report["verdict"] and "NCCL up to" not in report["verdict"]


def test_usable_gpus_names_the_cause_and_trusts_nvidia_smi_only_without_torch(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    cuda = {"available": True, "version": "2.11.0+cu130", "cuda": "13.0", "python": "py", "devices": []}
    assert usable_gpus(2, cuda, {"ok": False}) == (
        0, "nvidia-smi lists 2 free GPU(s) but torch 2.11.0+cu130 in py can use 0: the driver is older than its "
           "CUDA 13.0 build; counted 0")
    one = dict(cuda, devices=[{"index": 0}])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert usable_gpus(4, one, {"ok": True})[1].endswith("CUDA_VISIBLE_DEVICES='0' hides the rest; counted 1")
    assert usable_gpus(1, one, {"ok": True}) == (1, "")
    broken = {"available": False, "error": "ImportError: libcudart.so.13: cannot open shared object file"}
    assert usable_gpus(1, broken, {}) == (
        1, "counted by nvidia-smi alone: torch could not be probed (ImportError: libcudart.so.13: cannot open "
           "shared object file)")
    assert usable_gpus(0, broken, {}) == (0, "")


def test_text_rendered_from_saved_json_probes_nothing(tmp_path, project):
    """gpu-check.sh probes once and renders the text from the same JSON (issue 28, defect 2)."""
    proc = run_envport("doctor", "--json", "--no-torch", root=project, timeout=120)
    saved = tmp_path / "doctor.json"
    saved.write_text(proc.stdout)
    again = run_envport("doctor", "--from-json", str(saved), root=project, timeout=60)
    assert again.returncode == 0, again.stderr
    report = json.loads(proc.stdout)
    assert again.stdout == render_text(report)
    saved.write_text("{}")
    bad = run_envport("doctor", "--from-json", str(saved), root=project, timeout=60)
    assert bad.returncode == 2 and f"{saved}: not a saved `envport doctor --json` report" in bad.stderr


def test_infra_md_names_paths_relative_to_the_root_or_home(tmp_path):
    """docs/infra.md is committed: it named this machine's checkout and venv by absolute path (defect 10)."""
    report = collect(probe_torch=False, workdir=tmp_path)
    report["torch"] = {**report["torch"], "python": str(tmp_path / ".cache" / "witness-venv" / "bin" / "python")}
    text = render_infra_md(report, tmp_path)
    assert "`.cache/witness-venv/bin/python`" in text and "free at `.`" in text
    assert str(tmp_path) not in text
    report["torch"]["python"] = str(Path.home() / "venvs" / "t" / "bin" / "python")
    assert "`~/venvs/t/bin/python`" in render_infra_md(report, tmp_path)


# --- the text report, exact (the template in report/doctor.txt.j2 renders it) ---------------------

FULL_REPORT = {
    "host": {"hostname": "node1", "platform": "Linux", "machine": "x86_64", "cpus": 16, "python": "3.11.7"},
    "gpus": {"nvidia_smi": "/usr/bin/nvidia-smi", "driver": "580.65", "cuda_driver": "13.0", "error": None,
             "odd": [], "gpus": [
                 {"index": 0, "uuid": "GPU-0", "name": "NVIDIA H200", "memory_total_mib": 143771.0,
                  "memory_used_mib": 0.0, "compute_capability": "9.0", "processes": 0, "in_use": False},
                 {"index": 1, "uuid": None, "name": "NVIDIA H200", "memory_total_mib": None,
                  "memory_used_mib": None, "compute_capability": None, "processes": 1, "in_use": True}]},
    "census": {"nvidia_smi": 2, "torch": 2, "count": 2, "where": "this host", "note": "one GPU in use"},
    "topology_pairs": [{"a": 0, "b": 1, "link": "NV18", "kind": "nvlink", "via": "18 NVLink(s)"}],
    "topology": "\tGPU0\tGPU1\nGPU0\t X \tNV18",
    "torch": {"python": "/env/bin/python", "available": True, "version": "2.11.0+cu130", "cuda": "13.0",
              "nccl": None, "cuda_available": True, "gloo": True, "nccl_backend": True, "dtensor": False,
              "arch_list": ["sm_80", "sm_90"], "warnings": ["a warning"], "devices": []},
    "driver": {"floor": "580", "ok": False, "detail": "driver 570 is below 580"},
    "arch": [{"index": 0, "detail": "sm_90 runs via sm_90"}],
    "disk": {"path": "/scratch", "free_gb": 73.6, "total_gb": 270.6, "recommended_gb": 150.0, "ok": False},
    "shm": {"path": "/dev/shm", "size_gb": 25.28, "free_gb": 25.28},
    "tools": {"docker": {"path": "/usr/bin/docker", "engine": False}, "apptainer": {"path": None},
              "srun": {"path": "/usr/bin/srun"}},
    "testable": {"free_gpus": 1, "tier": "basic", "route": "local", "note": "1 free GPU"},
    "env": {"name": "demo", "torch_pin": "2.11.0", "flavour": "cu130", "how": "the pin's index",
            "sm_range": ["sm_80", "sm_90"], "arch_list": ["sm_80", "sm_90"], "ok": None, "detail": "not judged"},
    "verdict": "2 GPU(s)",
}


def test_text_report_exact_for_every_kind_of_line():
    """Every line kind the text report has, in one report; the expected text is what the string code
    printed before the template replaced it (issue 24: the rendering stays byte-identical)."""
    assert render_text(FULL_REPORT) == (
    'envport doctor on node1 (x86_64, 16 CPUs)\n'
    'GPUs: 2, driver 580.65, CUDA (driver) 13.0\n'
    '  [0] NVIDIA H200 cc 9.0 0/143771 MiB free\n'
    '  [1] NVIDIA H200 cc ? ?/? MiB IN USE\n'
    '  note: one GPU in use\n'
    '  GPU0 <-> GPU1: NV18 (nvlink: 18 NVLink(s))\n'
    'topology (nvidia-smi topo -m):\n'
    '  \tGPU0\tGPU1\n'
    '  GPU0\t X \tNV18\n'
    'torch 2.11.0+cu130 (CUDA build 13.0, NCCL none) in /env/bin/python: cuda available True, gloo True, nccl True, DTensor False\n'
    '  arch list: sm_80 sm_90\n'
    '  torch says: a warning\n'
    'driver: TOO OLD driver 570 is below 580\n'
    '  GPU 0: sm_90 runs via sm_90\n'
    'disk: 73.6 GB free of 270.6 GB at /scratch (below the ~150 GB recommendation)\n'
    '/dev/shm: 25.28 GB\n'
    'tools: docker yes (engine down), apptainer no, srun yes\n'
    'testable: 1 free GPU (tier basic, route local)\n'
    "env demo: torch 2.11.0 [cu130; the pin's index], sm_range ['sm_80', 'sm_90']\n"
    '  arch list: sm_80 sm_90\n'
    '  unknown  not judged\n'
    'verdict: 2 GPU(s)\n'
    )

"""Preflight: cheap local checks that refuse before anything is built or downloaded, each with its fix.

Real checks against this host (its disk, its PATH, its missing GPU); timing lives in
bench/bench_preflight.py, not here. The one injected part is nvidia-smi's view for the sm_range check:
this host has no GPU to disagree with a spec, and the test says so.
"""

from __future__ import annotations

import shutil

import pytest

from envport.builders.preflight import Context, check_compiler, preflight, run_checks
from envport.core.verdict import Verdict
from envport.spec.loader import load_spec
from envport.targets.needs import context_for
from envport.targets.registry import get

from .support import REPO, as_json, cli_env, run_envport, write_spec


def _demo():
    return load_spec("demo-cpu", REPO).spec


def test_a_fake_low_disk_threshold_refuses_with_the_fix(tmp_path):
    r = preflight(Context(_demo(), "venv", weights_root=tmp_path, margin_gb=10**7,
                          env_disk=get("venv").env_disk(_demo(), REPO)))
    assert r.verdict is Verdict.REFUSED and r.reason == "disk_low", r
    assert any(ln.startswith("disk_low:") and "fix:" in ln and "ENVPORT_WEIGHTS_DIR" in ln for ln in r.lines), r.lines


def test_only_the_weights_not_yet_on_disk_count_toward_the_estimate(tmp_path):
    from envport.builders.weights import missing_bytes

    spec = _demo()
    assert missing_bytes(spec, tmp_path) == 4096
    (tmp_path / "demo-cpu" / "tiny").mkdir(parents=True)
    (tmp_path / "demo-cpu" / "tiny" / "tiny.f32").write_bytes(b"\0" * 1000)
    assert missing_bytes(spec, tmp_path) == 3096


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this host has nvidia-smi; the check needs one without")
def test_a_gpu_env_on_this_gpu_less_host_refuses_no_accelerator(project):
    write_spec(project, "gpu-env", resources={"gpus": 1}, sm_range=["sm_80", "sm_90"])
    proc = run_envport("up", "gpu-env", "--target", "venv", "--json", root=project, env=cli_env(), timeout=120)
    out = as_json(proc)
    assert proc.returncode == 5, proc.stdout + proc.stderr
    first = out["steps"][0]
    assert first["step"] == "preflight" and first["reason"] == "no_accelerator"
    assert any("fix: run on a GPU node" in ln for ln in first["lines"]), first["lines"]
    # Nothing after it ran.
    assert [s["verdict"] for s in out["steps"][1:]] == ["skipped"] * 4


def test_a_missing_runtime_refuses_with_the_fix(project):
    # docker hidden from PATH: the client is not there for this run.
    env = cli_env(PATH="/nonexistent")
    proc = run_envport("up", "demo-cpu", "--target", "docker", "--json", root=project, env=env, timeout=120)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    first = as_json(proc)["steps"][0]
    assert first["reason"] == "runtime_missing" and "docker" in first["detail"]
    assert any("fix: install docker" in ln for ln in first["lines"]), first["lines"]


@pytest.mark.skipif(any(shutil.which(c) for c in ("micromamba", "mamba", "conda")), reason="a conda is installed here")
def test_conda_without_any_conda_refuses():
    r = preflight(Context(_demo(), "conda", runtime=get("conda").runtime_findings))
    assert r.reason == "runtime_missing" and "micromamba" in r.detail


def test_a_compiling_spec_on_a_host_without_cc_refuses(monkeypatch, tmp_path):
    # PATH without a compiler (the real lookup, a PATH that lacks cc and gcc).
    monkeypatch.setenv("PATH", str(tmp_path))
    spec = _demo().model_copy(update={"system_pkgs": ["build-essential"]})
    findings = check_compiler(context_for(get("venv"), spec, REPO, weights_root=tmp_path))
    assert [f.reason for f in findings] == ["compiler_missing"] and "build-essential" in findings[0].fix
    # Where the target says the env is not compiled here, the host's missing cc is not its problem: a
    # container compiles in its image, a venv on an SSH host in that host's setup script.
    for target, host in (("docker", None), ("podman", None), ("venv", "gpu-box")):
        assert check_compiler(context_for(get(target), spec, REPO, host, weights_root=tmp_path)) == [], target


def test_notes_do_not_refuse(tmp_path):
    r = preflight(Context(_demo(), "venv", weights_root=tmp_path, env_disk=get("venv").env_disk(_demo(), REPO)))
    assert r.verdict is Verdict.OK, r
    assert any(ln.startswith("note:") and "never measured" in ln for ln in r.lines), r.lines


def test_gpus_outside_sm_range_refuse():
    # Injected: nvidia-smi's answer (this host has no GPU, so no real one can disagree with the spec).
    spec = load_spec("demo-cpu", REPO).spec.model_copy(update={
        "resources": _demo().resources.model_copy(update={"gpus": 1}), "sm_range": ["sm_80", "sm_90"]})
    inv = {"nvidia_smi": "/usr/bin/nvidia-smi", "driver": "570.1", "gpus": [
        {"index": 0, "name": "NVIDIA GB10", "compute_capability": "12.1"}]}
    r = preflight(Context(spec, "docker", gpu_inventory=lambda: inv))
    assert r.reason == "gpu_outside_sm_range" and "sm_121" in r.detail, r
    inv["gpus"][0]["compute_capability"] = "9.0"
    r = preflight(Context(spec, "docker", gpu_inventory=lambda: inv))
    assert r.verdict is Verdict.OK and any("driver 570.1" in ln for ln in r.lines), r


def test_findings_have_one_shape_naming_the_check_its_verdict_evidence_and_fix(monkeypatch, tmp_path):
    """core/finding.Finding (issue 24): a problem is REFUSED with its evidence and fix, a note is SKIPPED
    (reported, not judged), and each names the check it came from."""
    from envport.core.finding import Finding

    monkeypatch.setenv("PATH", str(tmp_path))  # no cc, no gcc: the real lookup fails
    spec = _demo().model_copy(update={"system_pkgs": ["build-essential"]})
    found = run_checks(context_for(get("venv"), spec, REPO, weights_root=tmp_path))
    assert all(isinstance(f, Finding) for f in found)
    compiler = [f for f in found if f.check == "compiler"]
    assert [(f.reason, f.verdict) for f in compiler] == [("compiler_missing", Verdict.REFUSED)]
    assert "build-essential" in compiler[0].evidence and compiler[0].fix
    notes = [f for f in found if not f.reason]
    assert notes and all(f.verdict is Verdict.SKIPPED and f.check for f in notes), notes


def test_a_driver_below_the_floor_of_the_pinned_cuda_build_refuses():
    """The driver judged once, by core.arch.driver_check, for doctor and preflight alike (issue 24).
    Injected: nvidia-smi's answer (this host has no GPU and no driver to be too old)."""
    base = _demo()
    phases = [p.model_copy(update={"packages": ["torch==2.5.1+cu124" if p_.startswith("torch") else p_
                                                for p_ in p.packages]}) for p in base.pip_phases]
    spec = base.model_copy(update={"resources": base.resources.model_copy(update={"gpus": 1}), "pip_phases": phases})
    inv = {"nvidia_smi": "/usr/bin/nvidia-smi", "driver": "520.61", "cuda_driver": "12.0", "gpus": [
        {"index": 0, "name": "NVIDIA A100", "compute_capability": "8.0"}]}
    r = preflight(Context(spec, "docker", gpu_inventory=lambda: inv))
    assert r.verdict is Verdict.REFUSED and r.reason == "driver_too_old", r
    assert "525.60.13" in r.detail and any("fix: upgrade the driver" in ln for ln in r.lines), r.lines
    inv["driver"] = "550.54"
    r = preflight(Context(spec, "docker", gpu_inventory=lambda: inv))
    assert r.verdict is Verdict.OK and any("driver 550.54:" in ln and "meets it" in ln for ln in r.lines), r.lines

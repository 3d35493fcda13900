"""One check shape (issue 24): preflight, doctor and the diagnosis table answer in core.finding.Finding,
and the facts preflight and doctor both judge (GPUs, driver, docker engine) are judged once.

Injected: nvidia-smi's answer (this host has no GPU, so no real one can be counted, short or too old).
"""

from __future__ import annotations

import shutil

import pytest

from envport.builders.preflight import Context, check_gpus, preflight
from envport.core.arch import driver_check
from envport.core.finding import Finding
from envport.core.verdict import Verdict
from envport.report import doctor
from envport.report.diagnosis import diagnose
from envport.spec.loader import load_spec
from envport.targets.registry import get

from .support import REPO
from .test_doctor import FULL_REPORT


def _spec(gpus: int, torch: str = ""):
    base = load_spec("demo-cpu", REPO).spec
    phases = [p.model_copy(update={"packages": [torch if torch and t.startswith("torch") else t
                                                for t in p.packages]}) for p in base.pip_phases]
    return base.model_copy(update={"resources": base.resources.model_copy(update={"gpus": gpus}),
                                   "pip_phases": phases})


def _doctor_report(inv: dict, torch_seen=None, **facts) -> dict:
    return {"gpus": inv, "census": {"torch": torch_seen}, **facts}


def test_doctor_answers_in_findings_and_renders_its_verdicts_from_them():
    found = doctor.findings(FULL_REPORT)
    assert all(isinstance(f, Finding) for f in found)
    assert [(f.check, f.verdict.value, f.reason) for f in found] == [
        ("gpus", "OK", ""), ("driver", "REFUSED", "driver_too_old"), ("arch", "skipped", ""),
        ("disk", "REFUSED", "disk_low"), ("docker", "REFUSED", "docker_unreachable"), ("env", "skipped", "")]
    disk = found[3]
    assert disk.evidence == "73.6 GB free of 270.6 GB at /scratch (below the ~150 GB recommendation)"
    assert "ENVPORT_WEIGHTS_DIR" in disk.fix
    # The text's verdict words come from the findings: an engine judged up prints "up".
    up = {**FULL_REPORT, "tools": {**FULL_REPORT["tools"], "docker": {"path": "/usr/bin/docker", "engine": True}}}
    assert "docker yes (engine up)" in doctor.render_text(up)
    assert "docker yes (engine down)" in doctor.render_text(FULL_REPORT)


def test_doctor_json_lists_its_findings_and_env_refusal_sets_the_exit(project):
    from .support import as_json, run_envport, write_spec

    write_spec(project, "narrow", pip_phases=[["torch==2.5.1+cu124"]], sm_range=["sm_120", "sm_120"])
    proc = run_envport("doctor", "--json", "--no-torch", "--env", "narrow", root=project, timeout=120)
    report = as_json(proc)
    assert proc.returncode == 3 == report["exit_code"], proc.stderr
    env = [f for f in report["findings"] if f["check"] == "env"]
    assert env == [f.to_dict() for f in doctor.check_env(report)]
    assert env[0]["verdict"] == "REFUSED" and env[0]["reason"] == "arch_uncovered" and env[0]["fix"]
    assert [f["check"] for f in report["findings"]][:1] == ["gpus"]


def test_a_diagnosis_is_a_finding_of_its_row():
    line = "ModuleNotFoundError: No module named 'six'"
    d = diagnose(["starting", line])[0]
    f = d.finding
    assert isinstance(f, Finding)
    assert (f.check, f.reason, f.evidence, f.fix, f.verdict) == (d.row.layer, d.row.id, line, d.row.fix,
                                                                 Verdict.FAILED)
    assert d.to_dict()["line"] == f.evidence and d.lines()[0].startswith(f"diagnosis [{f.reason}] layer {f.check}")


NO_SMI = {"nvidia_smi": None, "driver": None, "cuda_driver": None, "gpus": [], "error": None, "odd": []}
SMI_ERROR = {**NO_SMI, "nvidia_smi": "/usr/bin/nvidia-smi", "error": "NVIDIA-SMI has failed: no devices"}
ONE_GPU = {**NO_SMI, "nvidia_smi": "/usr/bin/nvidia-smi", "driver": "520.61", "cuda_driver": "12.0",
           "gpus": [{"index": 0, "name": "NVIDIA A100", "compute_capability": "8.0", "in_use": False}]}


@pytest.mark.parametrize("inv,verdict", [(NO_SMI, "REFUSED"), (SMI_ERROR, "REFUSED"), (ONE_GPU, "OK")],
                         ids=["no-nvidia-smi", "nvidia-smi-error", "one-gpu"])
def test_preflight_and_doctor_judge_the_gpus_alike(inv, verdict):
    pre = [f for f in check_gpus(Context(_spec(gpus=1), "docker", gpu_inventory=lambda: inv))
           if f.reason == "no_accelerator"]
    doc = doctor.check_gpus(_doctor_report(inv))[0]
    assert doc.verdict.value == verdict and bool(pre) == doc.is_problem, (pre, doc)
    if pre:
        assert pre[0].reason == doc.reason and pre[0].evidence.endswith(doc.evidence), (pre[0], doc)
    # GPUs a probed torch sees where nvidia-smi lists none (a sandbox) count for doctor's judgement too.
    assert doctor.check_gpus(_doctor_report(NO_SMI, torch_seen=1))[0].verdict is Verdict.OK


def test_preflight_and_doctor_judge_the_driver_alike():
    spec = _spec(gpus=1, torch="torch==2.5.1+cu124")
    pre = preflight(Context(spec, "docker", gpu_inventory=lambda: ONE_GPU))
    drv = driver_check(ONE_GPU["driver"], ONE_GPU["cuda_driver"], "12.4")
    doc = doctor.check_driver({"driver": drv})[0]
    assert pre.reason == doc.reason == "driver_too_old"
    assert f"driver_too_old: {doc.evidence} (fix: {doc.fix})" in pre.lines, pre.lines


def test_preflight_and_doctor_judge_a_missing_docker_alike(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name, *a, **kw: None)
    pre = get("docker").runtime_findings(None)
    doc = doctor.check_docker({"tools": doctor.tools()})
    assert [(f.reason, f.evidence, f.fix) for f in pre] == [(f.reason, f.evidence, f.fix) for f in doc]
    assert doc[0].reason == "runtime_missing"

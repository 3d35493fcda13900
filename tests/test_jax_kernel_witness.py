"""The kernel witness per framework (issue 42): what the plan asks kernel.py for, and the rows the judge makes
of its sentinels.  The real script on a real JAX is tests/test_jax_cpu.py; here, the real kernel.py on the
real CPU torch (tests/support.torch_python), and records as kernel.py prints them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from envport.core.verdict import Verdict
from envport.spec.model import Spec
from envport.witness.judge import call_results, parse_sentinels
from envport.witness.launchers.base import WITNESS_DIR, LaunchResult
from envport.witness.plan import WitnessOptions, plan_witnesses
from envport.witness.scripts.envport_sentinel import PREFIX

from .support import torch_python


def _spec(kernel, gpus: int = 0) -> Spec:
    return Spec(name="k", base="debian:bookworm", python="3.11", resources={"gpus": gpus},
                witnesses={"kernel": kernel})


def _launched(records: list[dict], rc: int = 0) -> LaunchResult:
    return LaunchResult(["kernel.py"], rc, "\n".join(PREFIX + json.dumps(r) for r in records) + "\n", 1.0)


@pytest.mark.parametrize("kernel, args", [(True, []), (["jax"], ["--framework", "jax"]),
                                          (["torch", "jax"], ["--framework", "torch", "--framework", "jax"])])
def test_the_plan_names_the_frameworks_the_spec_names(kernel, args):
    (call,) = plan_witnesses(_spec(kernel), WitnessOptions(only=["kernel"])).calls
    assert call.script == "kernel.py" and call.args == ["--device", "auto", "--deadline", "300.0"] + args


def test_a_spec_asking_for_no_kernel_gets_no_call():
    assert plan_witnesses(_spec(False), WitnessOptions(only=["kernel"])).calls == []


JAX_OK = {"check": "kernel", "framework": "jax", "name": "jax", "ok": True, "jax": "0.4.38", "device": "cpu:0",
          "shape": [8, 4], "checksum": -2.608606}


def test_every_framework_found_is_a_row_of_its_own():
    torch_ok = {"check": "kernel", "framework": "torch", "ok": True, "torch": "2.13.0+cpu", "device": "cpu",
                "shape": [8, 4], "checksum": 1.5}
    call = plan_witnesses(_spec(True), WitnessOptions(only=["kernel"])).calls[0]
    rows = call_results(_spec(True), call, _launched([torch_ok, JAX_OK]))
    assert [(r.step, r.verdict, r.detail) for r in rows] == [
        ("kernel", Verdict.OK, "cpu: shape [8, 4], checksum 1.5 (torch 2.13.0+cpu)"),
        ("kernel (jax)", Verdict.OK, "cpu:0: shape [8, 4], checksum -2.608606 (jax 0.4.38)")]


def test_a_named_framework_that_did_not_report_is_failed():
    spec = _spec(["torch", "jax"])
    call = plan_witnesses(spec, WitnessOptions(only=["kernel"])).calls[0]
    rows = {r.step: r for r in call_results(spec, call, _launched([JAX_OK], rc=1))}
    assert rows["kernel (jax)"].verdict is Verdict.OK
    assert rows["kernel"].verdict is Verdict.FAILED and rows["kernel"].detail.startswith("no result")


def test_a_cpu_torch_beside_a_gpu_jax_says_whose_gpu_it_is():
    torch_cpu = {"check": "kernel", "framework": "torch", "ok": True, "torch": "2.13.0+cpu", "device": "cpu",
                 "shape": [8, 4], "checksum": 1.5, "gpu_is": "jax"}
    jax_gpu = dict(JAX_OK, device="gpu:0", capability=[9, 0], gpu="NVIDIA H200", max_abs_diff_vs_cpu=1e-4)
    spec = _spec(True, gpus=1)
    call = plan_witnesses(spec, WitnessOptions(only=["kernel"])).calls[0]
    rows = {r.step: r for r in call_results(spec, call, _launched([torch_cpu, jax_gpu]))}
    assert rows["kernel"].verdict is Verdict.OK and rows["kernel"].detail.endswith("torch sees no GPU, jax drives it")
    assert rows["kernel (jax)"].detail.endswith("; NVIDIA H200 sm_90 (judged by jax)")


def test_true_with_no_framework_importable_is_one_failed_row_naming_each(tmp_path):
    # -S: no site-packages, so neither torch nor jax, whatever this interpreter has; the real script answers.
    proc = subprocess.run([sys.executable, "-S", str(WITNESS_DIR / "kernel.py")], capture_output=True, text=True,
                          timeout=60)
    recs = parse_sentinels(proc.stdout)
    assert proc.returncode == 1 and [r["framework"] for r in recs] == ["torch", "jax", "triton"]
    spec = _spec(True)
    call = plan_witnesses(spec, WitnessOptions(only=["kernel"])).calls[0]
    (row,) = call_results(spec, call, LaunchResult(["kernel.py"], 1, proc.stdout, 1.0))
    assert (row.step, row.verdict) == ("kernel", Verdict.FAILED)
    assert row.detail == ("torch: ModuleNotFoundError: No module named 'torch'; jax: ModuleNotFoundError: No module "
                          "named 'jax'; triton: ModuleNotFoundError: No module named 'triton'")
    assert row.lines == ["fix: install torch or jax or triton in the env, or set witnesses.kernel: false"]


def test_the_real_script_runs_only_the_frameworks_found():
    proc = subprocess.run([torch_python(), str(WITNESS_DIR / "kernel.py")], capture_output=True, text=True,
                          timeout=300)
    recs = parse_sentinels(proc.stdout)
    # This interpreter holds torch and neither jax nor triton: one record, torch's, and it passed.
    assert proc.returncode == 0 and [(r["framework"], r["ok"]) for r in recs] == [("torch", True)], proc.stdout
    # Named, an absent framework is a failed record, not left out.
    proc = subprocess.run([torch_python(), str(WITNESS_DIR / "kernel.py"), "--framework", "jax"],
                          capture_output=True, text=True, timeout=300)
    (rec,) = parse_sentinels(proc.stdout)
    assert proc.returncode == 1 and rec["error"] == "ModuleNotFoundError: No module named 'jax'"

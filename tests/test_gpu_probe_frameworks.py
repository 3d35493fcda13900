"""The probe is per framework (issue 42): a card JAX can drive is not refused because the env's torch is a
CPU build, and the verdict names the framework that judged it.

No GPU can be had here, so two mocks, and these tests say so: a fake `nvidia-smi` (tests/fake_gpu.py)
and a STUB `jax` package written to a folder put on PYTHONPATH, whose only job is to answer as a JAX
that drives one H200 would (default_backend() "gpu", one device of compute capability 9.0).  torch is
the real CPU build (tests/support.torch_python), so torch's own view (no GPU, an empty arch list) is real;
each test also runs without the stub and shows the refusal the stub's GPU lifts.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from envport.core.verdict import NO_ACCELERATOR_REASON, Verdict
from envport.spec.model import Spec
from envport.witness.launchers.local import LocalLauncher
from envport.witness.plan import WitnessOptions
from envport.witness.run import run_witnesses

from .fake_gpu import H200, fake_nvidia_smi, path_with
from .support import torch_python

# A stub, not JAX: it answers the probe's questions (frameworks.py) as a JAX on one H200 would.
STUB_JAX = '''"""A STUB of jax for envport's tests (tests/test_gpu_probe_frameworks.py): no GPU and no JAX here."""
__version__ = "0.0.0+envport.stub"


class _FakeGpu:
    id = 0
    platform = "gpu"
    device_kind = "NVIDIA H200 (stub)"
    compute_capability = "9.0"


def default_backend():
    return "gpu"


def devices(backend=None):
    return [_FakeGpu()]
'''


@pytest.fixture
def stub_jax(tmp_path: Path) -> Path:
    folder = tmp_path / "stub-jax"
    (folder / "jax").mkdir(parents=True)
    (folder / "jax" / "__init__.py").write_text(STUB_JAX)
    return folder


def _doctor(monkeypatch, tmp_path: Path, pythonpath: str | None) -> dict:
    from envport.report.doctor import collect

    fake_nvidia_smi(tmp_path / "bin", [dict(H200)])
    monkeypatch.setenv("PATH", path_with(tmp_path / "bin"))
    if pythonpath:
        monkeypatch.setenv("PYTHONPATH", pythonpath)
    else:
        monkeypatch.delenv("PYTHONPATH", raising=False)
    return collect(python=torch_python(), workdir=tmp_path)


def test_doctor_judges_the_card_by_jax_when_torch_is_a_cpu_build(monkeypatch, tmp_path, stub_jax):
    import jsonschema
    import json

    from .support import REPO

    alone = _doctor(monkeypatch, tmp_path, None)
    # Without JAX: the real CPU torch cannot drive the card, and the arch check says so (the refusal).
    assert alone["arch"][0]["runnable"] is False and alone["arch"][0]["judged_by"] == "torch"
    assert any(f["reason"] == "arch_uncovered" for f in alone["findings"])
    assert alone["testable"]["free_gpus"] == 0 and "frameworks" in alone and "jax" not in alone["frameworks"]

    report = _doctor(monkeypatch, tmp_path, str(stub_jax))
    jsonschema.validate(report, json.loads((REPO / "docs" / "doctor.schema.json").read_text()))
    assert report["frameworks"]["jax"]["backend"] == "gpu"
    assert report["frameworks"]["jax"]["devices"] == [{"index": 0, "platform": "gpu", "name": "NVIDIA H200 (stub)",
                                                      "capability": "9.0"}]
    (arch,) = report["arch"]
    assert (arch["runnable"], arch["judged_by"], arch["capability"]) == (True, "jax", "9.0")
    assert arch["detail"].startswith("sm_90 runs via JAX 0.0.0+envport.stub (backend gpu)")
    assert not any(f["reason"] == "arch_uncovered" for f in report["findings"])
    assert report["census"]["jax"] == 1 and report["census"]["torch"] == 0
    assert "the GPUs are judged by JAX" in report["census"]["note"]
    assert report["testable"]["free_gpus"] == 1 and "judged by JAX" in report["testable"]["note"]
    gpus = next(f for f in report["findings"] if f["check"] == "gpus")
    assert gpus["verdict"] == "OK" and gpus["evidence"] == "nvidia-smi lists 1 GPU(s), JAX sees 1"

    from envport.report.doctor import render_text

    text = render_text(report)
    assert "jax 0.0.0+envport.stub (jaxlib ?): backend gpu, 1 GPU(s) ([0] NVIDIA H200 (stub) cc 9.0)" in text


def _gpu_spec() -> Spec:
    here = "%d.%d" % sys.version_info[:2]
    return Spec(name="cpu-torch-gpu-jax", base="debian:bookworm", python=here, resources={"gpus": 1},
                witnesses={"imports": ["json"]})


def test_witness_run_with_a_cpu_torch_and_a_gpu_jax_is_not_refused(stub_jax):
    import os

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # No nvidia-smi GPU (host_gpus=0) and the real CPU torch: refused, as before.
    (refused,) = run_witnesses(_gpu_spec(), LocalLauncher(torch_python(), base_env=env), WitnessOptions(host_gpus=0))
    assert (refused.verdict, refused.reason) == (Verdict.REFUSED, NO_ACCELERATOR_REASON)

    # The same env with a JAX that sees the (stub's) GPU: counted, judged by JAX, and the witnesses run.
    launcher = LocalLauncher(torch_python(), base_env={**env, "PYTHONPATH": str(stub_jax)})
    results = {r.step: r for r in run_witnesses(_gpu_spec(), launcher, WitnessOptions(host_gpus=0))}
    assert results["gpus"].verdict is Verdict.OK
    assert results["gpus"].detail == ("1 GPU(s) on this host (nvidia-smi: 0; the env's torch: 0; the env's JAX: 1; "
                                      "judged by jax)")
    assert "jax 0.0.0+envport.stub: backend gpu, 1 GPU(s) (NVIDIA H200 (stub) cc 9.0)" in results["gpus"].lines
    assert results["import json"].verdict is Verdict.OK


def test_a_witness_statement_names_the_card_its_capability_and_the_driver(monkeypatch, tmp_path, stub_jax):
    """Issue 41's "the GPUs seen (model, capability, driver)": the fake nvidia-smi (driver 580.95.05) counts one
    H200 here and the stub JAX lists it; the statement's `gpus` is that card, not only a count."""
    import json
    import os
    from datetime import datetime, timezone

    import jsonschema

    from envport.sif.provenance.witness import predicate

    from .support import REPO

    fake_nvidia_smi(tmp_path / "bin", [dict(H200)])
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    monkeypatch.setenv("PATH", path_with(tmp_path / "bin"))
    launcher = LocalLauncher(torch_python(), base_env={**env, "PYTHONPATH": str(stub_jax)})
    steps = run_witnesses(_gpu_spec(), launcher, WitnessOptions())
    census = next(r for r in steps if r.step == "gpus").data["census"]
    assert (census["nvidia_smi"], census["driver"]) == (1, "580.95.05"), census
    when = datetime(2026, 1, 2, tzinfo=timezone.utc)
    pred = predicate(env="cpu-torch-gpu-jax", env_hash="0" * 64, target="venv", launcher="local", steps=steps,
                     verdict="OK", started=when, finished=when)
    assert pred["gpus"] == [{"index": 0, "model": "NVIDIA H200 (stub)", "capability": "9.0", "driver": "580.95.05",
                             "seenBy": "jax"}]
    jsonschema.validate(pred, json.loads((REPO / "docs" / "witness-predicate.schema.json").read_text()))

    # No GPU counted and none listed (the real CPU torch, no JAX, nvidia-smi says 0): no entry at all.
    bare = LocalLauncher(torch_python(), base_env=env)
    none = run_witnesses(Spec(name="cpu", base="debian:bookworm", python=_gpu_spec().python,
                              witnesses={"imports": ["json"]}), bare, WitnessOptions(host_gpus=0))
    assert predicate(env="cpu", env_hash="0" * 64, target="venv", launcher="local", steps=none, verdict="OK",
                     started=when, finished=when)["gpus"] == []


def test_doctor_env_does_not_refuse_a_cpu_torch_pin_beside_jax():
    from envport.report.doctor import check_env, env_arch

    def spec(*packages: str) -> Spec:
        return Spec(name="af3-like", base="debian:bookworm", python="3.11", sm_range=["sm_80", "sm_90"],
                    pip_phases=[list(packages)])

    # torch's CPU build alone cannot cover sm_80..sm_90: refused, as before.
    alone = env_arch(spec("torch==2.13.0+cpu"))
    assert alone["ok"] is False and check_env({"env": alone})[0].reason == "arch_uncovered"
    # The same torch beside JAX (an AlphaFold 3 shape): the card is JAX's, judged where the env runs.
    beside = env_arch(spec("torch==2.13.0+cpu", "jax[cuda12]==0.4.38"))
    assert beside["ok"] is None and beside["verdict"] is None
    assert beside["detail"].startswith("torch 2.13.0+cpu is a CPU build and the env installs jax==0.4.38: its GPU "
                                       "is JAX's")
    assert not check_env({"env": beside})[0].is_problem


def test_preflight_says_jax_is_judged_where_the_env_runs():
    from envport.builders.preflight import Context, check_gpus

    spec = Spec(name="af3-like", base="debian:bookworm", python="3.11", resources={"gpus": 1},
                pip_phases=[["torch==2.13.0+cpu", "jax[cuda12]==0.4.38"]])
    inv = {"nvidia_smi": "/usr/bin/nvidia-smi", "driver": "580.95.05", "cuda_driver": "13.0", "error": None,
           "gpus": [{"index": 0, "name": "NVIDIA H200", "compute_capability": "9.0", "in_use": False}]}
    found = check_gpus(Context(spec, "docker", gpu_inventory=lambda: inv))
    assert not any(f.is_problem for f in found), found
    assert found[-1].evidence.startswith("the env installs jax==0.4.38: JAX's view of the GPUs is judged where")

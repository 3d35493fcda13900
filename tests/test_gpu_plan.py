"""GPUs counted two ways, NCCL worlds planned from them, and the failures that say why.

No GPU can be had here, so nvidia-smi is a fake executable on PATH (tests/fake_gpu.py)
and the env's torch is the real CPU build, which sees none: the disagreement itself is
one of the cases.  The NCCL and torch error texts injected below are the exact texts
those libraries print, with where each was seen.
"""

from __future__ import annotations


import pytest

from envport.core.verdict import StepResult, Verdict
from envport.engines.gpu import GpuCensus, census_from_gres, gpu_count, gpu_inventory, topology, topology_pairs
from envport.spec.model import Spec
from envport.witness.launchers.base import LaunchResult
from envport.witness.launchers.local import LocalLauncher
from envport.witness.judge import call_results, with_outcomes
from envport.witness.plan import WitnessCall, WitnessOptions, plan_witnesses
from envport.witness.run import run_witnesses
from envport.witness.scripts import dist
from .fake_gpu import H200, TOPO_4_NVLINK, fake_nvidia_smi, path_with
from .support import torch_python

# NCCL's init.cc WARN, as torch raises it (pytorch DistBackendError; text from
# verl-project/verl#161 and NVIDIA/nccl#1241, NCCL 2.17-2.21).
NCCL_DUPLICATE = (
    "NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, invalid usage (run with NCCL_DEBUG=WARN "
    "for details), NCCL version 2.20.5\n"
    "ncclInvalidUsage: This usually reflects invalid usage of NCCL library.\n"
    "Last error:\n"
    "Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 10"
)
# torch's CUDA error for a kernel with no image for this GPU (c10/cuda/CUDAException).
NO_KERNEL_IMAGE = ("CUDA error: no kernel image is available for execution on the device\n"
                   "CUDA kernel errors might be asynchronously reported at some other API call, so the "
                   "stacktrace below might be incorrect.")
CU124 = ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"]


def gpu_spec(world: int = 2, mesh: list[int] | None = None, gpus: int = 1) -> Spec:
    w: dict = {"kernel": True, "collectives": {"world_size": world}}
    if mesh:
        w["dtensor"] = {"mesh": mesh}
    return Spec(name="g", base="debian:bookworm", python="3.11", resources={"gpus": gpus}, witnesses=w)


def shape(planned) -> list[tuple]:
    return [(c.script, c.backend, c.world, c.checks, c.mesh,
             c.args[c.args.index("--device") + 1] if "--device" in c.args else None) for c in planned.calls]


# --- the census ------------------------------------------------------------------------


def test_census_takes_whichever_sees_more_and_says_why_they_differ():
    assert GpuCensus(1, 1).count == 1 and GpuCensus(1, 1).note == ""
    sandbox = GpuCensus(None, 1)  # gVisor: no nvidia-smi, torch drives the GPU
    assert sandbox.count == 1 and sandbox.note == ""
    odd = GpuCensus(0, 2)
    assert odd.count == 2 and "nvidia-smi is missing or answers oddly" in odd.note
    cpu_torch = GpuCensus(4, 0)
    assert cpu_torch.count == 4 and "CPU build of torch, a driver older" in cpu_torch.note


@pytest.mark.parametrize("gres,count", [("gpu:4", 4), ("gpu:a100:2", 2), ("gpu", 1), (None, 0),
                                        ("gpu:2,shard:1", 2)])
def test_census_from_slurm_gres(gres, count):
    assert census_from_gres(gres).count == count


# --- nvidia-smi, faked on PATH -------------------------------------------------------------


@pytest.mark.parametrize("n", [0, 1, 4])
def test_inventory_counts_what_nvidia_smi_lists(tmp_path, monkeypatch, n):
    fake_nvidia_smi(tmp_path / "bin", [dict(H200) for _ in range(n)])
    monkeypatch.setenv("PATH", path_with(tmp_path / "bin"))
    inv = gpu_inventory()
    assert len(inv["gpus"]) == n and gpu_count() == n
    assert inv["cuda_driver"] == "13.0"
    assert inv["driver"] == ("580.95.05" if n else None)


def test_na_fields_are_none_not_a_crash(tmp_path, monkeypatch):
    na = {"index": "[N/A]", "uuid": "[N/A]", "name": "NVIDIA H200", "memory_total": "[N/A]",
          "memory_used": "[Not Supported]", "compute_cap": "[N/A]"}
    fake_nvidia_smi(tmp_path / "bin", [na, dict(H200)], driver="[N/A]")
    monkeypatch.setenv("PATH", path_with(tmp_path / "bin"))
    inv = gpu_inventory()
    first, second = inv["gpus"]
    assert (first["index"], first["uuid"], first["memory_total_mib"], first["memory_used_mib"],
            first["compute_capability"]) == (0, None, None, None, None)
    assert second["memory_total_mib"] == 143771.0 and second["compute_capability"] == "9.0"
    assert inv["driver"] is None and first["in_use"] is False


def test_an_odd_answer_is_reported_not_counted(tmp_path, monkeypatch):
    fake_nvidia_smi(tmp_path / "bin", [], odd="No devices were found")
    monkeypatch.setenv("PATH", path_with(tmp_path / "bin"))
    inv = gpu_inventory()
    assert inv["gpus"] == [] and inv["odd"] == ["No devices were found"]
    assert "answered oddly" in inv["error"] and gpu_count() is None


def test_topology_parsed_into_nvlink_and_pcie_pairs(tmp_path, monkeypatch):
    fake_nvidia_smi(tmp_path / "bin", [dict(H200) for _ in range(4)], topo=TOPO_4_NVLINK)
    monkeypatch.setenv("PATH", path_with(tmp_path / "bin"))
    pairs = {(p["a"], p["b"]): (p["link"], p["kind"]) for p in topology_pairs(topology())}
    assert pairs == {(0, 1): ("NV18", "nvlink"), (0, 2): ("NV18", "nvlink"), (0, 3): ("SYS", "sys"),
                     (1, 2): ("NV18", "nvlink"), (1, 3): ("PIX", "pcie"), (2, 3): ("NODE", "pcie")}
    assert topology_pairs(None) == [] and topology_pairs("garbage\nmore garbage") == []


# --- the plan ----------------------------------------------------------------------------


def test_one_gpu_runs_nccl_at_world_1_and_skips_the_rest_with_the_reason():
    planned = plan_witnesses(gpu_spec(2, [2, 2]), WitnessOptions(), GpuCensus(1, 1))
    assert shape(planned) == [
        ("basic.py", "", 0, ["python"], [], None),
        ("kernel.py", "", 0, ["kernel"], [], "cuda"),
        ("dist.py", "gloo", 2, ["collectives"], [], "cpu"),
        ("dist.py", "gloo", 4, ["dtensor"], [2, 2], "cpu"),
        ("dist.py", "nccl", 1, ["collectives", "dtensor"], [1], "cuda"),
    ]
    assert [(r.step, r.verdict, r.detail) for r in planned.skipped] == [
        ("collectives (world 2, nccl)", Verdict.SKIPPED,
         "needs 2 GPUs, this host has 1; instead: collectives (world 1, nccl) and collectives (world 2)"),
        ("dtensor (mesh 2x2, nccl)", Verdict.SKIPPED,
         "needs 4 GPUs, this host has 1; instead: dtensor (mesh 1, nccl) and dtensor (mesh 2x2)"),
    ]


def test_four_gpus_hold_the_whole_spec():
    planned = plan_witnesses(gpu_spec(2, [2, 2]), WitnessOptions(), GpuCensus(4, 4))
    assert [(b, w, ch, m) for _, b, w, ch, m, _ in shape(planned) if b == "nccl"] == [
        ("nccl", 2, ["collectives"], []), ("nccl", 4, ["dtensor"], [2, 2])]
    assert planned.skipped == []


def test_nine_gpu_mesh_on_four_gpus_runs_the_largest_square():
    planned = plan_witnesses(gpu_spec(4, [3, 3]), WitnessOptions(), GpuCensus(4, 4))
    nccl = [(w, ch, m) for _, b, w, ch, m, _ in shape(planned) if b == "nccl"]
    assert nccl == [(4, ["collectives", "dtensor"], [2, 2])]
    assert [r.detail for r in planned.skipped] == [
        "needs 9 GPUs, this host has 4; instead: dtensor (mesh 2x2, nccl) and dtensor (mesh 3x3)"]


def test_no_gpus_plans_gloo_only_and_a_cpu_kernel():
    planned = plan_witnesses(gpu_spec(2, [2, 2], gpus=0), WitnessOptions(), GpuCensus(0, 0))
    assert {c.backend for c in planned.calls if c.script == "dist.py"} == {"gloo"}
    assert shape(planned)[1][-1] == "cpu" and planned.skipped == []


def test_a_sandbox_without_nvidia_smi_still_plans_the_gpu_torch_sees():
    planned = plan_witnesses(gpu_spec(1), WitnessOptions(), GpuCensus(None, 1))
    assert ("dist.py", "nccl", 1, ["collectives"], [], "cuda") in shape(planned)


def test_slurm_allocation_plans_from_its_gres():
    planned = plan_witnesses(gpu_spec(4, [2, 2]), WitnessOptions(), census_from_gres("gpu:2"))
    assert [r.detail.split(";")[0] for r in planned.skipped] == [
        "needs 4 GPUs, the Slurm allocation (gres gpu:2) has 2", "needs 4 GPUs, the Slurm allocation (gres gpu:2) has 2"]


def test_device_cpu_plans_no_nccl():
    planned = plan_witnesses(gpu_spec(2), WitnessOptions(device="cpu"), GpuCensus(4, 4))
    assert {c.backend for c in planned.calls if c.script == "dist.py"} == {"gloo"}


# --- a real run against the fake nvidia-smi ------------------------------------------------


def test_one_listed_gpu_that_torch_cannot_use_fails_with_torchs_words(tmp_path, monkeypatch):
    """nvidia-smi (fake) lists one GPU; the env's real CPU torch sees none.  The plan takes the
    larger count, says they disagree, and the NCCL world-1 group's own error reaches the verdict."""
    fake_nvidia_smi(tmp_path / "bin", [dict(H200)])
    monkeypatch.setenv("PATH", path_with(tmp_path / "bin"))
    spec = gpu_spec(2)
    results = {r.step: r for r in run_witnesses(spec, LocalLauncher(torch_python()),
                                                WitnessOptions(only=["collectives"], deadline_s=120))}
    assert results["gpus"].detail == "1 GPU(s) on this host (nvidia-smi: 1; the env's torch: 0)"
    assert results["gpus"].lines[0].startswith("note: nvidia-smi lists 1 GPU(s) but the env's torch sees 0")
    assert results["collectives (world 2)"].verdict is Verdict.OK
    nccl = results["collectives (world 1, nccl)"]
    assert nccl.verdict is Verdict.FAILED
    assert nccl.detail == "world size 1 needs 1 GPUs, torch sees 0"  # the group's error, not "no report"
    skipped = results["collectives (world 2, nccl)"]
    assert skipped.verdict is Verdict.SKIPPED and skipped.detail.startswith("needs 2 GPUs, this host has 1")
    # The SKIPPED line says how the runs in its place ended: the world-1 NCCL run FAILED (issue 28, defect 5).
    assert skipped.detail.endswith("instead: collectives (world 1, nccl) FAILED and collectives (world 2) OK")


def test_no_gpu_anywhere_refuses_naming_both_counts(tmp_path, monkeypatch):
    fake_nvidia_smi(tmp_path / "bin", [])
    monkeypatch.setenv("PATH", path_with(tmp_path / "bin"))
    (res,) = run_witnesses(gpu_spec(1), LocalLauncher(torch_python()), WitnessOptions())
    assert res.verdict is Verdict.REFUSED and res.reason == "no_accelerator"
    assert res.detail == "spec asks for 1 GPU(s); this host has none (nvidia-smi lists 0, the env's torch sees 0)"


# --- errors with their exact texts --------------------------------------------------------


def test_nccl_error_keeps_its_last_error_line_and_gets_the_fix():
    exc = RuntimeError(NCCL_DUPLICATE)
    text = dist.error_text(exc)
    assert text == ("RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, invalid usage "
                    "(run with NCCL_DEBUG=WARN for details), NCCL version 2.20.5 | Last error: Duplicate GPU "
                    "detected : rank 1 and rank 0 both on CUDA device 10")
    assert "--gpus-per-task=1" in dist.error_fix(text)
    assert dist.error_fix("RuntimeError: something else") is None


def test_shared_gpus_are_named_by_rank_and_uuid():
    groups = dist.shared_gpus({0: "GPU-a", 1: "GPU-a", 2: "GPU-b", 3: "GPU-b", 4: "GPU-c"})
    assert dist.shared_gpu_message(groups) == "ranks 0, 1 share GPU GPU-a; ranks 2, 3 share GPU GPU-b"
    assert dist.shared_gpus({0: "GPU-a", 1: "GPU-b"}) == []


def test_two_real_ranks_on_one_gpu_fail_before_nccl_with_the_fix():
    # samegpu:1 (test-only) makes rank 1 report rank 0's GPU id; the exchange through the
    # rendezvous store and the refusal are the real code path, on gloo.
    spec = Spec(name="g", base="debian:bookworm", python="3.11", witnesses={"collectives": {"world_size": 2}})
    (res,) = run_witnesses(spec, LocalLauncher(torch_python()),
                           WitnessOptions(only=["collectives"], device="cpu", fault="samegpu:1"))
    assert res.verdict is Verdict.FAILED
    assert "ranks 0, 1: SharedGpuError: ranks 0, 1 share GPU GPU-envport-fake-0" in res.detail + "\n".join(res.lines)
    assert any(ln.startswith("fix: one rank per GPU") and "--gpus-per-task=1" in ln for ln in res.lines)


def _launched(records: list[dict], rc: int = 1) -> LaunchResult:
    import json

    from envport.witness.scripts.envport_sentinel import PREFIX

    return LaunchResult(["x"], rc, "\n".join(PREFIX + json.dumps(r) for r in records) + "\n", 1.0)


def test_nccl_duplicate_gpu_from_the_ranks_reaches_the_verdict_with_the_fix():
    call = WitnessCall("dist.py", [], ["collectives"], 60, "", world=2, backend="nccl")
    err = dist.error_text(RuntimeError(NCCL_DUPLICATE))
    recs = [{"check": "collectives", "rank": r, "ok": False, "error": err, "fix": dist.error_fix(err)}
            for r in (0, 1)]
    (res,) = call_results(gpu_spec(), call, _launched(recs))
    assert res.step == "collectives (world 2, nccl)" and res.verdict is Verdict.FAILED
    assert res.detail.startswith("ranks 0, 1: RuntimeError: NCCL error in:")
    assert res.detail.endswith("Last error: Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 10")
    assert res.lines == [dist.SHARE_FIX]


def test_ok_line_counts_only_ops_that_ran_and_world_1_nccl_says_it_moved_nothing():
    """A skipped op was counted as exact, and a world-1 NCCL group read as GPU-to-GPU proof (issue 28, defect 5)."""
    ops = [{"op": "all_reduce", "ok": True}, {"op": "broadcast", "ok": True},
           {"op": "all_to_all", "ok": True, "skipped": "not on this backend"}]
    recs = [{"check": "collectives", "rank": 0, "ok": True, "backend": "nccl", "device": "cuda", "ops": ops}]
    call = WitnessCall("dist.py", [], ["collectives"], 60, "", world=1, backend="nccl")
    (res,) = call_results(gpu_spec(), call, _launched(recs, rc=0))
    assert res.verdict is Verdict.OK
    assert res.detail == ("1 ranks on nccl/cuda, 2 ops exact on every rank (skipped: all_to_all) "
                          "(world 1: NCCL ran on one GPU and moved no data between GPUs)")
    two = [dict(recs[0], rank=r) for r in (0, 1)]
    (res,) = call_results(gpu_spec(), WitnessCall("dist.py", [], ["collectives"], 60, "", world=2, backend="nccl"),
                          _launched(two, rc=0))
    assert "moved no data" not in res.detail and "2 ops exact" in res.detail


def test_skipped_lines_name_the_real_outcome_of_what_ran_instead():
    planned = plan_witnesses(gpu_spec(2, [2, 2]), WitnessOptions(), GpuCensus(1, 1))
    ran = {"collectives (world 1, nccl)": StepResult("collectives (world 1, nccl)", Verdict.FAILED, "boom"),
           "collectives (world 2)": StepResult("collectives (world 2)", Verdict.OK, "fine"),
           "dtensor (mesh 2x2)": StepResult("dtensor (mesh 2x2)", Verdict.OK, "fine")}
    out = with_outcomes(planned.skipped, ran)
    assert [r.detail for r in out] == [
        "needs 2 GPUs, this host has 1; instead: collectives (world 1, nccl) FAILED and collectives (world 2) OK",
        # dtensor's NCCL run never reported (killed, say): the plan's words stay, nothing is made up
        "needs 4 GPUs, this host has 1; instead: dtensor (mesh 1, nccl) and dtensor (mesh 2x2)"]


@pytest.mark.parametrize("n,world,mesh,nccl,skips", [
    (0, 2, [2, 2], [], 0),
    (1, 2, [2, 2], [(1, ["collectives", "dtensor"], [1])], 2),
    (2, 2, [2, 2], [(2, ["collectives", "dtensor"], [2])], 1),
    (4, 4, [2, 2], [(4, ["collectives", "dtensor"], [2, 2])], 0),
    (8, 8, [2, 2], [(8, ["collectives"], []), (4, ["dtensor"], [2, 2])], 0),
    (9, 9, [3, 3], [(9, ["collectives", "dtensor"], [3, 3])], 0),
])
def test_gpu_check_spec_uses_every_gpu(n, world, mesh, nccl, skips):
    """scripts/gpu-check.sh sized its spec at world 2 and a 2x2 mesh whatever the host had: on 8 GPUs NCCL never
    ran at 8 (issue 28, defect 6).  The script's own spec, planned for N GPUs torch can use."""
    import subprocess

    import yaml

    from .support import REPO

    text = subprocess.run(["bash", str(REPO / "scripts" / "gpu-check.sh"), "spec", str(n)], capture_output=True,
                          text=True, check=True, timeout=30).stdout
    spec = Spec(**yaml.safe_load(text))
    assert (spec.witnesses.collectives.world_size, list(spec.witnesses.dtensor.mesh)) == (world, mesh)
    planned = plan_witnesses(spec, WitnessOptions(), GpuCensus(n, n))
    assert [(w, ch, m) for _, b, w, ch, m, _ in shape(planned) if b == "nccl"] == nccl
    assert len(planned.skipped) == skips


def test_kernel_no_kernel_image_names_the_build_or_the_extension():
    call = WitnessCall("kernel.py", [], ["kernel"], 60, "kernel")
    base = {"check": "kernel", "ok": False, "error": "RuntimeError: " + NO_KERNEL_IMAGE.splitlines()[0],
            "device": "cuda:0", "gpu": "NVIDIA RTX 5090"}
    (torch_gap,) = call_results(gpu_spec(), call, _launched([dict(base, capability=[12, 0], arch_list=CU124)]))
    assert torch_gap.verdict is Verdict.FAILED and "no kernel image" in torch_gap.detail
    assert any(ln.startswith("fix: this torch build has no code for sm_120") for ln in torch_gap.lines)
    (ext,) = call_results(gpu_spec(), call, _launched([dict(base, capability=[9, 0], arch_list=CU124)]))
    assert any("from an extension built for other targets" in ln and 'TORCH_CUDA_ARCH_LIST="9.0"' in ln
               for ln in ext.lines)


def test_kernel_requiring_cuda_keeps_torchs_driver_warning():
    # torch's UserWarning text when the driver is older than its CUDA build
    # (c10/cuda/CUDAFunctions.cpp), as the kernel witness forwards it.
    said = ("CUDA initialization: The NVIDIA driver on your system is too old (found version 12080). Please "
            "update your GPU driver by downloading and installing a new version from the URL: "
            "http://www.nvidia.com/Download/index.aspx Alternatively, go to: https://pytorch.org to install a "
            "PyTorch version that has been compiled with your version of the CUDA driver.")
    call = WitnessCall("kernel.py", [], ["kernel"], 60, "kernel")
    rec = {"check": "kernel", "ok": False, "cuda_warnings": [said],
           "error": "a CUDA device was required but torch.cuda.is_available() is False (torch 2.11.0+cu130, "
                    "built for CUDA 13.0): " + said}
    (res,) = call_results(gpu_spec(), call, _launched([rec]))
    assert "driver on your system is too old (found version 12080)" in res.detail


def test_kernel_witness_forwards_torchs_cuda_warning_for_real():
    """The real kernel.py under a torch whose is_available() warns (the warning is injected
    through sitecustomize: no torch here has a CUDA driver to be too old for)."""
    import subprocess
    import tempfile
    from pathlib import Path

    from envport.witness.launchers.base import WITNESS_DIR
    from envport.witness.judge import parse_sentinels

    with tempfile.TemporaryDirectory() as d:
        Path(d, "sitecustomize.py").write_text(
            "import warnings, torch.cuda\n"
            "def _warn():\n"
            "    warnings.warn('CUDA initialization: The NVIDIA driver on your system is too old (found version 12080).')\n"
            "    return False\n"
            "torch.cuda.is_available = _warn\n")
        proc = subprocess.run([torch_python(), str(WITNESS_DIR / "kernel.py"), "--device", "cuda"],
                              capture_output=True, text=True, timeout=120, env={"PYTHONPATH": d, "PATH": "/usr/bin:/bin"})
    (rec,) = parse_sentinels(proc.stdout)
    assert proc.returncode == 1 and rec["error"].endswith("too old (found version 12080).")


def test_group_error_is_the_detail_not_no_report():
    call = WitnessCall("dist.py", [], ["collectives", "dtensor"], 60, "", world=2, mesh=[2], backend="nccl")
    group = {"check": "group", "ok": False, "world_size": 2, "outcome": "no_gpus",
             "error": "world size 2 needs 2 GPUs, torch sees 1"}
    results = call_results(gpu_spec(), call, _launched([group]))
    assert [(r.step, r.detail) for r in results] == [
        ("collectives (world 2, nccl)", "world size 2 needs 2 GPUs, torch sees 1"),
        ("dtensor (mesh 2, nccl)", "world size 2 needs 2 GPUs, torch sees 1")]


def test_nccl_timeout_sits_inside_the_deadline(monkeypatch):
    # the deadline counts from the witness's import; pin that moment so the suite's age does not matter
    monkeypatch.setattr(dist, "T_START", __import__("time").time())
    left = dist.pg_timeout_s({"deadline": 300.0, "nccl_timeout": 0.0, "gloo_timeout": 120.0}, "nccl")
    assert 5.0 <= left <= 150.0
    assert dist.pg_timeout_s({"deadline": 300.0, "nccl_timeout": 30.0, "gloo_timeout": 120.0}, "nccl") == 30.0
    assert dist.pg_timeout_s({"deadline": 300.0, "nccl_timeout": 0.0, "gloo_timeout": 120.0}, "gloo") == 120.0




def test_slurm_job_plans_nccl_from_the_profiles_gres(project):
    """proteomics-gpu (gpus 1, collectives world 2) on a gpu:1 allocation: NCCL at world 1, gloo at 2."""
    import yaml

    from .support import run_envport

    profile = yaml.safe_load((project / "slurm" / "clusters" / "example-gpu.yaml").read_text())
    profile.update(name="one-gpu", gres="gpu:1")
    (project / "slurm" / "clusters" / "one-gpu.yaml").write_text(yaml.safe_dump(profile))
    proc = run_envport("slurm", "submit", "proteomics-gpu", "--cluster", "one-gpu", "--target", "venv",
                       "--dry-run", root=project, timeout=120)
    assert proc.returncode == 0, proc.stderr
    dist_lines = [ln for ln in proc.stdout.splitlines() if "dist.py" in ln]
    assert [("--world-size 2 --device cpu" in ln, "--world-size 1 --device cuda" in ln) for ln in dist_lines] == [
        (True, False), (False, True)], dist_lines

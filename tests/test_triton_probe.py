"""Triton's compile probe (issue 42): a tl.sum kernel written to a FILE and run as a CHILD with a deadline.

No GPU and no Triton can be had here, so the tests use STUBS on PYTHONPATH and say so: a `triton` package
that answers with a version (and, for the abort test, calls os.abort() when a kernel is decorated, the way
a Triton too old for the card aborts in LLVM), and a sitecustomize that makes the real CPU torch report one
sm_121 card.  What is real: kernel.py, the kernel file it writes, the child process and its SIGABRT, and
the judge turning the records into rows.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from envport.core.verdict import Verdict
from envport.spec.model import Spec
from envport.witness.judge import call_results, parse_sentinels
from envport.witness.launchers.base import WITNESS_DIR, LaunchResult
from envport.witness.plan import WitnessCall

from .support import torch_python

STUB_TRITON = '''"""A STUB of triton for envport's tests (tests/test_triton_probe.py)."""
__version__ = "3.3.1+envport.stub"


def jit(fn):
    {body}
'''
# A Triton that cannot lower the card's warp shuffle dies in LLVM with abort(): no try/except survives it.
ABORTS = 'import os, sys\n    sys.stderr.write("LLVM ERROR: Cannot select: intrinsic %llvm.nvvm.shfl.sync.bfly.i32\\n")\n' \
         '    sys.stderr.flush()\n    os.abort()'
# The real CPU torch told to report one sm_121 card (a mock of the GPU, for the probe's gate only).
FAKE_CARD = '''import torch.cuda
torch.cuda.is_available = lambda: True
torch.cuda.get_device_capability = lambda i=0: (12, 1)
torch.cuda.get_device_name = lambda i=0: "NVIDIA GB10 (faked)"
'''


def _stubs(folder: Path, body: str, fake_card: bool) -> Path:
    (folder / "triton" / "language").mkdir(parents=True)
    (folder / "triton" / "__init__.py").write_text(STUB_TRITON.format(body=body))
    (folder / "triton" / "language" / "__init__.py").write_text("constexpr = int  # the annotation the kernel names\n")
    if fake_card:
        (folder / "sitecustomize.py").write_text(FAKE_CARD)
    return folder


def _probe(pythonpath: Path) -> tuple[subprocess.CompletedProcess, list[dict]]:
    proc = subprocess.run([torch_python(), str(WITNESS_DIR / "kernel.py"), "--framework", "triton"],
                          capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(pythonpath), "PATH": "/usr/bin:/bin"})
    return proc, parse_sentinels(proc.stdout)


def _row(proc, recs):
    spec = Spec(name="t", base="debian:bookworm", python="3.11", witnesses={"kernel": ["triton"]})
    call = WitnessCall("kernel.py", ["--framework", "triton"], ["kernel"], 60, "kernel")
    (row,) = call_results(spec, call, LaunchResult(["kernel.py"], proc.returncode, proc.stdout, 1.0))
    return row


def test_without_a_gpu_the_probe_is_skipped_with_its_reason(tmp_path):
    proc, recs = _probe(_stubs(tmp_path, "return fn", fake_card=False))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (rec,) = recs
    assert rec["framework"] == "triton" and rec["triton"] == "3.3.1+envport.stub"
    row = _row(proc, recs)
    assert (row.step, row.verdict) == ("kernel (triton)", Verdict.SKIPPED)
    assert row.detail.startswith("triton 3.3.1+envport.stub: no GPU torch can see: Triton compiles for a GPU only")


def test_a_kernel_that_aborts_is_a_failed_row_naming_the_card_the_version_and_the_routes(tmp_path):
    proc, recs = _probe(_stubs(tmp_path, ABORTS, fake_card=True))
    # kernel.py itself survived the abort: it exited 1 with its sentinel, the child took the SIGABRT.
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (rec,) = recs
    assert rec["rc"] == -6 and rec["sm"] == "sm_121"
    row = _row(proc, recs)
    assert (row.step, row.verdict, row.reason) == ("kernel (triton)", Verdict.FAILED, "triton_cannot_compile")
    assert row.detail == ("triton 3.3.1+envport.stub cannot build a tl.sum kernel for sm_121 (NVIDIA GB10 (faked)): "
                          "the tl.sum kernel killed by SIGABRT: LLVM ERROR: Cannot select: intrinsic "
                          "%llvm.nvvm.shfl.sync.bfly.i32")
    routes = [ln for ln in row.lines if ln.startswith("route out: ")]
    assert len(routes) == 3 and "Triton whose LLVM and bundled ptxas know this card" in routes[0]


def test_the_kernel_runs_from_a_file_in_a_child(tmp_path):
    """The child reads its kernel from a file (Triton's jit reads its source with inspect): a stub jit that
    asks inspect for the source fails under `python -c`, passes from the probe's file."""
    reads_source = "import inspect\n    inspect.getsource(fn)\n    raise SystemExit('source read: ok')"
    proc, recs = _probe(_stubs(tmp_path, reads_source, fake_card=True))
    (rec,) = recs
    # The stub exits 1 after reading the source: the probe reports the child's own words, not "could not get source".
    assert rec["rc"] == 1 and rec["error"] == "the tl.sum kernel exit 1: source read: ok", rec

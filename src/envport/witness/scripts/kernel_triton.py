"""Triton's compile probe: a tiny tl.sum kernel written to a FILE and run as a CHILD with a deadline
(kernel.py runs it; so do the doctor and the GPU host's check).

Triton builds kernels at first use, so an env can pass every torch check and
die on its first Triton kernel.  `tl.sum` emits a warp shuffle, the
instruction a Triton too old for the card cannot lower.  The kernel goes to a
file because `@triton.jit` reads its own source with `inspect` (under
`python -c` it fails with "could not get source code": the right verdict for
the wrong reason); and it runs in a child because the failure is an abort()
(LLVM ERROR: Cannot select ... shfl.sync), which no try/except survives.
Triton's kernels take torch tensors here, so the probe needs torch and a GPU
torch can see; without one it is skipped, saying so.
"""

import os
import shutil
import signal
import subprocess
import sys
import tempfile

OK_LINE = "ENVPORT-TRITON-REDUCE-OK"
DEADLINE_ENV = "ENVPORT_TRITON_PROBE_DEADLINE"  # seconds; kernel.py sets it to half its own --deadline


def deadline_s():
    return float(os.environ.get(DEADLINE_ENV) or 300)

# The child's whole program: 256 ones reduced by one program instance must give 256.
REDUCE_SRC = """\
import torch
import triton
import triton.language as tl


@triton.jit
def reduce_kernel(x_ptr, out_ptr, N: tl.constexpr):
    tl.store(out_ptr, tl.sum(tl.load(x_ptr + tl.arange(0, N)), axis=0))


x = torch.ones(256, device="cuda", dtype=torch.float32)
out = torch.zeros(1, device="cuda", dtype=torch.float32)
reduce_kernel[(1,)](x, out, N=256)
torch.cuda.synchronize()
got = float(out[0])
assert abs(got - 256.0) < 1e-3, "tl.sum of 256 ones gave " + repr(got)
print("OK_LINE")
""".replace("OK_LINE", OK_LINE)


def gpu_seen(rec):
    """Whether the probe can run: Triton importable and a GPU torch sees; fills rec (versions, the card's sm)."""
    import triton

    rec["triton"] = getattr(triton, "__version__", None)
    try:
        import torch
    except Exception as exc:
        rec["skipped"] = "Triton's kernels take torch tensors and torch is not importable (%s)" % exc
        return False
    rec["torch"] = torch.__version__
    if not torch.cuda.is_available():
        rec["skipped"] = "no GPU torch can see: Triton compiles for a GPU only (torch %s, CUDA build %s)" % (
            torch.__version__, getattr(torch.version, "cuda", None))
        return False
    cap = torch.cuda.get_device_capability(0)
    rec["capability"] = [int(cap[0]), int(cap[1])]
    rec["sm"] = "sm_%d%d" % tuple(cap)
    rec["gpu"] = torch.cuda.get_device_name(0)
    return True


def why_no_gpu(rec):
    return "a GPU was required: " + rec.get("skipped", "torch sees no GPU")


def _said(returncode, stdout, stderr):
    """Why the child did not print its line: its signal or exit status, and its last words."""
    if returncode is not None and returncode < 0:
        try:
            how = "killed by %s" % signal.Signals(-returncode).name
        except ValueError:
            how = "killed by signal %d" % -returncode
    else:
        how = "exit %s" % returncode
    lines = [ln for ln in ((stderr or "") + "\n" + (stdout or "")).splitlines() if ln.strip()]
    # LLVM's own "LLVM ERROR: ..." is the line that names the cause, wherever it sits in the output.
    cause = next((ln for ln in lines if "LLVM ERROR" in ln or "ptxas" in ln), lines[-1] if lines else "no output")
    return how, cause.strip()[:300]


def compile_probe(rec, python=None, deadline=None):
    """Write the kernel to a file, run it as a child under a deadline; fills rec (ok, rc, why, tail)."""
    deadline = deadline or deadline_s()
    folder = tempfile.mkdtemp(prefix="envport-triton-probe-")
    path = os.path.join(folder, "triton_reduce_probe.py")
    try:
        with open(path, "w") as f:
            f.write(REDUCE_SRC)
        try:
            res = subprocess.run([python or sys.executable, path], capture_output=True, text=True,
                                 timeout=deadline, cwd=folder)
        except subprocess.TimeoutExpired:
            rec.update(ok=False, rc=None, error="the tl.sum kernel did not finish in %gs" % deadline)
            return rec
        rec["rc"] = res.returncode
        rec["ok"] = res.returncode == 0 and OK_LINE in (res.stdout or "")
        if not rec["ok"]:
            how, cause = _said(res.returncode, res.stdout, res.stderr)
            rec["error"] = "the tl.sum kernel %s: %s" % (how, cause)
            rec["tail"] = [ln for ln in (res.stderr or "").splitlines() if ln.strip()][-8:]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return rec


def run(rec, on_gpu):
    if not on_gpu:
        rec["ok"] = True  # skipped, not failed: the reason is in rec["skipped"]
        rec.setdefault("skipped", "no GPU here")
        return rec
    return compile_probe(rec)

"""What JAX and Triton see in this interpreter, for the census, the doctor and the GPU host's check.

A provider's accelerator is not always torch's: an env can pin a CPU-only
torch (a weights converter) while JAX drives the card, and an env whose torch
covers the card can still die on its first Triton kernel.  So the probe
reports what every framework present sees and the caller judges, per
framework.  torch's own view is gpus.py's (and the doctor's torch probe).

    python frameworks.py     # one sentinel line: {"check": "frameworks", "jax": {...}, "triton": {...}}
"""

import glob
import importlib.util
import os
import re
import subprocess
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from envport_sentinel import emit

# JAX names its CUDA and ROCm backends "gpu" (default_backend) and its devices' platform "gpu", "cuda" or "rocm".
GPU_PLATFORMS = ("gpu", "cuda", "rocm")
PTXAS_HELP_TIMEOUT_S = 30


def present(name):
    """Whether `name` is installed here, without importing it (an absent framework is not reported)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def jax_view():
    """jax's version, default backend and the GPUs it lists (with their compute capability); None if absent."""
    if not present("jax"):
        return None
    out = {}
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import jax

            out["version"] = jax.__version__
            out["backend"] = jax.default_backend()
        said = ["%s" % w.message for w in caught if "gpu" in str(w.message).lower() or "cuda" in str(w.message).lower()]
        if said:
            out["warnings"] = said
        try:
            import jaxlib

            out["jaxlib"] = getattr(jaxlib, "__version__", None)
        except Exception:
            out["jaxlib"] = None
        out["devices"] = []
        if out["backend"] in GPU_PLATFORMS:
            for dev in jax.devices():
                cc = getattr(dev, "compute_capability", None)
                out["devices"].append({"index": int(dev.id), "platform": dev.platform,
                                       "name": getattr(dev, "device_kind", str(dev)),
                                       "capability": str(cc) if cc else None})
    except Exception as exc:  # a broken jax says why, never stops the probe
        out["error"] = "%s: %s" % (type(exc).__name__, exc)
    return out


def _ptxas_targets(path):
    """The sm_XY names a ptxas binary's --help lists (the targets it can emit code for)."""
    try:
        res = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=PTXAS_HELP_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return []
    return sorted(set(re.findall(r"sm_\d+a?", (res.stdout or "") + (res.stderr or ""))))


def triton_view():
    """Triton's version and, per ptxas its wheel bundles, the targets it can emit; None if absent.

    Triton is a second toolchain beside torch's cubins: it builds kernels at first use with the ptxas in its
    own wheel, whose CUDA may predate the card (then "ptxas fatal: Value 'sm_121a' is not defined").
    """
    if not present("triton"):
        return None
    out = {}
    try:
        import triton

        out["version"] = getattr(triton, "__version__", None)
        base = os.path.dirname(os.path.abspath(triton.__file__))
        bins = sorted(glob.glob(os.path.join(base, "backends", "nvidia", "bin", "ptxas*")))
        out["ptxas"] = {os.path.basename(p): _ptxas_targets(p) for p in bins}
    except Exception as exc:
        out["error"] = "%s: %s" % (type(exc).__name__, exc)
    return out


def main():
    rec = {"check": "frameworks", "name": "frameworks", "ok": True, "python": sys.executable}
    for name, view in (("jax", jax_view), ("triton", triton_view)):
        seen = view()
        if seen is not None:
            rec[name] = seen
    emit(rec)
    return 0


if __name__ == "__main__":
    sys.exit(main())


def judge_output(rec, finite, shape, diff=None):
    """REC's ok (and error) from a kernel's output: finite, of the expected [8, 4] shape and, on a GPU (DIFF
    given), within reach of the same forward pass on the CPU."""
    ok = finite and list(shape) == [8, 4]
    if diff is not None:
        rec["max_abs_diff_vs_cpu"] = diff
        # GPU matmuls default to TF32-class precision on Ampere+ (torch and XLA alike): ~1e-3 against fp32.
        ok = ok and diff < 1e-2
        if diff >= 1e-2:
            rec["error"] = "GPU result differs from CPU by %g" % diff
    if not finite:
        rec["error"] = "output has NaN or Inf"
    rec["ok"] = ok

"""Witness probe: the GPUs the env's own frameworks see, for the planner.

nvidia-smi can be missing from PATH or answer oddly (sandboxed runtimes such
as gVisor) while torch drives the GPU, and torch can see none while
nvidia-smi lists several (a CPU build, a driver older than torch's CUDA
build).  And a provider's accelerator is not always torch's: a CPU-only torch
can sit beside a JAX that drives the card.  The planner counts them all and
says when they disagree; this prints the env's side as one sentinel line:
torch's count (with torch's own warning when CUDA is unavailable), and what
JAX and Triton see where they are installed (frameworks.py).

    python gpus.py
"""

import os
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from envport_sentinel import emit
from frameworks import jax_view, triton_view


def torch_view(rec):
    """torch's version, CUDA build and the GPUs it sees, into rec; False where torch is not importable."""
    try:
        import torch
    except Exception as exc:  # the sentinel must say what broke
        rec["error"] = "%s: %s" % (type(exc).__name__, exc)
        return False
    rec.update(torch=torch.__version__, cuda=getattr(torch.version, "cuda", None))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        available = bool(torch.cuda.is_available())
    rec["available"] = available
    said = ["%s" % w.message for w in caught if "cuda" in str(w.message).lower()]
    if said:
        rec["warnings"] = said
    if available:
        rec["count"] = torch.cuda.device_count()
        rec["devices"] = [{"index": i, "name": torch.cuda.get_device_name(i),
                           "capability": "%d.%d" % torch.cuda.get_device_capability(i)}
                          for i in range(rec["count"])]
    return True


def main():
    # ok: torch answered (its count is `count`); `jax` and `triton` are there whenever they are installed.
    rec = {"check": "gpus", "name": "gpus", "ok": False, "count": 0}
    rec["ok"] = torch_view(rec)
    for name, view in (("jax", jax_view), ("triton", triton_view)):
        seen = view()
        if seen is not None:
            rec[name] = seen
    emit(rec)
    return 0 if rec["ok"] or "jax" in rec else 1


if __name__ == "__main__":
    sys.exit(main())

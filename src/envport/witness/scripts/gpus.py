"""Witness probe: the GPUs the env's own torch sees, for the planner.

nvidia-smi can be missing from PATH or answer oddly (sandboxed runtimes such
as gVisor) while torch drives the GPU, and torch can see none while
nvidia-smi lists several (a CPU build, a driver older than torch's CUDA
build).  The planner counts both and says when they disagree; this prints
torch's side as one sentinel line, with torch's own warning when CUDA is
unavailable.

    python gpus.py
"""

import os
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from envport_sentinel import emit


def main():
    rec = {"check": "gpus", "name": "gpus", "ok": False, "count": 0}
    try:
        import torch
    except Exception as exc:  # the sentinel must say what broke
        rec["error"] = "%s: %s" % (type(exc).__name__, exc)
        emit(rec)
        return 1
    rec.update(torch=torch.__version__, cuda=getattr(torch.version, "cuda", None), ok=True)
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
    emit(rec)
    return 0


if __name__ == "__main__":
    sys.exit(main())

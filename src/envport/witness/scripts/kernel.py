"""Witness: torch dispatches a real kernel on the env's device.

A seeded two-layer MLP forward pass; the sentinel carries the device, output
shape and a checksum.  On a GPU the same pass also runs on the CPU and the two
must agree, and the card's capability is reported with torch's arch list so
the caller can say why a "no kernel image is available" happened.  Where CUDA
is unavailable, torch's own words come back (its "The NVIDIA driver on your
system is too old (found version 12080)" warning), not just "unavailable".

    python kernel.py [--device auto|cpu|cuda]
"""

import argparse
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from envport_sentinel import emit


def forward(torch, device):
    gen = torch.Generator().manual_seed(1234)
    x = torch.randn(8, 16, generator=gen)
    torch.manual_seed(1234)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    model = model.to(device)
    with torch.no_grad():
        y = model(x.to(device))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return y.detach().to("cpu")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    args = ap.parse_args(argv)
    t = time.time()
    rec = {"check": "kernel", "name": "kernel", "ok": False}
    try:
        import torch
        rec["torch"] = torch.__version__
        rec["cuda"] = getattr(torch.version, "cuda", None)
        # torch says why CUDA is unavailable only as a warning, once, on the first probe.
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            cuda_ok = torch.cuda.is_available()
        said = ["%s" % w.message for w in caught if "cuda" in str(w.message).lower()]
        if said:
            rec["cuda_warnings"] = said
        if args.device == "cuda" and not cuda_ok:
            rec["error"] = ("a CUDA device was required but torch.cuda.is_available() is False "
                            "(torch %s, built for CUDA %s)" % (torch.__version__, rec["cuda"]))
            if said:
                rec["error"] += ": " + said[0]
            rec["seconds"] = round(time.time() - t, 3)
            emit(rec)
            return 1
        device = torch.device("cuda:0" if args.device != "cpu" and cuda_ok else "cpu")
        rec["device"] = str(device)
        if device.type == "cuda":
            rec["gpu"] = torch.cuda.get_device_name(device)
            rec["capability"] = list(torch.cuda.get_device_capability(device))
            rec["arch_list"] = list(torch.cuda.get_arch_list())
        y = forward(torch, device)
        rec["shape"] = list(y.shape)
        rec["dtype"] = str(y.dtype).replace("torch.", "")
        rec["checksum"] = round(float(y.double().sum()), 6)
        finite = bool(torch.isfinite(y).all())
        ok = finite and list(y.shape) == [8, 4]
        if device.type == "cuda":
            ref = forward(torch, torch.device("cpu"))
            diff = float((y - ref).abs().max())
            rec["max_abs_diff_vs_cpu"] = diff
            # TF32 matmuls on Ampere+ differ from fp32 CPU at ~1e-3 on values near 1.
            ok = ok and diff < 1e-2
            if diff >= 1e-2:
                rec["error"] = "GPU result differs from CPU by %g" % diff
        if not finite:
            rec["error"] = "output has NaN or Inf"
        rec["ok"] = ok
    except Exception as exc:  # the sentinel must say what broke, whatever it was
        rec["error"] = "%s: %s" % (type(exc).__name__, exc)
    rec["seconds"] = round(time.time() - t, 3)
    emit(rec)
    return 0 if rec["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

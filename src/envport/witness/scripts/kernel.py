"""Witness: each framework the env holds dispatches a real kernel on its device.

torch (kernel_torch.py) and JAX (kernel_jax.py) each run a seeded two-layer
MLP and print their own sentinel: the framework, device, output shape and a
checksum.  Triton (kernel_triton.py) compiles and runs a tl.sum kernel in a
child process on the GPU, and is skipped, saying why, without one.
--framework names them; without it every one importable runs.

A GPU run (--device cuda) asks that the env drive a GPU, and a provider's
accelerator is not always torch's: an AlphaFold 3 env pins a CPU-only torch
for its weights converter while JAX drives the card.  So a framework that sees
no GPU fails only when no other framework here sees one; otherwise it runs on
the CPU and its sentinel names the framework that has the card.

    python kernel.py [--device auto|cpu|cuda] [--deadline S] [--framework torch|jax|triton ...]
"""

import argparse
import importlib
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from envport_sentinel import emit

FRAMEWORKS = ("torch", "jax", "triton")


def _module(name):
    return importlib.import_module("kernel_" + name)


def _probe(names):
    """{name: (rec, gpu_seen)} for every framework importable; a framework that fails to import has
    ok False and its error."""
    out = {}
    for name in names:
        rec = {"check": "kernel", "name": name, "framework": name, "ok": False}
        t = time.time()
        try:
            seen = _module(name).gpu_seen(rec)
        except Exception as exc:  # the sentinel must say what broke, whatever it was
            rec["error"] = "%s: %s" % (type(exc).__name__, exc)
            seen = None
        rec["seconds"] = round(time.time() - t, 3)
        out[name] = (rec, seen)
    return out


def _run(name, rec, seen, device, gpu_elsewhere):
    t = time.time() - rec["seconds"]
    mod = _module(name)
    try:
        if device == "cuda" and not seen:
            if not gpu_elsewhere:
                rec["error"] = mod.why_no_gpu(rec)
                return rec
            rec["gpu_is"] = gpu_elsewhere
        mod.run(rec, on_gpu=bool(seen) and device != "cpu")
    except Exception as exc:  # the sentinel must say what broke, whatever it was
        rec["error"] = "%s: %s" % (type(exc).__name__, exc)
        rec["ok"] = False
    rec["seconds"] = round(time.time() - t, 3)
    return rec


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    ap.add_argument("--deadline", type=float, default=None,
                    help="this call's deadline in seconds: Triton's compile child gets half of it")
    ap.add_argument("--framework", action="append", choices=FRAMEWORKS, default=[],
                    help="a framework to witness (repeatable); default: every one importable")
    args = ap.parse_args(argv)
    if args.deadline:
        # Half: torch's and JAX's passes (and the interpreter's start) share the rest.
        os.environ["ENVPORT_TRITON_PROBE_DEADLINE"] = str(max(10.0, args.deadline / 2))
    named = list(dict.fromkeys(args.framework))
    probed = _probe(named or FRAMEWORKS)
    if not named:
        found = [n for n, (_, seen) in probed.items() if seen is not None]
        if not found:
            # Nothing to witness: every framework's own import error, so the row can name them all.
            for rec, _ in probed.values():
                emit(rec)
            return 1
        probed = {n: probed[n] for n in found}
    gpus = [n for n, (_, seen) in probed.items() if seen]
    ok = True
    for name, (rec, seen) in probed.items():
        if seen is not None:
            others = [g for g in gpus if g != name]
            rec = _run(name, rec, seen, args.device, others[0] if others else "")
        emit(rec)
        ok = ok and rec["ok"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

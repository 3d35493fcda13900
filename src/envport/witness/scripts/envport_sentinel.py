"""The one line format every witness prints; stdlib only.

A witness runs inside a built env whose own output (pip notices, torch
warnings, NCCL logs) shares the stream, so each result is one line that starts
with PREFIX followed by a JSON object: grep-able by people and parseable by
envport.witness.judge.  Keep this file importable by any Python >= 3.8 with
nothing but the stdlib: it is bind-mounted into envs, never installed there.
"""

import json
import os
import socket
import sys

PREFIX = "ENVPORT-WITNESS "
FAULT_ENV = "ENVPORT_WITNESS_FAULT"  # test-only: "hang:1", "wrong:1", "crash:1", "samegpu:1" [,...]
FAULT_KINDS = ("hang", "wrong", "crash", "samegpu")
# Set before any process group exists (setdefault: the launcher may know better).
# Async error handling lets a failed NCCL rank tear the group down instead of
# leaving its peers blocked.  The doctor's launch recipe exports the same (one
# definition, shared by both).  No allocator setting: PYTORCH_CUDA_ALLOC_CONF
# prints a deprecation warning on every rank from torch 2.9 (renamed
# PYTORCH_ALLOC_CONF), and expandable segments are one more thing a sandboxed
# runtime must support, for witnesses that allocate a few bytes.
HARDENING_ENV = {
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
}
# What the witnesses add on top.  Blocking wait turns a hung NCCL collective
# into an exception at its process group's timeout (set inside the witness
# deadline), so the rank reports it on its sentinel line instead of showing
# only a stack in `.to("cpu")`; torch then ignores async error handling in that
# process.  NCCL_DEBUG=WARN keeps NCCL's own reason (the WARN line behind its
# "Last error:") in the output.
WITNESS_ENV = dict(HARDENING_ENV, TORCH_NCCL_BLOCKING_WAIT="1", NCCL_DEBUG="WARN")


def free_port():
    """One OS-assigned port, chosen once and handed to every rank.

    Ranks that each picked a port, or a hard-coded one, collide across
    concurrent runs (CI, worktrees) and race to rebind.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("", 0))
        return s.getsockname()[1]


def emit(record):
    """Write one sentinel line in a single write() so ranks sharing a pipe do not interleave."""
    line = PREFIX + json.dumps(record, sort_keys=True, default=str) + "\n"
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), line.encode("utf-8", "replace"))


def faults():
    """Parse the fault switch into [(kind, rank, arg)], e.g. "wrong:1:all_gather"."""
    out = []
    for item in os.environ.get(FAULT_ENV, "").split(","):
        parts = item.strip().split(":")
        if len(parts) < 2 or parts[0] not in FAULT_KINDS:
            continue
        try:
            rank = int(parts[1])
        except ValueError:
            continue
        out.append((parts[0], rank, parts[2] if len(parts) > 2 else ""))
    return out


def tail(text, n=20):
    lines = [ln for ln in (text or "").splitlines() if ln.strip()]
    return lines[-n:]

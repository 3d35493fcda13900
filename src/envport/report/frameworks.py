"""What JAX and Triton see in an interpreter, and the doctor's judgements of it, framework by framework.

A provider's accelerator is not always torch's (seed 002: an AlphaFold 3 env
pins a CPU-only torch for its weights converter while JAX drives the card,
and judging it by torch alone refused an env that works).  So the doctor
probes every framework present with the witness scripts the census runs
(witness/scripts/frameworks.py, and kernel.py's Triton compile probe), and a
card any of them can drive is judged by that framework, which the verdict
names.  Nothing here installs or changes anything.
"""

from __future__ import annotations

import sys
from typing import Optional

from envport.core.finding import Finding
from envport.core.proc import run
from envport.core.verdict import Verdict

def _script(python: Optional[str], script: str, args: list[str], timeout: float) -> tuple[Optional[dict], str]:
    """The sentinel record a witness script printed under `python`, or (None, why)."""
    from envport.witness.judge import parse_sentinels
    from envport.witness.launchers.base import WITNESS_DIR

    python = python or sys.executable
    res = run([python, str(WITNESS_DIR / script), *args], timeout=timeout)
    if res.returncode is None:
        return None, f"{python} did not run or answer in {timeout:.0f}s"
    recs = parse_sentinels(res.stdout)
    if not recs:
        return None, ((res.stderr or "").strip().splitlines() or [f"exit {res.returncode}"])[-1]
    return recs[0], ""


def frameworks_probe(python: Optional[str] = None, timeout: float = 180) -> dict:
    """{"jax": {...}, "triton": {...}} for the frameworks `python` holds (absent ones are left out), or
    {"error": why} where the probe did not answer."""
    rec, why = _script(python, "frameworks.py", [], timeout)
    if rec is None:
        return {"error": why}
    return {k: rec[k] for k in ("jax", "triton") if k in rec}


def triton_probe(python: Optional[str] = None, timeout: float = 420) -> dict:
    """kernel.py's Triton compile probe under `python`: its record (ok, skipped, error, sm, triton)."""
    rec, why = _script(python, "kernel.py", ["--framework", "triton"], timeout)
    return rec if rec is not None else {"ok": False, "error": why}


def jax_gpus(frameworks: dict) -> list[dict]:
    """The GPUs the probed JAX lists ([] where it lists none or is not there)."""
    return list(((frameworks or {}).get("jax") or {}).get("devices") or [])


def jax_said(frameworks: dict) -> str:
    jax = (frameworks or {}).get("jax") or {}
    return f"JAX {jax.get('version')} (backend {jax.get('backend')})"


def judge_by_jax(gpu_index, capability: Optional[str], frameworks: dict, torch_detail: str) -> Optional[dict]:
    """A card torch cannot drive, judged by JAX: the arch row where JAX lists it, else None."""
    devices = jax_gpus(frameworks)
    dev = next((d for d in devices if d.get("index") == gpu_index), None) or (devices[0] if devices else None)
    if dev is None:
        return None
    cap = dev.get("capability") or capability
    sm = f"sm_{cap.replace('.', '')}" if cap else "this card"
    return {"index": gpu_index, "capability": cap, "runnable": True, "via": "jax", "jit": False,
            "judged_by": "jax",
            "detail": f"{sm} runs via {jax_said(frameworks)}: it lists {dev.get('name')}; torch: {torch_detail}"}


def triton_finding(rec: Optional[dict]) -> list[Finding]:
    """The Triton compile probe as a finding: OK, SKIPPED with its reason, or FAILED naming the card's sm,
    the Triton version and the routes out (a note-free [] where the env holds no Triton)."""
    from envport.witness.judge import TRITON_REASON, TRITON_ROUTES

    if rec is None:
        return []
    version = rec.get("triton") or "?"
    if rec.get("skipped"):
        return [Finding("", f"triton {version}: {rec['skipped']}", check="triton", verdict=Verdict.SKIPPED)]
    card = f"{rec.get('sm', '?')} ({rec.get('gpu', 'GPU')})"
    if rec.get("ok"):
        return [Finding("", f"triton {version} compiled and ran a tl.sum kernel on {card} in a child process",
                        check="triton", verdict=Verdict.OK)]
    return [Finding(TRITON_REASON, f"triton {version} cannot build a tl.sum kernel for {card}: "
                    f"{rec.get('error', 'no reason given')}", "; or ".join(TRITON_ROUTES), check="triton",
                    verdict=Verdict.FAILED)]

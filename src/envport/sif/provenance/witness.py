"""envport's witness predicate (type WITNESS_PREDICATE; its JSON Schema is docs/witness-predicate.schema.json).

One entry per witness step a run reported, failed ones included (an attestation that left out a failure
would say more than was shown): the check it belongs to, its verdict and reason, the backend and world size
of a collectives or DTensor run, its time. Beside them: the launcher (docker, SIF under ch-run or srun, ...),
the GPUs the run's census saw (none: an empty list), the host's architecture, the run's start and finish.
Built from the StepResults `witness/run.py` returns; pure.
"""

from __future__ import annotations

import platform
import re
from datetime import datetime, timezone
from typing import Optional

from envport.sif.provenance.slsa import rfc3339

SCHEMA_FILE = "witness-predicate.schema.json"  # under docs/
# The launcher a verification's statement names (`verify --attest`, `up --attest`'s verify step).
VERIFY_LAUNCHER = "verify (testinfra against the SIF)"
# A step's first word -> the check (witness/checks.py CHECKS) it reports for.
STEP_CHECKS = {"python": "python", "import": "imports", "cli": "cli", "weight": "weights", "kernel": "kernel",
               "collectives": "collectives", "dtensor": "dtensor", "doc": "docs", "docs": "docs"}
_WORLD = re.compile(r"\((?:world|mesh) ([0-9x]+)")


def utc_now() -> datetime:
    """Now, in UTC: a statement's startedOn (taken before the run) and finishedOn."""
    return datetime.now(timezone.utc)


def check_of(step: str) -> str:
    """The check STEP reports for (`import torch` -> imports), or the step's own first word (gpus, launcher)."""
    word = step.split(" ", 1)[0]
    return STEP_CHECKS.get(word, word)


def _world(step: str) -> Optional[int]:
    m = _WORLD.search(step)
    if not m:
        return None
    size = 1
    for part in m.group(1).split("x"):
        size *= int(part)
    return size


def entry(r) -> dict:
    check = check_of(r.step)
    out = {"step": r.step, "check": check, "verdict": r.verdict.value, "detail": r.detail,
           "seconds": round(float(r.seconds), 3)}
    if r.reason:
        out["reason"] = r.reason
    if check in ("collectives", "dtensor"):
        out["backend"] = "nccl" if ", nccl" in r.step else "gloo"
        out["worldSize"] = _world(r.step)
    return out


def gpus_seen(steps) -> list:
    """The GPUs the run saw, from the census it took (witness/census.py): one entry per card the env's framework
    listed (model, compute capability, nvidia-smi's driver where the run was counted, which framework saw it);
    where it listed none but GPUs were counted (a Slurm allocation's gres), the census's counts; [] for none."""
    for r in steps:
        census = (r.data or {}).get("census") if r.step == "gpus" else None
        if not census:
            continue
        cards = census.get("devices") or []
        if cards:
            return [{"index": d.get("index"), "model": d.get("name"), "capability": d.get("capability"),
                     "driver": census.get("driver"), "seenBy": d.get("seen_by")} for d in cards]
        return [census] if census.get("count") else []
    return []


def predicate(*, env: str, env_hash: str, target: str, launcher: str, steps, verdict: str,
              started: datetime, finished: datetime, arch: Optional[str] = None) -> dict:
    return {"env": {"name": env, "hash": env_hash}, "target": target, "launcher": launcher,
            "host": {"arch": arch or platform.machine()}, "gpus": gpus_seen(steps), "verdict": verdict,
            "startedOn": rfc3339(started), "finishedOn": rfc3339(finished),
            "witnesses": [entry(r) for r in steps]}


def passed(pred: dict) -> dict[str, bool]:
    """check -> whether every step of it passed (OK) in this predicate; a check with no step is absent."""
    out: dict[str, bool] = {}
    for w in pred.get("witnesses") or []:
        if isinstance(w, dict) and isinstance(w.get("check"), str):
            out[w["check"]] = out.get(w["check"], True) and w.get("verdict") == "OK"
    return out

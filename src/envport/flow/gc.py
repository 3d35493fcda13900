"""`envport gc`: which builds of old hashes go, over every target, and what removing them freed.

Per env and target, each artefact a target finds (targets/base.py `artefacts`) is, in this order:
left (it is named like envport's but lacks envport's marks: never touched), removed (a build that never
became the env), kept (the current hash: the one `build` gives the spec on the site, locked or
`--no-lock`), kept (held: a ledger `hold` record names its hash), kept (one of the KEEP most recently
used old hashes: last used is the newest ledger record of that hash on that target, else when the
artefact was made), or removed.  An artefact that is busy (a container of the image, a build holding
the env's lock) is kept, saying so.  Nothing is removed under `dry_run`.
"""

from __future__ import annotations

import datetime as _dt
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from envport.core.progress import human_size
from envport.core.verdict import StepResult, Verdict
from envport.targets.base import UNSUPPORTED_REASON, Artefact, GcRequest, Target, Unavailable, Unsupported

REMOVE, KEEP, LEAVE = "remove", "keep", "leave"
HOLD, RELEASE = "hold", "release"  # the ledger records `envport gc NAME --hold/--release HASH` writes


@dataclass(frozen=True)
class Decision:
    art: Artefact
    action: str  # REMOVE, KEEP or LEAVE
    why: str


@dataclass(frozen=True)
class EnvState:
    """What the ledger and the spec say about one env, for `decide`."""

    current: frozenset  # hash12s `build` gives the spec now
    held: dict  # hash12 -> when a `hold` record was written
    last_used: dict  # (target, hash12) -> epoch seconds of its newest ledger record


def ledger_facts(records: list[dict]) -> tuple[dict, dict]:
    """(hash12 -> when held, (target, hash12) -> epoch seconds of the newest record) from a ledger."""
    held: dict[str, str] = {}
    used: dict[tuple[str, str], float] = {}
    for r in records:
        if r.get("kind") in (HOLD, RELEASE) and isinstance(r.get("held"), str):
            if r["kind"] == HOLD:
                held[r["held"][:12]] = str(r.get("when", ""))
            else:
                held.pop(r["held"][:12], None)
        elif isinstance(r.get("hash"), str) and isinstance(r.get("target"), str):
            try:
                t = _dt.datetime.fromisoformat(str(r.get("when"))).timestamp()
            except ValueError:
                continue
            key = (r["target"], r["hash"][:12])
            used[key] = max(used.get(key, 0.0), t)
    return held, used


def _day(t: float) -> str:
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).strftime("%Y-%m-%d") if t else "never"


def decide(arts: list[Artefact], state: EnvState, keep: int) -> list[Decision]:
    """Each artefact's fate, in ARTS' order (see the module's docstring)."""
    fate: dict[int, Decision] = {}
    old: dict[str, dict[str, float]] = {}  # target -> old hash12 -> last used
    for i, a in enumerate(arts):
        if a.foreign:
            fate[i] = Decision(a, LEAVE, f"not envport's: {a.foreign}")
        elif a.unfinished:
            fate[i] = Decision(a, REMOVE, "a stopped or replaced build, never the env")
        elif a.hash12 in state.current:
            fate[i] = Decision(a, KEEP, "the current hash")
        elif a.hash12 in state.held:
            fate[i] = Decision(a, KEEP, f"held since {state.held[a.hash12][:10]} (a ledger `hold` record; "
                                        f"`envport gc {a.name} --release {a.hash12}` lets it go)")
        else:
            used = max(state.last_used.get((a.target, a.hash12), 0.0), a.made)
            hashes = old.setdefault(a.target, {})
            hashes[a.hash12] = max(hashes.get(a.hash12, 0.0), used)
    kept: dict[str, list[str]] = {t: [h for h, _ in sorted(hs.items(), key=lambda kv: (-kv[1], kv[0]))][:keep]
                                  for t, hs in old.items()}
    for i, a in enumerate(arts):
        if i in fate:
            continue
        if a.hash12 in kept[a.target]:
            fate[i] = Decision(a, KEEP, f"among the {keep} most recently used old hashes (--keep {keep}), "
                                        f"last used {_day(old[a.target][a.hash12])}")
        else:
            fate[i] = Decision(a, REMOVE, f"an old hash, last used {_day(old[a.target][a.hash12])}")
    out = []
    for i in range(len(arts)):
        d = fate[i]
        if d.action == REMOVE and d.art.busy:
            d = Decision(d.art, KEEP, f"in use: {d.art.busy}")
        out.append(d)
    return out


def _shown(where: str, root: Path) -> str:
    """WHERE relative to the project when it is inside it, with ~ for the home directory otherwise."""
    real, top = os.path.abspath(where), os.path.abspath(root)
    if real.startswith(top + os.sep):
        return os.path.relpath(real, top)
    home = os.path.expanduser("~")
    return "~" + real[len(home):] if home not in ("", "/") and real.startswith(home + os.sep) else where


def _step(d: Decision, root: Path, verdict: Verdict, detail: str, freed: Optional[int], action: str) -> StepResult:
    a = d.art
    return StepResult(f"{a.target} {_shown(a.where, root)}", verdict, detail,
                      data={"action": action, "env": a.name, "target": a.target, "hash12": a.hash12,
                            "where": a.where, "bytes": a.bytes, "freed": freed, "why": d.why})


def apply(decisions: list[Decision], targets: dict[str, Target], root: Path, dry_run: bool) -> list[StepResult]:
    """Each decision carried out (removed for real unless DRY_RUN), as one step each."""
    out = []
    for d in decisions:
        a = d.art
        label = f"{a.hash12 or 'no hash'}"
        if d.action == LEAVE:
            out.append(_step(d, root, Verdict.SKIPPED, f"left: {d.why}", None, "left"))
        elif d.action == KEEP:
            out.append(_step(d, root, Verdict.SKIPPED, f"kept {label}: {d.why}", None, "kept"))
        elif dry_run:
            out.append(_step(d, root, Verdict.SKIPPED, f"would remove {label} (--dry-run): {d.why}; "
                                                       f"{human_size(a.bytes)}", None, "would_remove"))
        else:
            try:
                freed, why = targets[a.target].remove(a)
            except OSError as exc:
                out.append(_step(d, root, Verdict.FAILED, f"cannot remove {label}: {exc}", 0, "failed"))
                continue
            if why:
                out.append(_step(d, root, Verdict.SKIPPED, f"not removed {label}: {why}", freed, "not_removed"))
            else:
                out.append(_step(d, root, Verdict.OK, f"removed {label}: {d.why}; {human_size(freed)} freed",
                                 freed, "removed"))
    return out


def scan(name: str, site, root: Path, targets: list[Target], cache: dict,
         explicit: bool) -> tuple[list[Artefact], list[StepResult]]:
    """Every target's artefacts of env NAME, and a step for each target that cannot say (REFUSED when
    EXPLICIT, the user named it: skipped otherwise)."""
    arts, steps = [], []
    req = GcRequest(name, site, root, cache)
    for t in targets:
        try:
            arts += t.artefacts(req)
        except (Unsupported, Unavailable) as exc:
            once = f"{type(exc).__name__.lower()} {t.name}"
            if explicit:
                steps.append(_cannot(exc, f"gc {name} {t.name}", Verdict.REFUSED, whole=True))
            elif once not in cache:  # once per run: the reason is the target's, not the env's
                cache[once] = True
                steps.append(_cannot(exc, f"gc {t.name}", Verdict.SKIPPED, whole=False))
    return arts, steps


def _cannot(exc: Unsupported | Unavailable, step: str, verdict: Verdict, whole: bool) -> StepResult:
    """A target that cannot list its builds: WHOLE says `--target T has no gc: …`, else the reason alone."""
    if isinstance(exc, Unsupported):
        return exc.result(step, verdict) if whole else StepResult(step, verdict, exc.reason,
                                                                  reason=UNSUPPORTED_REASON)
    return StepResult(step, verdict, exc.result.detail, reason=exc.result.reason)


def total_line(steps: list[StepResult], dry_run: bool) -> str:
    acts = [s.data.get("action") for s in steps]
    n = {k: acts.count(k) for k in ("removed", "would_remove", "kept", "left", "not_removed", "failed")}
    if dry_run:
        size = sum(s.data["bytes"] for s in steps if s.data.get("action") == "would_remove")
        head = f"would free {human_size(size)}: {n['would_remove']} to remove (--dry-run: nothing was removed)"
    else:
        size = sum(s.data["freed"] or 0 for s in steps if s.data.get("action") in ("removed", "not_removed"))
        head = f"freed {human_size(size)}: {n['removed']} removed"
        if n["not_removed"] or n["failed"]:
            head += f", {n['not_removed'] + n['failed']} not removed"
    return f"{head}, {n['kept']} kept, {n['left']} left (not envport's)"



def phase_cache_step(site, root: Path, dry_run: bool) -> Optional[StepResult]:
    """`gc --phase-cache`: the SIF builder's phase cache (builders/apptainer/phase_cache.py) emptied, what killed
    builds left included; under DRY_RUN only sized.  None when the cache is off or absent."""
    from envport.builders.apptainer.phase_cache import PhaseCache

    cache = PhaseCache.for_site(site, root)
    if cache is None or not cache.dir.is_dir():
        return None
    count, size = cache.size()
    data = {"action": "would_remove" if dry_run else "removed", "env": "", "target": "apptainer", "hash12": "",
            "where": str(cache.dir), "bytes": size, "freed": 0, "entries": count}
    step = f"apptainer {_shown(str(cache.dir), root)}"
    if dry_run:
        return StepResult(step, Verdict.SKIPPED, f"would remove the phase cache's {count} entries (--dry-run); "
                          f"{human_size(size)}", data=data)
    data["freed"] = cache.clear()
    return StepResult(step, Verdict.OK, f"removed the phase cache's {count} entries; {human_size(data['freed'])} "
                      "freed", data=data)

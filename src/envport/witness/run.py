"""Run an env's witnesses through a launcher and turn their sentinel lines into StepResults.

Spec.witnesses says what to prove; this module plans the witness scripts to
start (one basic call for python/imports/cli, one kernel call, one dist call
per distinct world size), runs each under a deadline, and reads back only the
`ENVPORT-WITNESS {...}` lines.  A check without its sentinel line is FAILED
with the output tail: a witness that died proves nothing.

A spec that needs a GPU on a host without one is REFUSED with reason
`no_accelerator` (exit 5) before anything starts, never passed on the CPU.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from envport.spec.model import Spec
from envport.core.verdict import NO_ACCELERATOR_REASON, StepResult, Verdict, exit_code
from envport.witness.scripts.envport_sentinel import FAULT_ENV, PREFIX

# Start-up allowance on top of a script's own deadline: container start and
# `import torch` (3-6 s per rank on 2 cores) happen before the script's clock.
LAUNCH_MARGIN_S = 45.0


@dataclass
class WitnessOptions:
    only: Sequence[str] = ()  # subset of CHECKS; empty = all the spec declares
    world_size: Optional[int] = None  # overrides spec.witnesses.collectives.world_size
    device: str = "auto"  # auto | cpu | cuda ("cuda" makes a GPU required)
    deadline_s: float = 300.0  # per witness script; a group past it is dumped and killed
    check_timeout_s: float = 120.0  # per import and per CLI command
    host_gpus: Optional[int] = None  # None: count them with nvidia-smi
    fault: Optional[str] = None  # test-only, passed as ENVPORT_WITNESS_FAULT
    on_line: Optional[Callable[[str], None]] = None  # every output line, for progress
    on_step: Optional[Callable[[StepResult], None]] = None  # each result as it is known
    on_start: Optional[Callable[["WitnessCall"], None]] = None  # before each witness script starts


@dataclass
class WitnessCall:
    script: str
    args: list[str]
    checks: list[str]
    deadline_s: float
    label: str
    world: int = 0
    mesh: list[int] = field(default_factory=list)


def parse_sentinels(text: str) -> list[dict]:
    """Every sentinel record in `text`; other lines (and mangled ones) are ignored."""
    out = []
    for line in text.splitlines():
        at = line.find(PREFIX)
        if at < 0:
            continue
        try:
            rec = json.loads(line[at + len(PREFIX):])
        except ValueError:
            continue
        if isinstance(rec, dict) and "check" in rec:
            out.append(rec)
    return out


def requires_gpu(spec: Spec, opts: WitnessOptions) -> bool:
    return spec.resources.gpus > 0 or opts.device == "cuda"


def _wanted(check: str, opts: WitnessOptions) -> bool:
    return not opts.only or check in opts.only


def plan(spec: Spec, opts: WitnessOptions) -> list[WitnessCall]:
    """The witness scripts to start for this spec, in order."""
    w = spec.witnesses
    device = "cuda" if requires_gpu(spec, opts) else opts.device
    calls: list[WitnessCall] = []
    basic_args: list[str] = ["--timeout", str(opts.check_timeout_s)]
    basic_checks = []
    if _wanted("python", opts):
        basic_args += ["--python", spec.python]
        basic_checks.append("python")
    if _wanted("imports", opts) and w.imports:
        for mod in w.imports:
            basic_args += ["--import", mod]
        basic_checks.append("imports")
    if _wanted("cli", opts) and w.cli:
        for c in w.cli:
            basic_args += ["--cli", json.dumps({"cmd": c.cmd, "expect": c.expect})]
        basic_checks.append("cli")
    if basic_checks:
        calls.append(WitnessCall("basic.py", basic_args, basic_checks,
                                 opts.check_timeout_s * (1 + len(w.imports) + len(w.cli)), "basic"))
    if _wanted("kernel", opts) and (w.kernel or "kernel" in opts.only):
        calls.append(WitnessCall("kernel.py", ["--device", device], ["kernel"], opts.deadline_s, "kernel"))
    dist_worlds: dict[int, list[str]] = {}
    mesh: list[int] = []
    if _wanted("collectives", opts) and (w.collectives or "collectives" in opts.only or opts.world_size):
        world = opts.world_size or (w.collectives.world_size if w.collectives else 2)
        dist_worlds.setdefault(world, []).append("collectives")
    if _wanted("dtensor", opts) and w.dtensor:
        mesh = list(w.dtensor.mesh)
        dist_worlds.setdefault(math.prod(mesh), []).append("dtensor")
    for world, checks in dist_worlds.items():
        # One group per world size: collectives and dtensor share the ranks' start-up.
        args = ["--checks", ",".join(checks), "--world-size", str(world), "--device", device,
                "--deadline", str(opts.deadline_s)]
        if "dtensor" in checks:
            args += ["--mesh", ",".join(str(m) for m in mesh)]
        calls.append(WitnessCall("dist.py", args, checks, opts.deadline_s, f"dist world {world}",
                                 world=world, mesh=mesh if "dtensor" in checks else []))
    return calls


def host_gpu_count() -> int:
    from envport.engines.gpu import gpu_count

    return gpu_count()


def run_witnesses(spec: Spec, launcher, opts: Optional[WitnessOptions] = None) -> list[StepResult]:
    """Run every planned witness through `launcher`; one StepResult per check item."""
    opts = opts or WitnessOptions()
    results: list[StepResult] = []

    def add(items: list[StepResult]) -> None:
        for r in items:
            results.append(r)
            if opts.on_step:
                opts.on_step(r)

    if requires_gpu(spec, opts):
        gpus = host_gpu_count() if opts.host_gpus is None else opts.host_gpus
        if gpus < 1:
            why = (f"spec asks for {spec.resources.gpus} GPU(s)" if spec.resources.gpus
                   else "--device cuda was asked for")
            add([StepResult("accelerator", Verdict.REFUSED, f"{why}; this host has none",
                            reason=NO_ACCELERATOR_REASON,
                            lines=["fix: run on a GPU node; `envport doctor` shows the Slurm route"])])
            return results
    problem = launcher.preflight()
    if problem is not None:
        add([problem])
        return results
    calls = plan(spec, opts)
    if not calls:
        add([StepResult("witness", Verdict.SKIPPED, "the spec declares no witnesses (or --only left none)")])
        return results
    env = {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"}
    if opts.fault:
        env[FAULT_ENV] = opts.fault
    for call in calls:
        if opts.on_start:
            opts.on_start(call)
        args = list(call.args)
        if call.script == "dist.py":
            args += ["--launch", "spawn" if launcher.spawns_ranks else "external"]
        launched = launcher.run(call.script, args, env, call.deadline_s + LAUNCH_MARGIN_S, opts.on_line)
        add(call_results(spec, call, launched))
    return results


def call_results(spec: Spec, call: WitnessCall, launched) -> list[StepResult]:
    """The StepResults of one witness call from its captured output (any launcher, or a job log)."""
    records = parse_sentinels(launched.output)
    if call.script == "basic.py":
        return _basic_results(spec, call, records, launched)
    if call.script == "kernel.py":
        return _kernel_results(spec, call, records, launched)
    return _dist_results(call, records, launched)


# --- turning records into StepResults ------------------------------------------------


def _tail(launched, n: int = 20) -> list[str]:
    lines = [ln for ln in launched.output.splitlines() if ln.strip() and PREFIX not in ln]
    return lines[-n:]


def _why_missing(launched, deadline: float) -> str:
    if launched.timed_out:
        return f"no result: stopped at the {deadline:.0f}s launcher deadline"
    return f"no result: the witness exited {launched.returncode} before reporting"


def _basic_results(spec: Spec, call: WitnessCall, records: list[dict], launched) -> list[StepResult]:
    out: list[StepResult] = []
    by_key = {(r["check"], r.get("name")): r for r in records}
    wanted: list[tuple[str, str, str]] = []
    if "python" in call.checks:
        wanted.append(("python", "python", "python"))
    if "imports" in call.checks:
        wanted += [("import", m, f"import {m}") for m in spec.witnesses.imports]
    if "cli" in call.checks:
        wanted += [("cli", c.cmd, f"cli {c.cmd}") for c in spec.witnesses.cli]
    for check, name, step in wanted:
        rec = by_key.get((check, name))
        if rec is None:
            out.append(StepResult(step, Verdict.FAILED, _why_missing(launched, call.deadline_s + LAUNCH_MARGIN_S),
                                  lines=_tail(launched), seconds=launched.seconds))
            continue
        secs = float(rec.get("seconds") or 0.0)
        if check == "python":
            detail = f"{rec.get('got')} at {rec.get('executable')} (spec: {rec.get('expected')})"
            out.append(StepResult(step, Verdict.OK if rec["ok"] else Verdict.FAILED, detail, seconds=secs,
                                  lines=[] if rec["ok"] else [f"fix: the env's interpreter is {rec.get('got')}, "
                                                              f"the spec says python: \"{rec.get('expected')}\""]))
        elif check == "import":
            if rec["ok"]:
                ver = rec.get("version") or "no __version__"
                out.append(StepResult(step, Verdict.OK, f"{ver} from {rec.get('file')}", seconds=secs))
            else:
                out.append(StepResult(step, Verdict.FAILED, rec.get("error", "import failed"),
                                      lines=list(rec.get("tail") or [])[-4:], seconds=secs))
        else:
            if rec["ok"]:
                out.append(StepResult(step, Verdict.OK, f"matched {rec.get('matched')!r} (exit {rec.get('returncode')})",
                                      seconds=secs))
            else:
                why = rec.get("error") or f"/{rec.get('expect')}/ not found in the output (exit {rec.get('returncode')})"
                out.append(StepResult(step, Verdict.FAILED, why, lines=list(rec.get("tail") or []), seconds=secs))
    return out


def _kernel_results(spec: Spec, call: WitnessCall, records: list[dict], launched) -> list[StepResult]:
    rec = next((r for r in records if r["check"] == "kernel"), None)
    if rec is None:
        return [StepResult("kernel", Verdict.FAILED, _why_missing(launched, call.deadline_s + LAUNCH_MARGIN_S),
                           lines=_tail(launched), seconds=launched.seconds)]
    secs = float(rec.get("seconds") or launched.seconds)
    detail = (f"{rec.get('device', '?')}: shape {rec.get('shape')}, checksum {rec.get('checksum')} "
              f"(torch {rec.get('torch', '?')})")
    lines: list[str] = []
    ok = bool(rec.get("ok"))
    if rec.get("capability") and rec.get("arch_list") is not None:
        from envport.witness.arch import gpu_runnable, parse_capability, sm_name

        cap = tuple(rec["capability"])
        match = gpu_runnable(cap, rec["arch_list"])
        detail += f"; {rec.get('gpu', 'GPU')} {sm_name(cap)} via {match.via or 'nothing'}"
        if match.jit:
            detail += " (PTX JIT)"
        if not match.runnable:
            lines.append(f"arch: {match.reason}")
        if spec.sm_range:
            lo, hi = (parse_capability(s) for s in spec.sm_range)
            if not lo <= cap <= hi:
                lines.append(f"note: this GPU ({sm_name(cap)}) is outside the spec's sm_range "
                             f"{spec.sm_range[0]}..{spec.sm_range[1]}")
    if not ok:
        detail = rec.get("error") or detail
    return [StepResult("kernel", Verdict.OK if ok else Verdict.FAILED, detail, lines=lines, seconds=secs)]


def _fmt_failure(rank: int, op: dict) -> str:
    if "expected_shape" in op:
        return (f"rank {rank} {op['op']} ({op.get('api')}): expected shape {op['expected_shape']}, "
                f"got {op['got_shape']}")
    return f"rank {rank} {op['op']} ({op.get('api')}): expected {op.get('expected')}, got {op.get('got')}"


def _dist_results(call: WitnessCall, records: list[dict], launched) -> list[StepResult]:
    group = next((r for r in records if r["check"] == "group"), None)
    stack_lines: list[str] = []
    if group and group.get("stacks"):
        for rank, text in sorted(group["stacks"].items(), key=lambda kv: int(kv[0])):
            stack_lines.append(f"rank {rank} stack:")
            stack_lines += [f"  {ln}" for ln in text.splitlines() if ln.strip()]
    out: list[StepResult] = []
    for n, check in enumerate(call.checks):
        step = (f"collectives (world {call.world})" if check == "collectives"
                else f"dtensor (mesh {'x'.join(str(m) for m in call.mesh)})")
        ranks = {r["rank"]: r for r in records if r["check"] == check and "rank" in r}
        problems: list[str] = []
        for rank, rec in sorted(ranks.items()):
            if rec.get("error"):
                problems.append(f"rank {rank}: {rec['error']}")
            for op in rec.get("failures") or []:
                problems.append(_fmt_failure(rank, op))
        missing = sorted(set(range(call.world)) - set(ranks))
        # The first check of a group carries the launch (interpreter, torch
        # import, rendezvous); a check sharing the group adds only its own time.
        secs = launched.seconds if n == 0 else max(
            [float(r.get("seconds") or 0) for r in ranks.values()] or [0.0])
        any_rec = next(iter(ranks.values()), {})
        where = f"{any_rec.get('backend', '?')}/{any_rec.get('device', '?')}" if any_rec else "?"
        if not missing and not problems:
            n_ops = len(any_rec.get("ops") or [])
            skipped = sorted({o["op"] for r in ranks.values() for o in r.get("ops", []) if o.get("skipped")})
            detail = f"{call.world} ranks on {where}, {n_ops} ops exact on every rank"
            if skipped:
                detail += f" (skipped: {', '.join(skipped)})"
            out.append(StepResult(step, Verdict.OK, detail, seconds=secs))
            continue
        if missing:
            if group and group.get("outcome") == "deadline":
                problems.insert(0, f"no report from ranks {missing}: {group.get('note')}")
            elif group and group.get("note"):
                problems.insert(0, f"no report from ranks {missing}: {group['note']}")
            elif group is None:
                problems.insert(0, f"no report from ranks {missing}; "
                                   f"{_why_missing(launched, call.deadline_s + LAUNCH_MARGIN_S)}")
            else:
                problems.insert(0, f"no report from ranks {missing}")
        detail = problems[0]
        if len(problems) > 1:
            detail += f" (+{len(problems) - 1} more)"
        # Without a group line (srun, torchrun) each rank's watchdog wrote its
        # own stack to the output: keep enough of it to show every rank.
        lines = problems[1:] + stack_lines + (_tail(launched, 20 * max(call.world, 2)) if not group else [])
        out.append(StepResult(step, Verdict.FAILED, detail, lines=lines, seconds=secs))
    return out


def summary(results: Sequence[StepResult]) -> str:
    """One line for a run: counts by verdict and the first problem."""
    counts: dict[str, int] = {}
    for r in results:
        counts[r.verdict.value] = counts.get(r.verdict.value, 0) + 1
    text = ", ".join(f"{n} {v}" for v, n in counts.items())
    bad = next((r for r in results if not r.verdict.ok), None)
    if bad:
        text += f"; first: {bad.step}: {bad.detail}"
    return text


def overall(results: Sequence[StepResult], seconds: float) -> StepResult:
    """A whole witness run as one StepResult: the first step that is not ok decides the verdict.

    `envport witness` and `envport slurm submit` print and record it the same way.
    """
    bad = next((r for r in results if not r.verdict.ok), None)
    verdict = Verdict.OK if bad is None else bad.verdict
    return StepResult("witnesses", verdict, summary(results), reason=bad.reason if bad else None,
                      seconds=seconds, data={"exit_code": exit_code(results),
                                             "steps": [r.to_dict() for r in results]})

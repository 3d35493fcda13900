"""Run an env's witnesses through a launcher and turn their sentinel lines into StepResults.

Spec.witnesses says what to prove; this module plans the witness scripts to
start (one basic call for python/imports/cli, one kernel call, one dist call
per distinct world size), runs each under a deadline, and reads back only the
`ENVPORT-WITNESS {...}` lines.  A check without its sentinel line is FAILED
with the output tail: a witness that died proves nothing.

GPUs are counted two ways, nvidia-smi and the env's own torch (`gpus.py`
through the launcher), and the larger count plans the NCCL worlds: each dist
witness runs on NCCL at the largest world the GPUs allow (one rank a GPU) and
at the spec's full world on gloo/CPU; what the GPUs cannot hold is SKIPPED
with "needs N GPUs, this host has M", never FAILED and never silently shrunk.

A spec that needs a GPU on a host without one is REFUSED with reason
`no_accelerator` (exit 5) before anything starts, never passed on the CPU.
"""

from __future__ import annotations

import contextlib
import json
import math
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from envport.core.errors import ReasonError
from envport.core.verdict import NO_ACCELERATOR_REASON, StepResult, Verdict, exit_code
from envport.engines.gpu import GpuCensus
from envport.spec.model import Spec
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
    torch_gpus: Optional[int] = None  # None: ask the env's torch (gpus.py) when GPUs may be there
    fault: Optional[str] = None  # test-only, passed as ENVPORT_WITNESS_FAULT
    # Read the pinned weights through their env var: only where the launcher provides them (`envport witness`
    # and `envport up` mount or point at the weights root; a Slurm job does not stage them yet).
    weights: bool = False
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
    backend: str = ""  # dist.py: "gloo" (CPU) or "nccl" (one rank a GPU)

    def step_name(self, check: str) -> str:
        """The step a check of this call reports as; NCCL runs say so, gloo keeps the plain name."""
        on = ", nccl" if self.backend == "nccl" else ""
        if check == "collectives":
            return f"collectives (world {self.world}{on})"
        if check == "dtensor":
            return f"dtensor (mesh {'x'.join(str(m) for m in self.mesh)}{on})"
        return check


@dataclass
class WitnessPlan:
    calls: list[WitnessCall]
    skipped: list[StepResult]  # what the GPUs here cannot hold, each with "needs N GPUs, ... has M"
    nccl_gpus: int = 0  # GPUs the NCCL worlds were planned for (0: gloo only)


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


# A one-rank NCCL group proves NCCL starts and runs its kernels on this GPU; it sends nothing anywhere.
WORLD1_CAVEAT = "world 1: NCCL ran on one GPU and moved no data between GPUs"
UNCOUNTED = 1 << 20  # "as many GPUs as the worlds need": no census was taken


def nccl_gpus(spec: Spec, opts: WitnessOptions, census: Optional[GpuCensus]) -> int:
    """GPUs to plan NCCL worlds on: the census's count where GPUs are wanted or the env's torch sees them.

    Without a census (a caller that plans for an allocation it asked for) a spec
    that needs GPUs gets its full worlds on NCCL: nothing shrunk, nothing skipped.
    """
    if opts.device == "cpu":
        return 0
    if census is None:
        return UNCOUNTED if requires_gpu(spec, opts) else 0
    if census.count < 1:
        return 0
    if requires_gpu(spec, opts) or (census.torch or 0) > 0:
        return census.count
    return 0


def fit_mesh(mesh: Sequence[int], gpus: int) -> list[int]:
    """The spec's mesh where the GPUs hold it, else the largest mesh of its shape they do (1-D below 4)."""
    if math.prod(mesh) <= gpus:
        return list(mesh)
    side = math.isqrt(gpus)
    return [side, side] if len(mesh) == 2 and side >= 2 else [gpus]


def plan_witnesses(spec: Spec, opts: WitnessOptions, census: Optional[GpuCensus] = None) -> WitnessPlan:
    """The witness scripts to start for this spec, in order, and what the GPUs here cannot hold."""
    w = spec.witnesses
    gpus = nccl_gpus(spec, opts, census)
    where = census.where if census else "this host"
    calls: list[WitnessCall] = []
    skipped: list[StepResult] = []
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
    pinned = {n: wd for n, wd in sorted(spec.weight_dirs.items()) if wd.files}
    if (opts.weights or "weights" in opts.only) and _wanted("weights", opts) and pinned:
        for n, wd in pinned.items():
            basic_args += ["--weight", json.dumps({"name": n, "env": wd.env, "path": wd.path,
                                                   "files": [f.model_dump() for f in wd.files]}, sort_keys=True)]
        basic_checks.append("weights")
    if basic_checks:
        calls.append(WitnessCall("basic.py", basic_args, basic_checks,
                                 opts.check_timeout_s * (1 + len(w.imports) + len(w.cli)), "basic"))
    if _wanted("kernel", opts) and (w.kernel or "kernel" in opts.only):
        device = "cuda" if gpus else ("cpu" if opts.device == "cpu" or census is not None else opts.device)
        calls.append(WitnessCall("kernel.py", ["--device", device], ["kernel"], opts.deadline_s, "kernel"))
    # (backend, world) -> (checks, mesh): one group per world, so checks sharing it share the ranks' start-up.
    groups: dict[tuple[str, int], tuple[list[str], list[int]]] = {}

    def add(backend: str, world: int, check: str, mesh: Optional[list[int]] = None) -> None:
        checks, group_mesh = groups.setdefault((backend, world), ([], []))
        checks.append(check)
        if mesh:
            group_mesh[:] = mesh

    def step_call(backend: str, world: int, mesh: Optional[list[int]] = None) -> WitnessCall:
        return WitnessCall("dist.py", [], [], 0, "", world=world, mesh=list(mesh or []), backend=backend)

    def skip(check: str, world: int, mesh: Optional[list[int]], nccl: WitnessCall, gloo: WitnessCall) -> None:
        # The plan says what will run in its place; with_outcomes() puts in how each run ended.
        ran = [nccl.step_name(check), gloo.step_name(check)]
        skipped.append(StepResult(step_call("nccl", world, mesh).step_name(check), Verdict.SKIPPED,
                                  f"needs {world} GPUs, {where} has {gpus}; instead: {' and '.join(ran)}",
                                  data={"instead": ran}))

    if _wanted("collectives", opts) and (w.collectives or "collectives" in opts.only or opts.world_size):
        world = opts.world_size or (w.collectives.world_size if w.collectives else 2)
        add("gloo", world, "collectives")
        if gpus:
            add("nccl", min(world, gpus), "collectives")
            if world > gpus:
                skip("collectives", world, None, step_call("nccl", gpus), step_call("gloo", world))
    if _wanted("dtensor", opts) and w.dtensor:
        mesh = list(w.dtensor.mesh)
        add("gloo", math.prod(mesh), "dtensor", mesh)
        if gpus:
            fitted = fit_mesh(mesh, gpus)
            add("nccl", math.prod(fitted), "dtensor", fitted)
            if fitted != mesh:
                skip("dtensor", math.prod(mesh), mesh, step_call("nccl", math.prod(fitted), fitted),
                     step_call("gloo", math.prod(mesh), mesh))
    # gloo first (the spec's own worlds), then NCCL; stable within each.
    for (backend, world), (checks, mesh) in sorted(groups.items(), key=lambda kv: kv[0][0] == "nccl"):
        args = ["--checks", ",".join(checks), "--world-size", str(world),
                "--device", "cuda" if backend == "nccl" else "cpu", "--deadline", str(opts.deadline_s)]
        if "dtensor" in checks:
            args += ["--mesh", ",".join(str(m) for m in mesh)]
        label = f"dist world {world}" + (" nccl" if backend == "nccl" else "")
        calls.append(WitnessCall("dist.py", args, checks, opts.deadline_s, label, world=world,
                                 mesh=list(mesh) if "dtensor" in checks else [], backend=backend))
    return WitnessPlan(calls, skipped, gpus)


def plan(spec: Spec, opts: WitnessOptions, census: Optional[GpuCensus] = None) -> list[WitnessCall]:
    """The witness scripts to start for this spec, in order (see plan_witnesses)."""
    return plan_witnesses(spec, opts, census).calls


def host_gpu_count() -> int:
    """GPUs nvidia-smi lists here (0 where it is absent or answers oddly)."""
    from envport.engines.gpu import gpu_count

    return gpu_count() or 0


def _torch_gpus(launcher, env: dict, opts: WitnessOptions) -> tuple[Optional[int], list[str]]:
    """(GPUs the env's torch sees, torch's own words when it sees none); (None, why) where it did not answer."""
    launched = launcher.run("gpus.py", [], env, opts.check_timeout_s + LAUNCH_MARGIN_S, None)
    rec = next((r for r in parse_sentinels(launched.output) if r["check"] == "gpus"), None)
    if rec is None:
        return None, [f"the env's torch did not answer: {_why_missing(launched, opts.check_timeout_s)}"]
    if not rec.get("ok"):
        return None, [f"the env's torch: {rec.get('error')}"]
    return int(rec.get("count") or 0), [str(x) for x in rec.get("warnings") or []]


def gpu_census(spec: Spec, opts: WitnessOptions, launcher, env: dict) -> tuple[Optional[GpuCensus], list[str]]:
    """Count the GPUs (nvidia-smi, then the env's torch where GPUs may be there); None for --device cpu."""
    if opts.device == "cpu":
        return None, []
    from envport.engines.gpu import gpu_count

    smi = opts.host_gpus if opts.host_gpus is not None else gpu_count()
    torch_n, words = opts.torch_gpus, []
    if torch_n is None and (requires_gpu(spec, opts) or (smi or 0) > 0):
        torch_n, words = _torch_gpus(launcher, env, opts)
    return GpuCensus(smi, torch_n), words


def _census_result(census: GpuCensus, words: list[str]) -> StepResult:
    smi = "absent" if census.smi is None else str(census.smi)
    torch_n = "did not answer" if census.torch is None else str(census.torch)
    lines = [f"note: {census.note}"] if census.note else []
    lines += [f"torch: {w}" for w in words]
    return StepResult("gpus", Verdict.OK, f"{census.count} GPU(s) on {census.where} (nvidia-smi: {smi}; "
                      f"the env's torch: {torch_n})", lines=lines, data={"census": census.to_dict()})


def run_witnesses(spec: Spec, launcher, opts: Optional[WitnessOptions] = None) -> list[StepResult]:
    """Run every planned witness through `launcher`; one StepResult per check item."""
    opts = opts or WitnessOptions()
    results: list[StepResult] = []

    def add(items: list[StepResult]) -> None:
        for r in items:
            results.append(r)
            if opts.on_step:
                opts.on_step(r)

    problem = launcher.preflight()
    if problem is not None:
        add([problem])
        return results
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(launcher.session())
        except ReasonError as exc:
            add([StepResult("launcher", Verdict.FAILED, exc.message, reason=exc.reason)])
            return results
        _run_planned(spec, launcher, opts, add)
    return results


def _run_planned(spec: Spec, launcher, opts: WitnessOptions, add: Callable[[list[StepResult]], None]) -> None:
    """The census, then every planned call, each call's results handed to `add` as they are known."""
    env = {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"}
    if opts.fault:
        env[FAULT_ENV] = opts.fault
    census, words = gpu_census(spec, opts, launcher, env)
    if requires_gpu(spec, opts) and (census is None or census.count < 1):
        why = (f"spec asks for {spec.resources.gpus} GPU(s)" if spec.resources.gpus
               else "--device cuda was asked for")
        smi = "no nvidia-smi" if census is None or census.smi is None else f"nvidia-smi lists {census.smi}"
        seen = ("the env's torch did not answer" if census is None or census.torch is None
                else f"the env's torch sees {census.torch}")
        add([StepResult("accelerator", Verdict.REFUSED, f"{why}; this host has none ({smi}, {seen})",
                        reason=NO_ACCELERATOR_REASON,
                        lines=[f"torch: {w}" for w in words]
                        + ["fix: run on a GPU node; `envport doctor` shows the Slurm route"])])
        return
    if census is not None and (census.count > 0 or census.note):
        add([_census_result(census, words)])
    planned = plan_witnesses(spec, opts, census)
    ran: dict[str, StepResult] = {}
    if not planned.calls:
        add([StepResult("witness", Verdict.SKIPPED, "the spec declares no witnesses (or --only left none)")])
        return
    for call in planned.calls:
        if opts.on_start:
            opts.on_start(call)
        args = list(call.args)
        if call.script == "dist.py":
            args += ["--launch", "spawn" if launcher.spawns_ranks else "external"]
        launched = launcher.run(call.script, args, env, call.deadline_s + LAUNCH_MARGIN_S, opts.on_line)
        got = call_results(spec, call, launched)
        ran.update((r.step, r) for r in got)
        add(got)
    add(with_outcomes(planned.skipped, ran))


def with_outcomes(skipped: Sequence[StepResult], ran: dict[str, StepResult]) -> list[StepResult]:
    """The SKIPPED lines with how the runs in their place really ended ("... FAILED"), not what was planned."""
    out = []
    for r in skipped:
        instead = r.data.get("instead") or []
        if not instead or not all(step in ran for step in instead):
            out.append(r)
            continue
        head = r.detail.split("; instead: ")[0]
        ends = " and ".join(f"{step} {ran[step].verdict.value}" for step in instead)
        out.append(StepResult(r.step, r.verdict, f"{head}; instead: {ends}", reason=r.reason, lines=r.lines,
                              data=r.data))
    return out


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
    if "weights" in call.checks:
        wanted += [("weight", n, f"weight {n}") for n, w in sorted(spec.weight_dirs.items()) if w.files]
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
        elif check == "weight":
            where = f"${rec.get('env')}={rec.get('folder')}" if rec.get("env") else str(rec.get("folder"))
            if rec["ok"]:
                ro = "read-only" if rec.get("read_only") else \
                    f"writable: {rec.get('writable_why') or 'the launcher mounted it nowhere read-only'}"
                out.append(StepResult(step, Verdict.OK, f"{rec.get('files')} file(s) at their pins via {where} "
                                      f"({ro})", seconds=secs, data={"read_only": bool(rec.get("read_only"))}))
            else:
                probs = list(rec.get("problems") or [])
                out.append(StepResult(step, Verdict.FAILED, probs[0] if probs else "weight check failed",
                                      lines=probs[1:] + [f"fix: envport weights verify {spec.name}, then "
                                                         f"envport weights fetch {spec.name}"], seconds=secs))
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
        from envport.core.arch import gpu_runnable, parse_capability, sm_name

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
        from envport.core.arch import no_kernel_image_hint

        hint = no_kernel_image_hint(rec.get("error"), rec.get("capability"), rec.get("arch_list"))
        if hint:
            lines.append(f"fix: {hint}")
    return [StepResult("kernel", Verdict.OK if ok else Verdict.FAILED, detail, lines=lines, seconds=secs)]


def _fmt_failure(rank: int, op: dict) -> str:
    if "expected_shape" in op:
        return (f"rank {rank} {op['op']} ({op.get('api')}): expected shape {op['expected_shape']}, "
                f"got {op['got_shape']}")
    return f"rank {rank} {op['op']} ({op.get('api')}): expected {op.get('expected')}, got {op.get('got')}"


def _rank_problems(ranks: dict[int, dict]) -> tuple[list[str], list[str]]:
    """(one line per distinct error or wrong value, naming its ranks; the fixes and arch hints they carry)."""
    from envport.core.arch import no_kernel_image_hint

    by_error: dict[str, list[int]] = {}
    problems: list[str] = []
    fixes: list[str] = []
    for rank, rec in sorted(ranks.items()):
        if rec.get("error"):
            by_error.setdefault(rec["error"], []).append(rank)
            for extra in (rec.get("fix"), no_kernel_image_hint(rec["error"], rec.get("capability"),
                                                                rec.get("arch_list"))):
                if extra:
                    extra = extra if extra.startswith("fix: ") else f"fix: {extra}"
                    if extra not in fixes:
                        fixes.append(extra)
        for op in rec.get("failures") or []:
            problems.append(_fmt_failure(rank, op))
    errors = [f"{'rank' if len(rs) == 1 else 'ranks'} {', '.join(map(str, rs))}: {err}"
              for err, rs in sorted(by_error.items(), key=lambda kv: kv[1])]
    return errors + problems, fixes


def _placement(ranks: dict) -> list[tuple[tuple, list[int]]]:
    """[((node rank, node), [ranks]), ...] by node rank, where the ranks said which node they ran on (Slurm tasks:
    SLURMD_NODENAME, NODE_RANK); [] otherwise."""
    placed: dict = {}
    for r, rec in sorted(ranks.items()):
        if rec.get("node") is not None or rec.get("node_rank") is not None:
            placed.setdefault((rec.get("node_rank"), rec.get("node") or "?"), []).append(r)
    return sorted(placed.items(), key=lambda kv: (str(kv[0][0]), kv[0][1]))


def _dist_results(call: WitnessCall, records: list[dict], launched) -> list[StepResult]:
    group = next((r for r in records if r["check"] == "group"), None)
    stack_lines: list[str] = []
    if group and group.get("stacks"):
        for rank, text in sorted(group["stacks"].items(), key=lambda kv: int(kv[0])):
            stack_lines.append(f"rank {rank} stack:")
            stack_lines += [f"  {ln}" for ln in text.splitlines() if ln.strip()]
    out: list[StepResult] = []
    for n, check in enumerate(call.checks):
        step = call.step_name(check)
        ranks = {r["rank"]: r for r in records if r["check"] == check and "rank" in r}
        problems, fixes = _rank_problems(ranks)
        missing = sorted(set(range(call.world)) - set(ranks))
        # The first check of a group carries the launch (interpreter, torch
        # import, rendezvous); a check sharing the group adds only its own time.
        secs = launched.seconds if n == 0 else max(
            [float(r.get("seconds") or 0) for r in ranks.values()] or [0.0])
        any_rec = next(iter(ranks.values()), {})
        where = f"{any_rec.get('backend', '?')}/{any_rec.get('device', '?')}" if any_rec else "?"
        if not missing and not problems:
            # Only ops that ran count as exact; a skipped op is named apart.
            n_ops = len([o for o in any_rec.get("ops") or [] if not o.get("skipped")])
            skipped = sorted({o["op"] for r in ranks.values() for o in r.get("ops", []) if o.get("skipped")})
            detail = f"{call.world} ranks on {where}, {n_ops} ops exact on every rank"
            if skipped:
                detail += f" (skipped: {', '.join(skipped)})"
            if call.backend == "nccl" and call.world == 1:
                detail += f" ({WORLD1_CAVEAT})"
            placed = _placement(ranks)
            if placed:
                detail += "; " + ", ".join(f"{node} (node rank {nr}): ranks {','.join(map(str, rs))}"
                                           for (nr, node), rs in placed)
            data = {"ranks": {str(r): {"node": rec.get("node"), "node_rank": rec.get("node_rank"),
                                       "local_rank": rec.get("local_rank")} for r, rec in sorted(ranks.items())}} \
                if placed else {}
            out.append(StepResult(step, Verdict.OK, detail, seconds=secs, data=data))
            continue
        if group and group.get("error"):
            # The group refused before any rank started ("world size 2 needs 2 GPUs, torch sees 1").
            problems.insert(0, group["error"])
        elif missing:
            if group and group.get("note"):
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
        lines = problems[1:] + fixes + stack_lines + (_tail(launched, 20 * max(call.world, 2)) if not group else [])
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

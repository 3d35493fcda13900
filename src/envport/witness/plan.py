"""Which witness scripts to start for a spec, and what the GPUs counted here cannot hold.

One basic call for python/imports/cli/weights, one kernel call, one dist call
per distinct (backend, world): each dist witness runs on NCCL at the largest
world the GPUs allow (one rank a GPU) and at the spec's full world on gloo/CPU;
what the GPUs cannot hold is SKIPPED with "needs N GPUs, this host has M",
never FAILED and never silently shrunk.  Pure: no launcher, no subprocess.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from envport.core.verdict import StepResult, Verdict
from envport.engines.gpu import GpuCensus
from envport.spec.model import Spec

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
    # The docs level (witness/doc_sources.Doc, read by the caller: plan reads no files). None: this caller does
    # not read docs, so a spec's `witnesses.docs` is not checked here (`envport witness` and `up` read them).
    docs: Optional[list] = None
    exclude: Sequence[str] = ()  # checks left out (`up` runs the docs level as its own last step)


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
    docs: Any = None  # docs.py: the doc_check.DocJobs its records are judged against

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
    # What the GPUs here cannot hold ("needs N GPUs, ... has M") and each --only check the spec asks for no
    # witness of ("the spec asks for no kernel witness").
    skipped: list[StepResult]
    nccl_gpus: int = 0  # GPUs the NCCL worlds were planned for (0: gloo only)



def requires_gpu(spec: Spec, opts: WitnessOptions) -> bool:
    return spec.resources.gpus > 0 or opts.device == "cuda"


def _wanted(check: str, opts: WitnessOptions) -> bool:
    return (not opts.only or check in opts.only) and check not in opts.exclude


def declared(spec: Spec, check: str, opts: WitnessOptions) -> bool:
    """Whether the spec asks for this check (--world-size asks for collectives at that world)."""
    w = spec.witnesses
    return {"python": True, "imports": bool(w.imports), "cli": bool(w.cli),
            "weights": any(wd.files for wd in spec.weight_dirs.values()), "kernel": bool(w.kernel),
            "collectives": bool(w.collectives or opts.world_size), "dtensor": bool(w.dtensor),
            "docs": bool(w.docs or opts.docs)}[check]


def not_asked(spec: Spec, opts: WitnessOptions) -> list[StepResult]:
    """An --only check the spec has no witness for is SKIPPED, saying so: running kernel.py anyway on an env
    without torch printed `FAILED kernel ModuleNotFoundError: torch` for a check nobody declared."""
    return [StepResult(c, Verdict.SKIPPED, f"the spec asks for no {c} witness")
            for c in dict.fromkeys(opts.only) if not declared(spec, c, opts)]


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
    gpus = nccl_gpus(spec, opts, census)
    groups = _DistGroups(gpus, census.where if census else "this host")
    _plan_collectives(spec, opts, groups)
    _plan_dtensor(spec, opts, groups)
    calls = [c for c in (_basic_call(spec, opts), _kernel_call(spec, opts, gpus, census)) if c is not None]
    docs_call, docs_rows = _docs_call(spec, opts)
    # The docs level last (seed 004): following the doc proves most, and needs the rest to stand first.
    calls += groups.calls(opts) + ([docs_call] if docs_call else [])
    return WitnessPlan(calls, not_asked(spec, opts) + groups.skipped + docs_rows, gpus)


def _basic_call(spec: Spec, opts: WitnessOptions) -> Optional[WitnessCall]:
    """One basic.py call for python, imports, CLI checks and pinned weights (None: none of them wanted)."""
    w = spec.witnesses
    args: list[str] = ["--timeout", str(opts.check_timeout_s)]
    checks = []
    if _wanted("python", opts):
        args += ["--python", spec.python]
        checks.append("python")
    if _wanted("imports", opts) and w.imports:
        for mod in w.imports:
            args += ["--import", mod]
        checks.append("imports")
    if _wanted("cli", opts) and w.cli:
        for c in w.cli:
            args += ["--cli", json.dumps({"cmd": c.cmd, "expect": c.expect})]
        checks.append("cli")
    pinned = {n: wd for n, wd in sorted(spec.weight_dirs.items()) if wd.files}
    if (opts.weights or "weights" in opts.only) and _wanted("weights", opts) and pinned:
        for n, wd in pinned.items():
            args += ["--weight", json.dumps({"name": n, "env": wd.env, "path": wd.path,
                                             "files": [f.model_dump() for f in wd.files]}, sort_keys=True)]
        checks.append("weights")
    if not checks:
        return None
    return WitnessCall("basic.py", args, checks, opts.check_timeout_s * (1 + len(w.imports) + len(w.cli)), "basic")


def _kernel_call(spec: Spec, opts: WitnessOptions, gpus: int, census: Optional[GpuCensus]) -> Optional[WitnessCall]:
    if not (_wanted("kernel", opts) and spec.witnesses.kernel):
        return None
    device = "cuda" if gpus else ("cpu" if opts.device == "cpu" or census is not None else opts.device)
    # `kernel: true` names none: the script runs every framework the env holds (the plan reads no env).
    named = [a for f in spec.witnesses.kernel_frameworks() or [] for a in ("--framework", f)]
    # The deadline bounds Triton's compile child inside the call's own (an abort or a hang there is its row).
    return WitnessCall("kernel.py", ["--device", device, "--deadline", str(opts.deadline_s)] + named, ["kernel"],
                       opts.deadline_s, "kernel")


def _docs_call(spec: Spec, opts: WitnessOptions) -> tuple[Optional[WitnessCall], list[StepResult]]:
    """One docs.py call for every doc to run, and the rows of those not run (unreadable, unchanged since a pass)."""
    from envport.witness.doc_check import not_run, plan_jobs

    if not (_wanted("docs", opts) and opts.docs):
        return None, []
    rows = [r for r in (not_run(d) for d in opts.docs) if r is not None]
    fresh = [d for d in opts.docs if not_run(d) is None]
    if not fresh:
        return None, rows
    jobs = plan_jobs(fresh)
    deadline = opts.check_timeout_s * (1 + len(jobs.jobs))
    return WitnessCall("docs.py", jobs.args(opts.check_timeout_s), ["docs"], deadline, "docs", docs=jobs), rows


def _dist_call(backend: str, world: int, mesh: Optional[list[int]] = None) -> WitnessCall:
    """A dist.py call as far as its step names go (the args come with DistGroups.calls)."""
    return WitnessCall("dist.py", [], [], 0, "", world=world, mesh=list(mesh or []), backend=backend)


class _DistGroups:
    """(backend, world) -> (checks, mesh): one dist.py group per world, so checks sharing it share the
    ranks' start-up; and the SKIPPED steps for what the GPUs cannot hold."""

    def __init__(self, gpus: int, where: str):
        self.gpus, self.where = gpus, where
        self.groups: dict[tuple[str, int], tuple[list[str], list[int]]] = {}
        self.skipped: list[StepResult] = []

    def add(self, backend: str, world: int, check: str, mesh: Optional[list[int]] = None) -> None:
        checks, group_mesh = self.groups.setdefault((backend, world), ([], []))
        checks.append(check)
        if mesh:
            group_mesh[:] = mesh

    def skip(self, check: str, world: int, mesh: Optional[list[int]], nccl: WitnessCall, gloo: WitnessCall) -> None:
        # The plan says what will run in its place; with_outcomes() puts in how each run ended.
        ran = [nccl.step_name(check), gloo.step_name(check)]
        self.skipped.append(StepResult(_dist_call("nccl", world, mesh).step_name(check), Verdict.SKIPPED,
                                       f"needs {world} GPUs, {self.where} has {self.gpus}; instead: "
                                       f"{' and '.join(ran)}", data={"instead": ran}))

    def calls(self, opts: WitnessOptions) -> list[WitnessCall]:
        """gloo first (the spec's own worlds), then NCCL; stable within each."""
        out = []
        for (backend, world), (checks, mesh) in sorted(self.groups.items(), key=lambda kv: kv[0][0] == "nccl"):
            args = ["--checks", ",".join(checks), "--world-size", str(world),
                    "--device", "cuda" if backend == "nccl" else "cpu", "--deadline", str(opts.deadline_s)]
            if "dtensor" in checks:
                args += ["--mesh", ",".join(str(m) for m in mesh)]
            label = f"dist world {world}" + (" nccl" if backend == "nccl" else "")
            out.append(WitnessCall("dist.py", args, checks, opts.deadline_s, label, world=world,
                                   mesh=list(mesh) if "dtensor" in checks else [], backend=backend))
        return out


def _plan_collectives(spec: Spec, opts: WitnessOptions, groups: _DistGroups) -> None:
    w, gpus = spec.witnesses, groups.gpus
    if not (_wanted("collectives", opts) and declared(spec, "collectives", opts)):
        return
    world = opts.world_size or (w.collectives.world_size if w.collectives else 2)
    groups.add("gloo", world, "collectives")
    if gpus:
        groups.add("nccl", min(world, gpus), "collectives")
        if world > gpus:
            groups.skip("collectives", world, None, _dist_call("nccl", gpus), _dist_call("gloo", world))


def _plan_dtensor(spec: Spec, opts: WitnessOptions, groups: _DistGroups) -> None:
    w, gpus = spec.witnesses, groups.gpus
    if not (_wanted("dtensor", opts) and w.dtensor):
        return
    mesh = list(w.dtensor.mesh)
    groups.add("gloo", math.prod(mesh), "dtensor", mesh)
    if gpus:
        fitted = fit_mesh(mesh, gpus)
        groups.add("nccl", math.prod(fitted), "dtensor", fitted)
        if fitted != mesh:
            groups.skip("dtensor", math.prod(mesh), mesh, _dist_call("nccl", math.prod(fitted), fitted),
                        _dist_call("gloo", math.prod(mesh), mesh))


def plan(spec: Spec, opts: WitnessOptions, census: Optional[GpuCensus] = None) -> list[WitnessCall]:
    """The witness scripts to start for this spec, in order (see plan_witnesses)."""
    return plan_witnesses(spec, opts, census).calls

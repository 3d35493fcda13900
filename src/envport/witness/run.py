"""Run an env's witnesses through a launcher: the census, then each planned call, each judged as it ends.

witness/plan says which scripts to start, witness/census counts the GPUs,
witness/judge turns each call's sentinel lines into StepResults; this module
only drives the launcher.  A spec that needs a GPU on a host without one is
REFUSED with reason `no_accelerator` (exit 5) before anything starts, never
passed on the CPU.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Optional

from envport.core.errors import ReasonError
from envport.core.verdict import NO_ACCELERATOR_REASON, StepResult, Verdict
from envport.spec.model import Spec
from envport.witness.census import census_result, gpu_census
from envport.witness.judge import call_results, with_outcomes
from envport.witness.plan import LAUNCH_MARGIN_S, WitnessOptions, plan_witnesses, requires_gpu
from envport.witness.scripts.envport_sentinel import FAULT_ENV


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
                        lines=words + ["fix: run on a GPU node; `envport doctor` shows the Slurm route"])])
        return
    if census is not None and (census.count > 0 or census.note):
        add([census_result(census, words)])
    planned = plan_witnesses(spec, opts, census)
    ran: dict[str, StepResult] = {}
    if not planned.calls:
        add(planned.skipped or [StepResult("witness", Verdict.SKIPPED,
                                           "the spec declares no witnesses (or --only left none)")])
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

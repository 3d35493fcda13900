"""`envport up` as typed steps: preflight -> build -> weights -> verify -> witness over one target (seed 002).

The witness step ends with the docs level (seed 004's third: the env's own docs run verbatim inside it),
so `up` calls an env ready only once its docs hold; a doc that passed on this very env is not re-run.

Each step is a StepResult; the run stops at the first that is not ok and a
re-run continues from there (every step checks before it acts). A FAILED
step's log tail is matched against the diagnosis table so its verdict names
the layer and the fix. What the run records goes through `Up.record`, the
ledger writer the command hands in: commands/ stays the layer that writes it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from envport.core.progress import Progress, quiet
from envport.core.verdict import StepResult, Verdict
from envport.targets.base import VERIFY, WITNESS, BuildRequest, Target, VerifyRequest, launcher_for

STEPS = ("preflight", "build", "weights", "verify", "witness")


@dataclass(frozen=True)
class Up:
    """One `envport up`: the env, where it goes, and what the lock gate already decided."""

    loaded: Any  # spec.loader.Loaded
    site: Any  # plan.site.Site, after the lock gate
    root: Path
    identity: Any  # recipe.identity.Identity
    target: Target
    weights_root: Path
    record: Callable[..., None]  # ledger.record(root, spec, kind=..., target=..., hash_=..., result=..., **facts)
    host: Optional[str] = None
    site_name: Optional[str] = None
    remember: bool = False  # the build is the env a plain `envport build NAME` means
    lock_refused: Optional[StepResult] = None
    lock_fact: str = "none"
    min_free_gb: Optional[float] = None
    deadline_s: float = 300.0
    rerun_docs: bool = False  # run the docs level even where this env and doc passed before
    progress: Progress = quiet
    # --attest: (sif, launcher=, steps=, verdict=, started=) -> the StepResult of writing that run's signed
    # statement into the SIF (commands/attest.py witness_attest_step with the key and env bound in)
    attest: Optional[Callable[..., StepResult]] = None

    def recorded(self, kind: str, result: StepResult, **facts) -> None:
        self.record(self.root, self.loaded.spec, kind=kind, target=self.target.name, hash_=self.identity.hash,
                    result=result, **facts)


def run_up(up: Up) -> list[StepResult]:
    """Every step's result, in STEPS order; the steps after the first that is not ok are SKIPPED, saying why."""
    from envport.report.diagnosis import first

    runners = {"preflight": preflight, "build": build, "weights": weights, "verify": verify, "witness": witness}
    results: list[StepResult] = []
    for name in STEPS:
        stop = next((r for r in results if not r.verdict.ok), None)
        if stop is not None:
            results.append(StepResult(name, Verdict.SKIPPED, f"not run: {stop.step} is {stop.verdict.value}; "
                                      "fix it and re-run `envport up`"))
            continue
        up.progress(f"envport: [up] {name}")
        t0 = time.monotonic()
        r = runners[name](up)
        r.seconds = time.monotonic() - t0
        if r.verdict is Verdict.FAILED:
            d = first([r.detail, *r.lines])
            if d is not None:
                r.data["diagnosis"] = d.to_dict()
                r.lines = r.lines + d.lines()
                if d.row.host:
                    # A property of this machine, not of the env: the next user of the env should see it.
                    up.recorded("gotcha", r, symptom=d.line.strip()[:300], diagnosis=d.row.id, layer=d.row.layer,
                                fix=d.row.fix)
        results.append(r)
    return results


def as_step(name, inner, detail=None) -> StepResult:
    """`inner` (a builder's/verifier's StepResult) as the up step `name`, keeping its verdict, reason and tail."""
    return StepResult(name, inner.verdict, detail if detail is not None else inner.detail, reason=inner.reason or "",
                      lines=list(inner.lines), seconds=inner.seconds, data=dict(inner.data))


def preflight(up: Up) -> StepResult:
    from envport.builders.preflight import DEFAULT_MARGIN_GB
    from envport.builders.preflight import preflight as run_preflight
    from envport.core.extras import VERIFY_MODULES, refusal
    from envport.report import ledger
    from envport.targets.needs import context_for

    # Refused before the build, not as a traceback from the verify step once the env is built.
    missing = refusal("preflight", VERIFY_MODULES)
    if missing is not None:
        return missing
    spec = up.loaded.spec
    size = None
    try:
        for rec in reversed(ledger.read(up.root, spec.name)):
            if rec.get("kind") == "build" and rec.get("target") == up.target.name and rec.get("size"):
                size = int(rec["size"])
                break
    except (OSError, ValueError):
        pass
    margin = DEFAULT_MARGIN_GB if up.min_free_gb is None else up.min_free_gb
    return as_step("preflight", run_preflight(context_for(up.target, spec, up.root, up.host,
                                                          weights_root=up.weights_root, env_bytes=size,
                                                          margin_gb=margin)))


def build(up: Up) -> StepResult:
    """flow/build.py's one build step, as `envport build` runs it: the same facts recorded for the same build."""
    from envport.flow.build import run_build

    # The lock gate ran before the identity was resolved (commands/_common.lock_gate), as in `envport build`.
    req = BuildRequest(up.loaded, up.site, up.root, up.identity, site_name=up.site_name, host=up.host,
                       remember=up.remember, progress=up.progress)
    built = run_build(up.target, req, lock_refused=up.lock_refused, lock_fact=up.lock_fact)
    built.record(up.record)
    if built.interrupted is not None:
        raise built.interrupted  # recorded as stopped; the CLI exits 130, naming the signal
    bad = next((r for r in built.results if not r.verdict.ok), built.last)
    return as_step("build", bad, f"{bad.step}: {bad.detail}")


def weights(up: Up) -> StepResult:
    from envport.builders import weights as weights_mod

    interp = up.target.weights_interpreter(up.loaded.spec.name, up.host)
    r = weights_mod.fetch(up.loaded, up.weights_root, interpreter_bin=interp, progress=up.progress)
    if r.verdict.ok and r.verdict is not Verdict.SKIPPED and up.host:
        from envport.engines.ssh import resolve_host

        staged = weights_mod.stage(up.loaded, up.weights_root, resolve_host(up.site, up.host), progress=up.progress)
        if not staged.verdict.ok:
            return as_step("weights", staged)
        return as_step("weights", r, f"{r.detail}; {staged.detail.replace('the host', up.host)}")
    return as_step("weights", r)


def verify(up: Up) -> StepResult:
    from envport.sif.provenance.witness import VERIFY_LAUNCHER, utc_now

    if not up.target.supports(VERIFY):
        return up.target.refuse(VERIFY).result("verify", Verdict.SKIPPED)
    started = utc_now()
    r = up.target.verify(VerifyRequest(up.loaded, up.site, up.root, host=up.host, progress=up.progress))
    up.recorded("verify", r)
    sif = str(up.target.built_file(up.site, up.root, up.identity)) if up.attest else ""
    return attested(up, as_step("verify", r), sif, VERIFY_LAUNCHER, [r], started)


def witness(up: Up) -> StepResult:
    from envport.sif.provenance.witness import utc_now
    from envport.witness.judge import overall
    from envport.witness.plan import WitnessOptions
    from envport.witness.run import run_witnesses

    if not up.target.supports(WITNESS):
        # up goes on past a step the target cannot do (the env is still proved by verify): skipped, with why.
        return up.target.refuse(WITNESS).result("witness", Verdict.SKIPPED)
    from envport.flow.docs_level import docs_to_check

    opts = WitnessOptions(deadline_s=up.deadline_s, weights=True)
    opts.docs = docs_to_check(up.loaded, up.root, target=up.target.name, hash_=up.identity.hash,
                              rerun=up.rerun_docs, ssh_host=up.host, ledger_dir=getattr(up.site, "ledger_dir", None))
    launcher, facts = launcher_for(up.target, up.loaded, up.site, up.identity, opts, host=up.host)
    opts.on_step = lambda r: up.progress(f"envport: [witness] {r.line()}")
    t0, started = time.monotonic(), utc_now()
    steps = run_witnesses(up.loaded.spec, launcher, opts)
    result = overall(steps, time.monotonic() - t0)
    up.recorded("witness", result, launcher=launcher.describe(), sm_range=up.loaded.spec.sm_range, **facts)
    r = as_step("witness", result)
    # The failing checks' own tails: what the diagnosis table reads.
    r.lines = [ln for s in steps if not s.verdict.ok for ln in [f"{s.step}: {s.detail}", *s.lines]]
    weight_steps = [s for s in steps if s.step.startswith("weight ")]
    r.data = {"witness_checks": len(steps), "docs": [s.to_dict() for s in steps if s.step.startswith("docs ")],
              "weights": [{"step": s.step, "detail": s.detail, **s.data} for s in weight_steps],
              "launcher": launcher.describe()}
    return attested(up, r, facts.get("sif", ""), launcher.describe(), steps, started)


def attested(up: Up, r: StepResult, sif: str, launcher: str, steps: list, started) -> StepResult:
    """R; with --attest, the signed statement of its run (failed checks included, as `witness --attest`
    writes) added to SIF and said in R's detail and data. A statement that could not be written makes an ok
    step not ok: `up --attest` promised one, and an admin's `require_witnessed` gate would refuse the SIF."""
    if up.attest is None:
        return r
    a = up.attest(sif, launcher=launcher, steps=steps, verdict=r.verdict.value, started=started)
    r.data["attested"] = a.to_dict()
    if a.verdict.ok:
        r.detail = f"{r.detail}; attested: {a.detail}"
    elif r.verdict.ok:
        r.verdict, r.reason = a.verdict, a.reason
        r.detail = f"{r.detail}; its statement was not written: {a.detail}"
    else:
        r.detail = f"{r.detail}; its statement was not written either: {a.detail}"
    return r

"""`envport up NAME --target T`: preflight -> build -> weights -> verify -> witness, one command (seed 002).

Each step is a StepResult; the run stops at the first that is not ok and a
re-run continues from there (every step checks before it acts: a built env
is `present`, pinned weights are `present`). Nothing is deleted and nothing is
retried. Every FAILED step's log tail is matched against the diagnosis table
(envport.report.diagnosis) so its verdict names the layer and the fix; when
the host is the cause the symptom and fix are recorded for the env's doc.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time

from envport.commands._common import load_one, lock_gate, project_root

TARGETS = ("docker", "venv", "apptainer", "conda")
STEPS = ("preflight", "build", "weights", "verify", "witness")


def register(sub) -> None:
    p = sub.add_parser("up", help="preflight, build, weights, verify, witness: bring an env to its spec and prove it",
                       description="Bring an env to what its spec declares and prove it, in one command: preflight "
                       "(cheap local checks: free disk vs the env's size and its weights, the target's runtime, GPUs "
                       "in sm_range, a C compiler when a phase builds from source), build (present when built), "
                       "weights (every pinned file verified by size and sha256; absent ones fetched by the spec's "
                       "own source command; nothing deleted), verify (the spec's testinfra checks, weights "
                       "included) and witness (imports, CLI, weights read through their env var from a read-only "
                       "mount (venv/conda: bound with bwrap; where bwrap does not work the step says writable "
                       "and why), kernel, collectives, DTensor). Stops at the first step that is not ok; re-running "
                       "continues. A FAILED step's log is matched against the diagnosis table: its layer and fix "
                       "are printed. Exit code: the first failure's (1 failed, 3 refused, 5 no accelerator).")
    p.add_argument("spec", metavar="NAME|PATH")
    p.add_argument("--target", choices=TARGETS, required=True)
    p.add_argument("--host", default=None, help="venv/conda: the env on this SSH host (site alias or destination)")
    p.add_argument("--site", default=None, help="site profile (default: local)")
    p.add_argument("--root", dest="weights_root", default=None, metavar="DIR",
                   help="weights root (default: $ENVPORT_WEIGHTS_DIR, else ~/.envport/weights)")
    p.add_argument("--min-free-gb", type=float, default=None, metavar="GB",
                   help="preflight: free space to keep beyond the estimate (default 1)")
    p.add_argument("--deadline", type=float, default=300.0, help="witness: seconds per witness script (default 300)")
    p.add_argument("--no-lock", action="store_true",
                   help="build (and then verify and witness) with every pip phase resolved at build time even "
                   "when specs/<name>.lock fits the spec, as `envport build --no-lock` does (another env, with "
                   "another hash). Without it a lock that does not fit is REFUSED at the build step")
    p.add_argument("--json", action="store_true", help="print the steps as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from envport.builders import weights
    from envport.core.progress import stderr_progress
    from envport.core.verdict import StepResult, Verdict, exit_code
    from envport.plan.site import load_site
    from envport.recipe.identity import resolve
    from envport.report import ledger
    from envport.report.diagnosis import first

    root = project_root(args)
    loaded = load_one(args, args.spec)
    site, lock_refused, lock_fact = lock_gate(args.no_lock, loaded, load_site(args.site, root))
    identity = resolve(loaded, site, args.target).identity
    ctx = {"args": args, "root": root, "loaded": loaded, "site": site, "identity": identity,
           "lock_refused": lock_refused, "lock_fact": lock_fact,
           "weights_root": weights.weights_root(args.weights_root), "progress": stderr_progress}
    runners = {"preflight": _preflight, "build": _build, "weights": _weights, "verify": _verify, "witness": _witness}
    results: list[StepResult] = []
    start = time.monotonic()
    for name in STEPS:
        stop = next((r for r in results if not r.verdict.ok), None)
        if stop is not None:
            results.append(StepResult(name, Verdict.SKIPPED, f"not run: {stop.step} is {stop.verdict.value}; "
                                      "fix it and re-run `envport up`"))
            continue
        stderr_progress(f"envport: [up] {name}")
        t0 = time.monotonic()
        r = runners[name](ctx)
        r.seconds = time.monotonic() - t0
        if r.verdict is Verdict.FAILED:
            d = first([r.detail, *r.lines])
            if d is not None:
                r.data["diagnosis"] = d.to_dict()
                r.lines = r.lines + d.lines()
                if d.row.host:
                    # A property of this machine, not of the env: the next user of the env should see it.
                    ledger.record(root, loaded.spec, kind="gotcha", target=args.target, hash_=identity.hash,
                                  result=r, symptom=d.line.strip()[:300], diagnosis=d.row.id, layer=d.row.layer,
                                  fix=d.row.fix)
        results.append(r)
    code = exit_code(results)
    bad = next((r for r in results if not r.verdict.ok), None)
    summary = StepResult("up", bad.verdict if bad else Verdict.OK,
                         f"{bad.step}: {bad.detail}" if bad else
                         f"{identity.ref} --target {args.target}: every step ok",
                         reason=bad.reason if bad else "", seconds=time.monotonic() - start)
    ledger.record(root, loaded.spec, kind="up", target=args.target, hash_=identity.hash, result=summary,
                  steps=[_compact(r) for r in results])
    if args.json:
        json.dump({"command": "up", "exit_code": code, "env": loaded.spec.name, "hash": identity.hash,
                   "target": args.target, "steps": [r.to_dict() for r in results], "problems": []},
                  sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
        return code
    _table(results, sys.stdout)
    print(f"{summary.verdict.value} {identity.ref} --target {args.target} (exit {code}, "
          f"{summary.seconds:.1f}s)")
    return code


def _compact(r) -> dict:
    d = {"step": r.step, "verdict": r.verdict.value, "detail": r.detail, "seconds": round(r.seconds, 3)}
    if r.reason:
        d["reason"] = r.reason
    if "diagnosis" in r.data:
        d["diagnosis"] = r.data["diagnosis"]["id"]
    return d


def _table(results, out) -> None:
    for r in results:
        if r.lines:
            print(f"--- {r.step}: {r.verdict.value}", file=out)
            for ln in r.lines[-25:]:
                print(f"    | {ln}", file=out)
    print(f"{'STEP':<10} {'VERDICT':<8} {'TIME':>7}  DETAIL", file=out)
    for r in results:
        reason = f" [{r.reason}]" if r.reason else ""
        print(f"{r.step:<10} {r.verdict.value:<8} {r.seconds:6.1f}s  {r.detail}{reason}", file=out)


def _step(name, inner, detail=None):
    """`inner` (a builder's/verifier's StepResult) as the up step `name`, keeping its verdict, reason and tail."""
    from envport.core.verdict import StepResult

    return StepResult(name, inner.verdict, detail if detail is not None else inner.detail, reason=inner.reason or "",
                      lines=list(inner.lines), seconds=inner.seconds, data=dict(inner.data))


def _parsed(command, name: str, *argv: str) -> argparse.Namespace:
    """`command`'s own arguments for argv: every option it has, at its own default (a new one included)."""
    parser = argparse.ArgumentParser(prog="envport")
    command.register(parser.add_subparsers())
    return parser.parse_args([name, *argv])


def _preflight(ctx):
    from envport.builders.preflight import DEFAULT_MARGIN_GB, Context, preflight
    from envport.core.extras import VERIFY_MODULES, refusal
    from envport.report import ledger

    # Refused before the build, not as a traceback from the verify step once the env is built.
    missing = refusal("preflight", VERIFY_MODULES)
    if missing is not None:
        return missing
    args, spec = ctx["args"], ctx["loaded"].spec
    size = None
    try:
        for rec in reversed(ledger.read(ctx["root"], spec.name)):
            if rec.get("kind") == "build" and rec.get("target") == args.target and rec.get("size"):
                size = int(rec["size"])
                break
    except (OSError, ValueError):
        pass
    margin = DEFAULT_MARGIN_GB if args.min_free_gb is None else args.min_free_gb
    return _step("preflight", preflight(Context(spec, args.target, host=args.host, weights_root=ctx["weights_root"],
                                                env_bytes=size, margin_gb=margin, project_root=ctx["root"])))


def _build(ctx):
    from envport.commands import build as build_cmd
    from envport.report import ledger

    args = ctx["args"]
    # commands/build.py's dispatcher, with build's own defaults (its parser's) for the options up does not offer.
    ns = _parsed(build_cmd, "build", args.spec, "--target", args.target,
                 *(["--host", args.host] if args.host else []), *(["--site", args.site] if args.site else []),
                 *(["--no-lock"] if args.no_lock else []))
    ns.root = str(ctx["root"])
    # The lock gate ran before the identity was resolved (commands/_common.lock_gate), as in `envport build`.
    results = [ctx["lock_refused"]] if ctx["lock_refused"] else \
        build_cmd._build(ns, ctx["loaded"], ctx["site"], ctx["root"], ctx["identity"], ctx["progress"])
    last = results[-1]
    ledger.record(ctx["root"], ctx["loaded"].spec, kind="build", target=args.target, hash_=ctx["identity"].hash,
                  result=last, seconds=sum(r.seconds for r in results), site=ctx["site"], lock=ctx["lock_fact"])
    bad = next((r for r in results if not r.verdict.ok), last)
    return _step("build", bad, f"{bad.step}: {bad.detail}")


def _weights(ctx):
    from envport.builders import weights
    from envport.commands.weights import venv_bin
    from envport.core.verdict import Verdict

    args, loaded = ctx["args"], ctx["loaded"]
    interp = venv_bin(loaded.spec.name) if args.target == "venv" and not args.host else None
    r = weights.fetch(loaded, ctx["weights_root"], interpreter_bin=interp, progress=ctx["progress"])
    if r.verdict.ok and r.verdict is not Verdict.SKIPPED and args.host:
        from envport.engines.ssh import resolve_host

        staged = weights.stage(loaded, ctx["weights_root"], resolve_host(ctx["site"], args.host),
                               progress=ctx["progress"])
        if not staged.verdict.ok:
            return _step("weights", staged)
        return _step("weights", r, f"{r.detail}; {staged.detail.replace('the host', args.host)}")
    return _step("weights", r)


def _verify(ctx):
    from envport.core.verdict import StepResult, Verdict
    from envport.report import ledger

    args, loaded, root = ctx["args"], ctx["loaded"], ctx["root"]
    if args.target in ("venv", "conda"):
        from envport.verify.backends import verify_env

        r = verify_env(loaded, ctx["site"], root, host=args.host, flavour=args.target, progress=ctx["progress"])
    elif args.target == "docker":
        from envport.verify.docker import verify

        r = verify(loaded, ctx["site"], root, progress=ctx["progress"])
    elif importlib.util.find_spec("envport.verify.sif") is not None:
        from envport.verify.sif import verify as verify_sif

        r = verify_sif(loaded, ctx["site"], root, progress=ctx["progress"])
    else:
        return StepResult("verify", Verdict.SKIPPED, f"no verify backend for --target {args.target} in this "
                          "envport yet (the witness step still runs inside the env)")
    ledger.record(root, loaded.spec, kind="verify", target=args.target, hash_=ctx["identity"].hash, result=r)
    return _step("verify", r)


def _witness(ctx):
    from envport.commands import witness as witness_cmd
    from envport.core.verdict import StepResult, Verdict
    from envport.report import ledger
    from envport.witness.judge import overall
    from envport.witness.plan import WitnessOptions
    from envport.witness.run import run_witnesses

    args, loaded = ctx["args"], ctx["loaded"]
    if args.target not in witness_cmd.TARGETS:
        return StepResult("witness", Verdict.SKIPPED, f"no witness launcher for --target {args.target} in this "
                          "envport yet")
    opts = WitnessOptions(deadline_s=args.deadline, weights=True)
    ns = _parsed(witness_cmd, "witness", args.spec, "--target", args.target,
                 *(["--host", args.host] if args.host else []), *(["--site", args.site] if args.site else []),
                 *(["--no-lock"] if args.no_lock else []))
    launcher, facts = witness_cmd._launcher(ns, loaded, ctx["identity"], opts)
    opts.on_step = lambda r: ctx["progress"](f"envport: [witness] {r.line()}")
    t0 = time.monotonic()
    steps = run_witnesses(loaded.spec, launcher, opts)
    result = overall(steps, time.monotonic() - t0)
    ledger.record(ctx["root"], loaded.spec, kind="witness", target=args.target, hash_=ctx["identity"].hash,
                  result=result, launcher=launcher.describe(), sm_range=loaded.spec.sm_range, **facts)
    r = _step("witness", result)
    # The failing checks' own tails: what the diagnosis table reads.
    r.lines = [ln for s in steps if not s.verdict.ok for ln in [f"{s.step}: {s.detail}", *s.lines]]
    weight_steps = [s for s in steps if s.step.startswith("weight ")]
    r.data = {"witness_checks": len(steps), "weights": [{"step": s.step, "detail": s.detail, **s.data} for s in weight_steps],
              "launcher": launcher.describe()}
    return r

"""`envport up NAME --target T`: parse, run flow/up.py's steps, record the summary and print it.

The steps (preflight -> build -> weights -> verify -> witness, stop at the
first that is not ok, FAILED steps diagnosed) live in envport.flow.up; this
module parses the arguments, hands it the ledger writer and prints.
"""

from __future__ import annotations

import json
import sys
import time

from envport.commands._common import load_one, lock_gate, project_root
from envport.commands.attest import add_attest_arg
from envport.targets.registry import get, hosted, names

TARGETS = names()


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
    p.add_argument("--host", default=None, help=f"{'/'.join(hosted())}: the env on this SSH host (site alias or destination)")
    p.add_argument("--site", default=None, metavar="NAME|FILE", help="site profile (default: local)")
    p.add_argument("--root", dest="weights_root", default=None, metavar="DIR",
                   help="weights root (default: $ENVPORT_WEIGHTS_DIR, else ~/.envport/weights)")
    p.add_argument("--min-free-gb", type=float, default=None, metavar="GB",
                   help="preflight: free space to keep beyond the estimate (default 1)")
    p.add_argument("--deadline", type=float, default=300.0, help="witness: seconds per witness script (default 300)")
    p.add_argument("--no-lock", action="store_true",
                   help="build (and then verify and witness) with every pip phase resolved at build time even "
                   "when specs/<name>.lock fits the spec, as `envport build --no-lock` does (another env, with "
                   "another hash). Without it a lock that does not fit is REFUSED at the build step")
    p.add_argument("--rerun-docs", action="store_true",
                   help="witness: run the docs level even where this env passed those docs' bytes before")
    add_attest_arg(p, "the verify step's and the witness step's runs (one statement each)")
    p.add_argument("--json", action="store_true", help="print the steps as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from envport.builders import weights
    from envport.core.progress import stderr_progress
    from envport.core.verdict import StepResult, Verdict, exit_code
    from envport.flow.up import Up, run_up
    from envport.plan.site import load_site
    from envport.recipe.identity import resolve
    from envport.report import ledger

    from envport.commands.attest import require_sif_target

    require_sif_target(args, "up")
    root = project_root(args)
    loaded = load_one(args, args.spec)
    site, lock_refused, lock_fact = lock_gate(args.no_lock, loaded, load_site(args.site, root))
    identity = resolve(loaded, site, args.target).identity
    up = Up(loaded, site, root, identity, get(args.target), weights.weights_root(args.weights_root), ledger.record,
            host=args.host, site_name=args.site, remember=args.spec == loaded.spec.name and not args.no_lock,
            lock_refused=lock_refused, lock_fact=lock_fact, min_free_gb=args.min_free_gb,
            deadline_s=args.deadline, rerun_docs=args.rerun_docs, progress=stderr_progress,
            attest=_attester(args, loaded.spec.name, identity.hash))
    start = time.monotonic()
    results = run_up(up)
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


def _attester(args, name: str, hash_: str):
    """--attest: a run's statement written with the key, about this env (flow/up.py `attested` calls it)."""
    if not args.attest:
        return None
    from functools import partial

    from envport.commands.attest import witness_attest_step

    return partial(witness_attest_step, key_file=args.attest, env=name, env_hash=hash_, target=args.target)


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

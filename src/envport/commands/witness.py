"""`envport witness NAME --target docker|venv`: prove a built env works, from inside it."""

from __future__ import annotations

import json
import os
import re
import sys
import time

from envport.commands._common import add_embedded_spec_arg, add_no_lock_arg
from envport.commands.attest import add_attest_arg
from envport.sif.provenance.witness import utc_now
from envport.core.verdict import StepResult
from envport.targets.base import WITNESS, launcher_for
from envport.targets.registry import get, names

# Every target: one without a witness launcher says why (REFUSED [unsupported]) rather than not being a choice.
TARGETS = names()


def register(sub) -> None:
    from envport.witness.checks import CHECKS

    p = sub.add_parser(
        "witness", help="run the spec's witnesses inside a built env (python, imports, CLI, kernel, "
        "collectives, DTensor, docs)",
        description="Run the witness scripts (stdlib + torch only, mounted or run in place, never baked "
        "into the env) inside a built env and print one verdict per check with its time; last, the docs "
        "level: each console transcript of the spec's witnesses.docs (or --docs FILE) run verbatim inside the "
        "env, its output compared and every --flag checked against the program's --help, skipped in one line "
        "where this env and doc passed before. Appends the run "
        "to this machine's ledger (`envport ledger NAME`). A spec that needs a GPU on a host without one exits 5.")
    p.add_argument("name", metavar="NAME|PATH", help="spec name (specs/<name>.yaml) or path")
    p.add_argument("--target", choices=TARGETS, required=True)
    p.add_argument("--only", action="append", default=[], metavar="CHECK",
                   help=f"run only these checks (repeat or comma-separate): {', '.join(CHECKS)}")
    p.add_argument("--world-size", type=int, default=None, help="ranks for the collectives check (DTensor keeps the spec's mesh)")
    p.add_argument("--python", default=None,
                   help="venv: the interpreter (default ~/.envport/envs/NAME/bin/python, or under "
                   "$ENVPORT_ENVS_DIR); docker: the interpreter inside the image (default python3)")
    p.add_argument("--host", default=None,
                   help="venv: run in the env on this SSH host (site alias or destination; the scripts travel "
                   "over ssh and are removed after)")
    p.add_argument("--image", default=None, help="docker: image tag (default envport/NAME:<hash12> as --site builds it)")
    p.add_argument("--sif", default=None, metavar="FILE",
                   help="apptainer: the SIF (default <sif_dir>/NAME-<hash12>.sif as --site builds it); run with "
                   "apptainer exec where installed, else ch-run on the SIF mounted with squashfuse. Outside a "
                   "project its embedded spec is used, and said so; one built from another version of "
                   "specs/NAME.yaml is named, with the changed fields")
    p.add_argument("--site", default=None, metavar="NAME|FILE", help="site profile (default: local): names the docker image and SSH hosts")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="auto: GPUs where the spec asks for them, else what the env has; cuda: require one")
    p.add_argument("--deadline", type=float, default=300.0,
                   help="seconds per witness script; a stuck group has every rank's stack dumped (default 300)")
    p.add_argument("--docs", action="append", default=[], metavar="FILE.md",
                   help="check this markdown doc's console transcripts inside the env instead of the spec's "
                   "witnesses.docs (a doc under review; repeat for several)")
    p.add_argument("--rerun-docs", action="store_true",
                   help="run the docs level even where this env and doc passed before (the ledger)")
    add_embedded_spec_arg(p, "apptainer: run the witnesses in the SIF")
    add_no_lock_arg(p, "witness")
    add_attest_arg(p, "this run")
    p.add_argument("--no-ledger", action="store_true", help="do not append this run to the ledger")
    p.add_argument("--junit", default=None, metavar="FILE",
                   help="also write the verdict rows as JUnit XML (one testcase per check and per doc)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(func=run)


def _weights_fixes_for(name: str, sif: str):
    """A result's `envport weights verify|fetch NAME` fixes with `--sif SIF` added: run with the spec a SIF
    embeds (no project), the fix must name the file, or it exits 2 "no specs/ directory" (issue 37, U6)."""
    import dataclasses
    import shlex

    def fixed(r: StepResult) -> StepResult:
        lines = [re.sub(rf"(envport weights (?:verify|fetch) {re.escape(name)})(?![\w-])",
                        lambda m: f"{m.group(1)} --sif {shlex.quote(sif)}", ln) for ln in r.lines]
        return r if lines == r.lines else dataclasses.replace(r, lines=lines)
    return fixed


def _table_row(r: StepResult) -> str:
    reason = f" [{r.reason}]" if r.reason else ""
    return f"{r.verdict.value:<8} {r.seconds:7.1f}s  {r.step:<28} {r.detail}{reason}"


def run(args) -> int:
    from envport.commands._common import sif_spec
    from envport.core.verdict import StepResult, exit_code, report
    from envport.witness.checks import check_world_size, parse_checks
    from envport.witness.judge import overall
    from envport.witness.plan import WitnessOptions
    from envport.witness.run import run_witnesses
    from envport.witness.scripts.envport_sentinel import FAULT_ENV

    only = parse_checks(args.only, "--only")
    check_world_size(args.world_size)
    from envport.commands.attest import require_sif_target

    require_sif_target(args, "witness")
    target = get(args.target)
    found = sif_spec(args, args.name, target, "witness")
    if isinstance(found, StepResult):
        return report([found], args.json, command="witness")
    loaded, site, identity, note, spec_facts = found
    spec = loaded.spec
    if not target.supports(WITNESS):
        return report([target.refuse(WITNESS).result(f"witness {spec.name}")], args.json, command="witness")
    opts = WitnessOptions(only=only, world_size=args.world_size, device=args.device,
                          deadline_s=args.deadline, fault=os.environ.get(FAULT_ENV) or None, weights=True)
    launcher, facts = launcher_for(target, loaded, site, identity, opts, host=args.host, python=args.python,
                                   image=args.image, sif=args.sif)
    differs = spec_facts["sif_difference"]
    # What ran is the SIF as built: recorded under its own hash, the spec's beside it.
    hash_ = differs["sif_hash"] if differs else identity.hash
    opts.docs = _docs(args, loaded, site, hash_)

    out = sys.stdout
    fixed = _weights_fixes_for(spec.name, args.sif) if loaded.embedded_in is not None else (lambda r: r)
    if not args.json:
        print(f"envport witness {identity.ref} --target {args.target} ({launcher.describe()})", file=out)
        if note:
            print(note, file=out)
        print(f"{'VERDICT':<8} {'TIME':>8}  {'CHECK':<28} DETAIL", file=out)
        opts.on_step = lambda r: _print_step(fixed(r), out)
        opts.on_start = lambda call: print(f"  ... {call.label}: {', '.join(call.checks)}", file=sys.stderr,
                                           flush=True)
    t0, started = time.monotonic(), utc_now()
    steps = [fixed(r) for r in run_witnesses(spec, launcher, opts)]
    result = overall(steps, time.monotonic() - t0)
    attested = None
    if args.attest:
        attested = _attest(args, facts["sif"], spec.name, hash_, launcher.describe(), steps, result, started)
        if not args.json:
            _print_step(attested, out)
        if not attested.verdict.ok:  # the run's verdict stands; a statement that was not written is said
            result.data["exit_code"] = max(result.data["exit_code"], exit_code([attested]))
    if args.junit:
        from envport.core.files import write_atomic
        from envport.report.witness_junit import junit_xml

        write_atomic(args.junit, junit_xml(spec.name, args.target, steps))
    if not args.no_ledger:
        from envport.report import ledger

        ledger.record(loaded.root, spec, kind="witness", target=args.target, hash_=hash_, result=result,
                      site=site, launcher=launcher.describe(), sm_range=spec.sm_range, **facts,
                      **({"spec_hash": identity.hash} if differs else {}),
                      spec_source=spec_facts["spec_source"],
                      options={"only": only, "world_size": args.world_size, "device": args.device,
                               "deadline": args.deadline, "docs": args.docs, "rerun_docs": args.rerun_docs})
    if args.json:
        json.dump({"command": "witness", "exit_code": result.data["exit_code"], "steps": result.data["steps"],
                   "problems": [], "env": spec.name, "hash": identity.hash, "target": args.target,
                   "launcher": launcher.describe(), "verdict": result.verdict.value,
                   "seconds": round(result.seconds, 3), **spec_facts,
                   **({"attested": attested.to_dict()} if attested else {})}, out, indent=2)
        out.write("\n")
    else:
        print(f"{result.verdict.value}: {spec.name} witnesses on {args.target} in {result.seconds:.1f}s "
              f"({result.detail})", file=out)
    return result.data["exit_code"]



def _attest(args, sif: str, name: str, hash_: str, launcher: str, steps, result, started) -> StepResult:
    """The run attested into SIF with --attest's key: every step, failed ones too."""
    from envport.commands.attest import witness_attest_step

    return witness_attest_step(sif, args.attest, env=name, env_hash=hash_, target=args.target, launcher=launcher,
                               steps=steps, verdict=result.verdict.value, started=started)


def _docs(args, loaded, site, hash_: str) -> list:
    """The docs level's docs, each marked where this env and doc passed before (not run again)."""
    from envport.flow.docs_level import docs_to_check

    return docs_to_check(loaded, loaded.root, target=args.target, hash_=hash_, paths=args.docs,
                         rerun=args.rerun_docs, ssh_host=args.host, ledger_dir=getattr(site, "ledger_dir", None))


def _print_step(r: StepResult, out) -> None:
    print(_table_row(r), file=out)
    for ln in r.lines:
        print(f"    | {ln}", file=out)
    out.flush()

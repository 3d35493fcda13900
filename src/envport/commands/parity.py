"""`envport parity NAME`: build the env on every target this host can run and diff what each one holds."""

from __future__ import annotations

import json
import sys
import time

from envport.targets.registry import parity_rows

TARGET_CHOICES = parity_rows()  # each target, then its SSH row (envport.targets.registry)


def register(sub) -> None:
    p = sub.add_parser(
        "parity", help="build an env on every target here (docker, SIF, venv, venv over SSH, conda) and diff them",
        description="Build the env (or find it present) on every target this host can run: the docker image, "
        "a venv here, a venv on each SSH site host, a conda env where conda is on PATH. Then compare, from "
        "inside each env: pip freeze (PEP 503 names; pip/setuptools/wheel/envport left out), the python "
        "version (at the precision the spec declares) and the env vars the spec declares (never PATH/HOME, "
        "nor ENVPORT_HASH, which differs between site-applied container builds and host builds). Prints the "
        "table and exits 1 naming every difference. A target the host cannot run is skipped with its reason.")
    p.add_argument("name", metavar="NAME|PATH", help="spec name (specs/<name>.yaml) or path")
    p.add_argument("--target", action="append", default=[], metavar="T",
                   help=f"only these targets (repeat or comma-separate): {', '.join(TARGET_CHOICES)} "
                   "(default: all)")
    p.add_argument("--host", action="append", default=None, metavar="H",
                   help="SSH host for the `ssh` target (site alias or destination; repeatable; "
                   "default: every host of the site profile)")
    p.add_argument("--site", default=None, metavar="NAME|FILE", help="site profile (default: local)")
    p.add_argument("--envs-dir", default=None, help="venv here: ENVPORT_ENVS_DIR (default: $ENVPORT_ENVS_DIR "
                   "or ~/.envport/envs)")
    p.add_argument("--ssh-envs-dir", default=None,
                   help="venv over SSH: ENVPORT_ENVS_DIR on the host (default: $ENVPORT_SSH_ENVS_DIR; when the "
                   "host is this machine, ~/.envport/ssh-envs of the SSH user there, so it is really built twice)")
    p.add_argument("--rebuild", action="store_true", help="rebuild every target even when present")
    p.add_argument("--no-ledger", action="store_true", help="do not record builds and the result in the ledger")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from envport.commands._common import load_one
    from envport.core.errors import EnvportError
    from envport.core.progress import stderr_progress
    from envport.core.verdict import exit_code
    from envport.plan.site import load_site
    from envport.recipe.identity import resolve
    from envport.flow import parity as flow
    from envport.report import parity

    targets = [t.strip() for item in args.target for t in item.split(",") if t.strip()]
    bad = [t for t in targets if t not in TARGET_CHOICES]
    if bad:
        raise EnvportError(f"--target {', '.join(bad)}: choose from {', '.join(TARGET_CHOICES)}")
    loaded = load_one(args, args.name)
    site = load_site(args.site, loaded.root)
    identity = resolve(loaded, site, TARGET_CHOICES[0]).identity  # one (spec, site) is one hash on every target
    out = sys.stdout
    opts = flow.ParityOptions(targets=tuple(targets) or TARGET_CHOICES, hosts=args.host,
                                local_envs_dir=args.envs_dir, ssh_envs_dir=args.ssh_envs_dir,
                                rebuild=args.rebuild, on_target=None if args.json else lambda f: _print_target(f, out))
    if not args.json:
        print(f"envport parity {identity.ref}", file=out)
    t0 = time.monotonic()
    facts = flow.run_parity(loaded, site, opts, progress=stderr_progress)
    diffs = parity.differences(loaded, facts)
    result = parity.judge(loaded, facts, diffs, time.monotonic() - t0)
    if not args.no_ledger:
        _record(loaded, site, identity.hash, facts, result, diffs)
    if args.json:
        json.dump({"command": "parity", "exit_code": exit_code([result]), "steps": [result.to_dict()],
                   "problems": [], "env": loaded.spec.name, "hash": identity.hash, "verdict": result.verdict.value,
                   "seconds": round(result.seconds, 3), "summary": result.detail,
                   "targets": [f.to_dict() for f in facts],
                   "differences": [{"kind": d.kind, "name": d.name, "values": d.values} for d in diffs]},
                  out, indent=2)
        out.write("\n")
    else:
        _print_table(loaded, facts, diffs, result, out)
    return exit_code([result])


def _print_target(f, out) -> None:
    if f.skipped:
        print(f"skipped  {f.target:<14} {f.skipped}", file=out)
    elif f.build is not None and not f.build.verdict.ok:
        print(f"{f.build.verdict.value:<8} {f.target:<14} {f.build.detail}", file=out)
        for ln in f.build.lines[-15:]:
            print(f"    | {ln}", file=out)
    else:
        print(f"{f.build.verdict.value:<8} {f.target:<14} python {f.python}, {len(f.packages)} packages, "
              f"{f.where} ({f.seconds:.1f}s)", file=out)
    out.flush()


def _print_table(loaded, facts, diffs, result, out) -> None:
    from envport.report import parity

    lines = parity.table(loaded, facts, diffs)
    if lines:
        print("", *lines, "", sep="\n", file=out)
    for d in diffs:
        print(f"DIFF     {d.line()}", file=out)
    print(f"{result.verdict.value} parity {loaded.spec.name}: {result.detail} ({result.seconds:.1f}s)", file=out)


def _record(loaded, site, hash_: str, facts, result, diffs) -> None:
    """Each target's build, then the comparison, as ledger records."""
    from envport.report import ledger
    from envport.report.parity import compared

    for f in facts:
        if f.build is not None and f.build.step.startswith("build"):
            target = f.target.split("@")[0]
            ledger.record(loaded.root, loaded.spec, kind="build", target=target, hash_=hash_, result=f.build,
                          site=site, via="parity")
    ledger.record(loaded.root, loaded.spec, kind="parity", target="all", hash_=hash_, result=result, site=site,
                  targets=[f.target for f in compared(facts)],
                  skipped={f.target: f.skipped for f in facts if f.skipped},
                  differences=[d.line() for d in diffs])


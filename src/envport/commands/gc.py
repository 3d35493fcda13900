"""`envport gc [NAME ...] [--keep N] [--dry-run]`: remove the builds of old hashes, saying what that frees."""

from __future__ import annotations

import re

from envport.commands._common import add_json_arg, project_root
from envport.core.errors import EnvportError
from envport.targets.registry import NAMES

HASH_RE = re.compile(r"[0-9a-f]{12,64}")


def register(sub) -> None:
    p = sub.add_parser(
        "gc", help="remove images, SIFs and venvs of old hashes (what no ledger record holds), saying what it frees",
        description="For each env (every spec by default) and target, find what its builds left on this host "
        "(images envport/NAME:<hash12> in docker and podman, <sif_dir>/NAME-<hash12>.sif, the venv under the "
        "envs dir) and remove those of old hashes. Kept: the current hash (the one `build` gives the spec on "
        "--site, locked or --no-lock); a hash a ledger `hold` record names (--hold); the --keep N most recently "
        "used old hashes per env and target (last used: the newest ledger record of that hash there, else when "
        "it was made); anything in use (a container of the image, a build holding the env's lock). Only what "
        "carries envport's marks is touched (labels, this machine's SIF build record, the venv's .envport/hash); "
        "anything else named like it is listed as left. One line per artefact, then the total freed. Exit 0; "
        "1 when a removal failed; 2 on an invalid spec (nothing is removed); 3 when a named --target cannot "
        "gc here (its reason).")
    p.add_argument("specs", nargs="*", metavar="NAME|PATH", help="the envs (default: every spec in specs/)")
    p.add_argument("--target", action="append", choices=NAMES, default=None,
                   help="only this target (repeat for more; default: every target)")
    p.add_argument("--keep", type=int, default=1, metavar="N",
                   help="also keep the N most recently used old hashes of each env and target (default 1: the "
                   "build before the current one; 0: only the current one)")
    p.add_argument("--dry-run", action="store_true", help="list what would be removed and its size; remove nothing")
    p.add_argument("--phase-cache", action="store_true",
                   help="also empty the SIF builder's phase cache (the rootfs after each phase, which makes a "
                   "rebuild after an edit start from the last unchanged phase; docs/apptainer.md), with --dry-run "
                   "say what it holds. Without it gc leaves that cache alone: each build keeps it under its cap "
                   "(ENVPORT_SIF_PHASE_CACHE_MAX) and removes what killed builds left")
    p.add_argument("--site", default=None, metavar="NAME|FILE", help="site profile: the current hash, sif_dir, ledger (default: local)")
    p.add_argument("--hold", metavar="HASH", default=None,
                   help="record in NAME's ledger that builds of HASH (12+ hex digits) are in use: gc keeps them "
                   "until --release; removes nothing")
    p.add_argument("--release", metavar="HASH", default=None, help="end a --hold of HASH; removes nothing")
    add_json_arg(p)
    p.set_defaults(func=run)


def _hold(args, root, site) -> int:
    from envport.core.verdict import StepResult, Verdict, envelope, print_json
    from envport.flow.gc import HOLD, RELEASE
    from envport.report import ledger

    kind, value = (HOLD, args.hold) if args.hold else (RELEASE, args.release)
    if args.hold and args.release:
        raise EnvportError("--hold and --release are two runs: give one of them")
    if len(args.specs) != 1:
        raise EnvportError(f"--{kind} records in one env's ledger: name exactly one env (envport gc NAME --{kind} "
                           "HASH)")
    if not HASH_RE.fullmatch(value):
        raise EnvportError(f"--{kind} {value!r}: expected the env's hash, 12 to 64 lowercase hex digits (as "
                           "`envport ledger NAME` or an image tag shows it)")
    from envport.commands._common import load_one

    name = load_one(args, args.specs[0]).spec.name
    summary = (f"builds of {value[:12]} are in use: envport gc keeps them" if kind == HOLD
               else f"builds of {value[:12]} are no longer held")
    ledger.append(root, name, {"kind": kind, "target": "all", "held": value, "key": f"env:{name}@{value[:12]}",
                               "verdict": "OK", "summary": summary}, site.ledger_dir)
    step = StepResult(f"{kind} {name}@{value[:12]}", Verdict.OK, summary)
    if args.json:
        print_json(envelope("gc", 0, [step], env=name))
    else:
        print(step.line())
    return 0


def run(args) -> int:
    from envport.commands._common import load_each, spec_problems, unlocked
    from envport.core.verdict import StepResult, envelope, exit_code, print_json
    from envport.flow import gc
    from envport.plan.site import load_site
    from envport.recipe.identity import resolve
    from envport.report import ledger
    from envport.targets.registry import get

    root = project_root(args)
    site = load_site(args.site, root)
    if args.hold or args.release:
        return _hold(args, root, site)
    if args.keep < 0:
        raise EnvportError(f"--keep {args.keep}: expected 0 or more old hashes to keep")
    args.all = not args.specs
    loaded_all, problems = load_each(args)
    if problems:
        raise spec_problems(problems)  # an env whose current hash is unknown could lose its current build
    targets = [get(n) for n in (args.target or NAMES)]
    by_name = {t.name: t for t in targets}
    cache: dict = {}
    steps: list[StepResult] = []
    for loaded in loaded_all:
        name = loaded.spec.name
        current = frozenset(resolve(loaded, s, t.name).identity.hash12 for t in targets
                            for s in (site, unlocked(site, True)))
        held, used = gc.ledger_facts(ledger.read(root, name, site.ledger_dir))
        arts, notes = gc.scan(name, site, root, targets, cache, explicit=bool(args.target))
        steps += notes
        env_steps = gc.apply(gc.decide(arts, gc.EnvState(current, held, used), args.keep), by_name, root,
                             args.dry_run)
        steps += env_steps
        if not args.json:
            for s in notes + env_steps:
                print(s.line())
    if args.phase_cache:
        cached = gc.phase_cache_step(site, root, args.dry_run)
        if cached is not None:
            steps.append(cached)
            if not args.json:
                print(cached.line())
    total = gc.total_line(steps, args.dry_run)
    code = exit_code(steps)
    if args.json:
        freed = sum(s.data.get("freed") or 0 for s in steps)
        print_json(envelope("gc", code, steps, dry_run=args.dry_run, keep=args.keep, freed_bytes=freed,
                            summary=total))
        return code
    if not loaded_all:
        print("no specs in specs/: nothing to look for")
    print(total)
    return code

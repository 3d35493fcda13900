"""`envport lock NAME`: write specs/<name>.lock, or check that it still fits the spec."""

from __future__ import annotations

from envport.commands._common import add_spec_args, load_selected, project_root


def register(sub) -> None:
    p = sub.add_parser("lock", help="resolve each pip phase in order into specs/<name>.lock (or --check it)",
                       description="Resolve every pip phase of a spec in order, each against the env the "
                       "earlier phases left (as a build does), in a scratch venv with the spec's python on "
                       "this machine, and write specs/<name>.lock: per phase every distribution it installs "
                       "or replaces (name, version, file name, sha256), the python and platform it was made "
                       "for, and a digest of the phase inputs. Builds then install each phase as exactly its "
                       "locked set (--no-deps --require-hashes). Where a lock is there already, each phase "
                       "prefers the versions it had (as pip-compile and uv do), so an edit moves only what it "
                       "needs to: --upgrade prefers nothing, --upgrade-package NAME (repeatable) lets NAME move; "
                       "the verdict lists every distribution that moved. --check resolves nothing: it exits 1 when a "
                       "lock is missing or was made from other phases than the spec has now (with --all, "
                       "specs without a lock are skipped).")
    add_spec_args(p)
    p.add_argument("--site", default=None, metavar="NAME|FILE", help="site profile whose pip sources (a mirror) the resolver uses "
                   "(default: local); the lock itself holds no URL or path")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 when a lock is stale or missing")
    p.add_argument("--upgrade", action="store_true",
                   help="resolve every phase afresh, preferring none of the lock's versions")
    p.add_argument("--upgrade-package", action="append", default=[], metavar="NAME",
                   help="let NAME move to what the phase resolves now (the rest keep the lock's versions); "
                   "repeatable")
    p.add_argument("--json", action="store_true", help="print the verdicts as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from envport.builders.lock import check_spec, lock_spec
    from envport.core.progress import stderr_progress
    from envport.core.verdict import StepResult, Verdict, report
    from envport.plan.lock import lock_path
    from envport.plan.site import load_site

    root = project_root(args)
    every = getattr(args, "all", False)
    results = []
    for loaded in load_selected(args):
        if args.check:
            if every and loaded.spec.name not in args.specs and not lock_path(loaded).is_file():
                results.append(StepResult(f"lock {loaded.spec.name}", Verdict.SKIPPED, "no lock"))
                continue
            results.append(check_spec(loaded))
            continue
        results.append(lock_spec(loaded, load_site(args.site, root), root, stderr_progress, upgrade=args.upgrade,
                                 upgrade_packages=tuple(args.upgrade_package)))
    return report(results, args.json, command="lock")

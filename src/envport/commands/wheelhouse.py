"""`envport wheelhouse NAME`: download every pip phase's distributions to the host."""

from __future__ import annotations

from envport.commands._common import load_one, project_root


def register(sub) -> None:
    p = sub.add_parser("wheelhouse", help="download an env's wheels for offline (--no-index) builds",
                       description="Download every pip phase's distributions for the env's python into "
                       "<site wheelhouse_dir>/<name>/ through the host's pip configuration; container builds "
                       "on a site with `wheelhouse: true` install from it with --no-index. `present` when "
                       "the wheelhouse already holds every phase. With specs/<name>.lock it holds exactly the "
                       "locked files (pip download --no-deps --require-hashes per phase), and every file's "
                       "sha256 is checked against the lock: a file that differs is FAILED [hash_mismatch], "
                       "named with both digests, before any build uses it.")
    p.add_argument("spec", metavar="NAME|PATH")
    p.add_argument("--site", default=None, metavar="NAME|FILE", help="site profile (default: local)")
    p.add_argument("--refresh", action="store_true", help="download again even when present")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args) -> int:
    from envport.core.progress import stderr_progress
    from envport.plan.site import load_site
    from envport.core.verdict import report
    from envport.builders.wheelhouse import ensure_wheelhouse

    root = project_root(args)
    loaded = load_one(args, args.spec)
    site = load_site(args.site, root)
    result = ensure_wheelhouse(loaded, site, root, stderr_progress, refresh=args.refresh)
    return report([result], args.json, command="wheelhouse")

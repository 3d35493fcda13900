"""`envport verify NAME --target docker`: prove a built env holds what its spec promises."""

from __future__ import annotations

from pathlib import Path

from envport.commands._common import add_no_lock_arg, load_one, project_root, unlocked
from envport.targets.base import VERIFY
from envport.targets.registry import get, hosted, names

# Every target: one that cannot verify says why (REFUSED [unsupported]) rather than not being a choice.
VERIFY_TARGETS = names()


def register(sub) -> None:
    p = sub.add_parser("verify", help="run the spec's testinfra assertions (and tests/images/) against a built env",
                       description="Start the env's image (docker run -d --network <site network> IMAGE sleep "
                       "infinity, always removed afterwards) and run, as pytest items through testinfra, one "
                       "assertion per promise of the spec: system packages installed, pip packages at the version "
                       "the last phase naming them pins, the python version, every env var's exact value, shim "
                       "files' sha256, weight mount points present and empty, and the envport.hash label. Tests "
                       "under tests/images/ run in the same session (testinfra's `host` fixture). Writes JUnit XML "
                       "and a ledger record. Exit 1 when any check fails, 3 when refused.")
    p.add_argument("spec", metavar="NAME|PATH")
    p.add_argument("--target", choices=VERIFY_TARGETS, default="docker", help="what to verify (default: docker)")
    p.add_argument("--site", default=None, help="site profile (default: local); it names the image's hash")
    p.add_argument("--image", default=None,
                   help="verify this image instead of envport/<name>:<hash12> (its envport.hash label may then "
                   "differ: that check is skipped and says so)")
    p.add_argument("--sif", default=None, metavar="FILE",
                   help="apptainer: verify this SIF instead of <sif_dir>/<name>-<hash12>.sif (run with apptainer "
                   "exec where installed, else ch-run on the SIF mounted with squashfuse)")
    p.add_argument("--host", default=None, help=f"{'/'.join(hosted())}: the env on this SSH host (site alias or destination), "
                   "checked through testinfra ssh:// with the site's ssh_config (verify/backends.py)")
    add_no_lock_arg(p, "verify")
    p.add_argument("--junit", default=None, help="JUnit XML path (default: reports/verify-<name>.xml)")
    p.add_argument("--json", action="store_true", help="print the verdict and every check as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from envport.core.progress import stderr_progress
    from envport.core.verdict import report
    from envport.plan.site import load_site
    from envport.recipe.identity import resolve
    from envport.report import ledger

    root = project_root(args)
    loaded = load_one(args, args.spec)
    from envport.core.extras import VERIFY_MODULES, refusal
    missing = refusal(f"verify {loaded.spec.name}", VERIFY_MODULES)
    if missing is not None:  # nothing ran, so nothing is recorded
        return report([missing], args.json, command="verify")
    site = unlocked(load_site(args.site, root), args.no_lock)
    junit = Path(args.junit).resolve() if args.junit else None
    from envport.targets.base import Unsupported, VerifyRequest

    target = get(args.target)
    if not target.supports(VERIFY):
        return report([target.refuse(VERIFY).result(f"verify {loaded.spec.name}")], args.json, command="verify")
    try:
        result = target.verify(VerifyRequest(loaded, site, root, host=args.host, image=args.image,
                                             sif=Path(args.sif).resolve() if args.sif else None, junit=junit,
                                             progress=stderr_progress))
    except Unsupported as exc:
        return report([exc.result(f"verify {loaded.spec.name}")], args.json, command="verify")
    ledger.record(root, loaded.spec, kind="verify", target=args.target, hash_=resolve(loaded, site, args.target).hash,
                  result=result, site=site)
    return report([result], args.json, command="verify")

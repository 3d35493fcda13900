"""`envport weights verify|fetch|stage NAME`: an env's declared weight files, checked deep, fetched by the
spec's own `source` command, staged to an SSH host."""

from __future__ import annotations

from envport.commands._common import load_one


def register(sub) -> None:
    p = sub.add_parser("weights", help="verify, fetch or stage an env's weights (size + sha256 of every pinned file)",
                       description="verify: every file weight_dirs declares is present under the weights root "
                       "(<root>/<env>/<weight>/), at its size and its sha256 (every byte read; large files print "
                       "progress); present, or REFUSED naming each file off its pin with both digests (a file that is a symlink "
                       "leaving its weight folder is off its pin; a folder others can write is a warning naming its "
                       "mode). fetch: "
                       "verify, then run each weight's own `source` command (in specs/, the weight's env var and "
                       "ENVPORT_WEIGHT_DIR pointed at its folder, the env's interpreter first on PATH) where files "
                       "are absent, then verify again; exit 3 from the command is REFUSED with its own words, "
                       "other non-zero FAILED. Nothing is ever deleted: a file off its pin is left in place and "
                       "the fix says to remove it by hand. A gated weight needs its auth_hint token in the "
                       "environment; it is passed to the command, and every weight's token is masked (***) in "
                       "all envport prints or records. stage --host H: copy "
                       "verified weights to ~/.envport/weights/<env>/ on an SSH host. --sif FILE: the weights of "
                       "the spec FILE.sif embeds, after the trust gate and inspect's checks tie it to the image, "
                       "for an admin who holds the SIF and no project.")
    p.add_argument("action", choices=("verify", "fetch", "stage"))
    p.add_argument("spec", metavar="NAME|PATH")
    p.add_argument("--root", dest="weights_root", default=None, metavar="DIR",
                   help="weights root (default: $ENVPORT_WEIGHTS_DIR, else ~/.envport/weights)")
    p.add_argument("--host", default=None, help="stage: the SSH host (site alias or destination)")
    p.add_argument("--site", default=None, metavar="NAME|FILE", help="site profile naming SSH hosts (default: local); with --sif its "
                   "trust gates the file")
    p.add_argument("--sif", default=None, metavar="FILE",
                   help="the spec this SIF embeds instead of specs/NAME.yaml (no project needed)")
    p.add_argument("--json", action="store_true", help="print the verdict as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from envport.builders import weights
    from envport.core.errors import EnvportError
    from envport.core.progress import stderr_progress
    from envport.core.verdict import report
    from envport.plan.site import load_site
    from envport.recipe.identity import resolve
    from envport.report import ledger

    loaded = _embedded(args) if args.sif else load_one(args, args.spec)
    if not hasattr(loaded, "spec"):  # the SIF or its spec refused: the gate's or inspect's own words
        return report([loaded], args.json, command="weights")
    root = weights.weights_root(args.weights_root)
    site = load_site(args.site, loaded.root)
    if args.action == "verify":
        result = weights.verify(loaded, root, stderr_progress)
    elif args.action == "fetch":
        result = weights.fetch(loaded, root, interpreter_bin=venv_bin(loaded.spec.name), progress=stderr_progress)
    else:
        if not args.host:
            raise EnvportError("weights stage needs --host H: local targets read the weights root directly "
                               "(docker/apptainer mount it read-only, a venv gets the env var)")
        from envport.engines.ssh import resolve_host

        result = weights.stage(loaded, root, resolve_host(site, args.host), progress=stderr_progress)
    if args.action != "verify":
        ledger.record(loaded.root, loaded.spec, kind="weights", target=args.host or "local",
                      hash_=resolve(loaded, site, "venv").hash, result=result, action=args.action,
                      weights_root=str(root))
    return report([result], args.json, command="weights")


def _embedded(args):
    """The Loaded spec the --sif FILE embeds (rooted at the project or this folder), or the StepResult refusing
    it; the site is loaded first, so its trust.require_signed gates the file before its spec is read."""
    from pathlib import Path

    from envport.commands._common import root_or_here
    from envport.core.errors import EnvportError
    from envport.plan.site import load_site
    from envport.targets.registry import get

    if args.action == "stage":
        raise EnvportError("weights stage --sif: stage from the project (the SIF's spec names no SSH host)")
    where = root_or_here(args)
    load_site(args.site, where)
    got = get("apptainer").embedded(str(Path(args.sif)), args.spec, where)
    return got.loaded if hasattr(got, "loaded") else got


def venv_bin(name: str):
    """The env's venv bin/ here when it is built: the `source` command's `python` is then the env's."""
    from envport.core.layout import env_prefix

    bin_dir = env_prefix(name) / "bin"
    return bin_dir if (bin_dir / "python").exists() else None

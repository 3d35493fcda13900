"""`envport build NAME --target T`: build an env, or report it present."""

from __future__ import annotations

from ._common import load_one, project_root

BUILD_TARGETS = ("docker", "apptainer", "venv", "conda")


def register(sub) -> None:
    p = sub.add_parser("build", help="build an env (docker image, .sif, venv or conda env)",
                       description="Build an env from its spec, or report it `present` when an env with the "
                       "same content hash exists (checked, not assumed). docker: image envport/<name>:<hash12>; "
                       "apptainer: .cache/sif/<name>-<hash12>.sif; venv/conda: the rendered setup script run "
                       "locally or over SSH (--host, a site host alias or an ssh destination). Every build is "
                       "recorded in images/<name>/ledger.json and docs/envs/<name>.md.")
    p.add_argument("spec", metavar="NAME|PATH")
    p.add_argument("--target", choices=BUILD_TARGETS, default="venv",
                   help="what to build (default: venv, which needs no daemon)")
    p.add_argument("--site", default=None, help="site profile from sites/ (default: local)")
    p.add_argument("--host", default=None, help="venv/conda: build on this SSH host (site alias or destination)")
    p.add_argument("--rebuild", action="store_true", help="build even when present")
    p.add_argument("--no-cache", action="store_true", help="docker: do not reuse the engine's layer cache")
    p.add_argument("--json", action="store_true", help="print the verdicts as JSON")
    p.set_defaults(func=run)


def _fast_present(args) -> int | None:
    """Docker `present` without loading the spec (see envport.present_cache)."""
    from pathlib import Path

    from ..present_cache import present
    if args.target != "docker" or args.rebuild or args.no_cache or args.spec.endswith((".yaml", ".yml")):
        return None
    root = Path(args.root).resolve() if args.root else Path.cwd()
    if not (root / "specs" / f"{args.spec}.yaml").is_file():
        return None  # not at the project root: the full path finds it
    hit = present(root, args.spec, args.site)
    if hit is None:
        return None
    from ..verdict import StepResult, Verdict, report

    result = StepResult(f"image {hit['tag']}", Verdict.PRESENT, f"{hit['id'][:19]} ({hit['size'] / 1e9:.2f} GB)",
                        data={"image": hit["tag"], "image_id": hit["id"], "size": hit["size"]})
    code = report([result], args.json)
    if not args.json:
        print(f"present {args.spec}@{hit['hash'][:12]} --target docker")
    return code


def run(args) -> int:
    fast = _fast_present(args)
    if fast is not None:
        return fast
    from ..hashing import content_hash
    from ..ledger import append
    from ..progress import stderr_progress
    from ..site import load_site
    from ..verdict import Verdict, report

    root = project_root(args)
    loaded = load_one(args, args.spec)
    site = load_site(args.site, root)
    if args.target == "docker":
        from ..builders import docker
        results = docker.build(loaded, site, root, rebuild=args.rebuild, no_cache=args.no_cache,
                               progress=stderr_progress)
        hash_ = content_hash(loaded, site)
        if results[-1].verdict in (Verdict.OK, Verdict.PRESENT):
            from ..present_cache import remember
            remember(root, loaded.spec.name, args.site, hash_, docker.image_tag(loaded.spec.name, hash_))
    elif args.target == "apptainer":
        from ..builders import apptainer
        results = apptainer.build(loaded, site, root, rebuild=args.rebuild, progress=stderr_progress)
        hash_ = content_hash(loaded, site)
    else:
        from ..builders import shell
        results = shell.build(loaded, site, root, flavour=args.target, host=args.host, rebuild=args.rebuild,
                              progress=stderr_progress)
        hash_ = loaded.hash
    code = report(results, args.json)
    last = results[-1]
    if args.target in ("venv", "conda") or args.target == "apptainer":
        # The docker builder records its own build (image id, size); these record here.
        append(root, loaded.spec.name, {
            "kind": "build", "target": args.target, "hash": hash_, "verdict": last.verdict.value,
            "summary": last.detail, "seconds": round(sum(r.seconds for r in results), 3),
            "resources": loaded.spec.resources.model_dump(), "sm_range": loaded.spec.sm_range,
            "weights": {n: w.path for n, w in loaded.spec.weight_dirs.items()},
            **{k: v for k, v in last.data.items()},
        })
    if not args.json:
        print(f"{last.verdict.value} {loaded.spec.name}@{hash_[:12]} --target {args.target}")
    return code

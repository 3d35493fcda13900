"""`envport sbom NAME --target T` and `envport sbom FILE.sif`: what a built env holds, read by its target."""

from __future__ import annotations

import sys
from pathlib import Path

from envport.targets.registry import NAMES, names


def register(sub) -> None:
    p = sub.add_parser("sbom", help="a CycloneDX (or SPDX) SBOM of a built env (or a .sif), read from its content",
                       description="Write a CycloneDX 1.6 JSON SBOM (or SPDX 2.3 JSON: --format spdx) of what a built env holds, read from the env "
                       "itself, never from its spec: the Debian packages its var/lib/dpkg/status lists as "
                       "installed (pkg:deb/debian/...) and the Python distributions (*.dist-info) of its "
                       "interpreter's site-packages (pkg:pypi/...), with the env's name, hash and lock as "
                       "metadata; validated against CycloneDX's schema before it is written. A SIF that carries "
                       "its builder's SBOM object (envport's builds do) gives that object, read without mounting "
                       "anything, and says whether a signature verified against the site's trust.keys covers it; "
                       "--from-content (or --format spdx, or a SIF without one) reads its partition instead, "
                       "mounted read-only (nosuid,nodev), or extracted where this user has no FUSE; a docker or podman image's filesystem is exported to "
                       "a tmp dir (the container is never started); a venv is read in place. Exit 0 written, 3 "
                       "refused (the env is not built, the SIF cannot be mounted here, or the target has no "
                       "SBOM: unsupported, with why), 1 failed (not a usable SIF).")
    p.add_argument("env", metavar="NAME|FILE.sif", help="a spec name (with --target), or a SIF file")
    p.add_argument("--target", choices=NAMES, default="docker",
                   help=f"which built env of NAME (default: docker; with an SBOM: {', '.join(names('sbom'))})")
    p.add_argument("--site", default=None, metavar="NAME|FILE", help="site profile (default: local); it names the env's hash, and "
                   "for FILE.sif its trust: trust.require_signed gates the file, trust.keys say who signed its SBOM")
    p.add_argument("--format", choices=("cyclonedx", "spdx"), default="cyclonedx",
                   help="cyclonedx (CycloneDX 1.6 JSON, default) or spdx (SPDX 2.3 JSON, via spdx-tools)")
    p.add_argument("--from-content", action="store_true",
                   help="FILE.sif: read the partition's own files, not the SBOM object the SIF carries")
    p.add_argument("-o", "--output", default=None, metavar="FILE", help="write the SBOM here (default: stdout)")
    p.set_defaults(func=run)


def run(args) -> int:
    from envport.core.extras import refusal
    from envport.core.files import write_atomic
    from envport.core.verdict import StepResult, Verdict, report

    # CycloneDX and package URLs come with the build extra: a base install refuses in one line.
    missing = refusal(f"sbom {args.env}", ("cyclonedx", "packageurl"))
    if missing is not None:
        return report([missing], False, stream=sys.stderr)
    if args.env.endswith(".sif") or Path(args.env).is_file():
        from envport.commands._common import root_or_here
        from envport.plan.site import load_site
        from envport.targets.sbom import from_sif

        load_site(args.site, root_or_here(args))  # its trust: trust.require_signed gates the file, trust.keys
        result, text = from_sif(Path(args.env), None, args.format, args.from_content)
    else:
        result, text = _from_name(args)
    if text is None:
        return report([result], False, stream=sys.stderr)
    if args.output:
        write_atomic(Path(args.output), text)
        return report([StepResult(result.step, Verdict.OK, f"{result.detail}; written to {args.output}")], False,
                      stream=sys.stderr)
    sys.stdout.write(text)
    return report([result], False, stream=sys.stderr)


def _from_name(args):
    from envport.commands._common import load_one, project_root
    from envport.plan.site import load_site
    from envport.recipe.identity import identify
    from envport.sif.sbom import lock_fact
    from envport.targets.base import SbomRequest, Unsupported
    from envport.targets.registry import get

    root = project_root(args)
    loaded = load_one(args, args.env)
    site = load_site(args.site, root)
    identity = identify(loaded, site)
    req = SbomRequest(loaded, site, root, identity, lock_fact(loaded, site), args.format)
    try:
        return get(args.target).sbom(req)
    except Unsupported as exc:
        return exc.result(f"sbom {identity.ref} --target {args.target}"), None

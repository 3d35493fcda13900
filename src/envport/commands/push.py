"""`envport push NAME --target T --to oras://HOST/REPO[:TAG]`: a built env into a registry, by its target."""

from __future__ import annotations

from pathlib import Path

from envport.targets.registry import NAMES, names


def register(sub) -> None:
    p = sub.add_parser("push", help="push a built SIF (ORAS, as apptainer push does) or image to a registry",
                       description="Push NAME's built env to a registry under its hash12 tag, plus the "
                       "tag in --to and every --tag. apptainer: the SIF <sif_dir>/<name>-<hash12>.sif (or "
                       "--sif FILE), tagged with the hash its own envport.hash label names (a --sif FILE whose "
                       "envport.name label names another env is refused, sif_other_env; one without an "
                       "envport.hash label, built by apptainer or not a SIF, is pushed only under the tags you "
                       "name, and refused, not_envport, when you name none), as `apptainer push` writes it: an "
                       "OCI manifest with config "
                       "application/vnd.sylabs.sif.config.v1+json `{}` and one layer "
                       "application/vnd.sylabs.sif.layer.v1.sif titled with the file name. docker: the image "
                       "envport/<name>:<hash12>, tagged HOST/REPO:TAG and pushed by the docker engine (which "
                       "reads the registry's CA from /etc/docker/certs.d/HOST/ca.crt). podman: the same image in "
                       "this user's podman storage, pushed by `podman push` (the site's registry_ca as its "
                       "--cert-dir). A target that cannot push is refused, unsupported, with why. TLS: the site profile's "
                       "registry_ca, else the system's CAs. Credentials: ENVPORT_REGISTRY_USER and "
                       "ENVPORT_REGISTRY_PASSWORD, else the docker config file (never on the command line). "
                       "Exit 0 pushed, 3 refused (registry_unreachable, sif_missing, image_missing, denied, "
                       "tls_failed, sif_other_env, not_envport, unsupported), 1 failed, 2 usage.")
    p.add_argument("spec", metavar="NAME|PATH")
    p.add_argument("--to", required=True, metavar="oras://HOST/REPO[:TAG]", help="the registry repository")
    p.add_argument("--target", choices=NAMES, default="apptainer",
                   help=f"what to push (default: apptainer; pushes: {', '.join(names('push'))})")
    p.add_argument("--tag", action="append", default=[], help="one more tag (repeatable); the hash12 tag is always "
                   "pushed (a --sif FILE's: of its own envport.hash label, when it has one)")
    p.add_argument("--sif", default=None, metavar="FILE", help="a SIF target: push this SIF instead of the built one, "
                   "under the hash12 of its own envport.hash label (never the spec's)")
    p.add_argument("--site", default=None, metavar="NAME|FILE", help="site profile: NAME (the project's "
                   "sites/NAME.yaml) or FILE (a path ending .yaml or .yml); default: local. The env's hash and "
                   "registry_ca")
    p.add_argument("--json", action="store_true", help="print the verdict as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from envport.commands._common import load_one, project_root
    from envport.core.errors import EnvportError
    from envport.core.verdict import report
    from envport.engines import registry
    from envport.plan.site import load_site
    from envport.recipe.identity import identify
    from envport.targets.base import PushRequest, Unsupported
    from envport.targets.registry import get

    try:
        ref = registry.parse_ref(args.to)
        for tag in args.tag:
            registry.check_tag(tag)
    except ValueError as exc:
        raise EnvportError(f"--to/--tag: {exc}") from None
    root = project_root(args)
    loaded = load_one(args, args.spec)
    site = load_site(args.site, root)
    named = (*([ref.tag] if ref.tag else []), *args.tag)
    req = PushRequest(loaded, site, root, identify(loaded, site), ref, named,
                      sif=Path(args.sif) if args.sif else None)
    try:
        result = get(args.target).push(req)
    except Unsupported as exc:
        result = exc.result(f"push {loaded.spec.name} --target {args.target}")
    return report([result], args.json, command="push")

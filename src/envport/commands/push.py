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
                       "--attest KEY.pem (docker, podman): after the push, a SLSA provenance v1 statement about "
                       "the manifest the registry holds under the hash12 tag, signed with the key (DSSE), is "
                       "attached to it as an OCI referrer (docs/provenance.md); a SIF's statements are in the "
                       "file and attached at every push, so --attest with a SIF target is a usage error. "
                       "Exit 0 pushed, 3 refused (registry_unreachable, sif_missing, image_missing, denied, "
                       "tls_failed, sif_other_env, not_envport, unsupported, digest_mismatch), 1 failed, 2 usage "
                       "(a key that does not load: before anything is pushed).")
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
    p.add_argument("--attest", default=None, metavar="KEY.pem", help="an image target: attach the image's build "
                   "provenance (SLSA v1, signed with this PEM private key, the keys `envport sign` takes) as an OCI "
                   "referrer of the pushed manifest")
    p.add_argument("--json", action="store_true", help="print the verdict as JSON")
    p.set_defaults(func=run)


def _attest(args, root, site, identity):
    """--attest's keys, loaded now (a bad key is exit 2 before anything is pushed), with the build's times from
    this machine's ledger; None without --attest. A SIF target is a usage error: its statements are read from
    the file and attached at every push."""
    from envport.commands.sign import load_signers
    from envport.core.errors import EnvportError
    from envport.sif.provenance.image import ImageAttest
    from envport.targets.registry import get

    if not args.attest:
        return None
    if get(args.target).signs:
        raise EnvportError(f"envport push --attest is for an image target: a {args.target} env's statements are in "
                           "its SIF (build --sign, witness --attest, envport attest FILE.sif --key KEY.pem) and every "
                           "push attaches them as referrers; push without --attest", exit_code=2)
    signers = tuple(load_signers([args.attest]))
    return ImageAttest(signers, *_build_times(root, site, identity, args.target))


def _build_times(root, site, identity, target: str):
    """(started, finished) of the newest build of IDENTITY by TARGET this machine's ledger recorded as built
    (verdict OK: `present` records a check, not a build): finished = when the record was written, right after
    the build, started = that less its seconds. (None, None) when there is none."""
    from datetime import datetime, timedelta

    from envport.report import ledger

    rec = ledger.previous_build(ledger.read(root, identity.name, getattr(site, "ledger_dir", None)), target,
                                hash_prefix=identity.hash, verdicts=("OK",))
    try:
        finished = datetime.fromisoformat(str(rec["when"]))
        return finished - timedelta(seconds=float(rec.get("seconds") or 0)), finished
    except (KeyError, ValueError, TypeError):  # no such record (None), or one without a readable time
        return None, None


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
    identity = identify(loaded, site)
    req = PushRequest(loaded, site, root, identity, ref, named, sif=Path(args.sif) if args.sif else None,
                      attest=_attest(args, root, site, identity))
    try:
        result = get(args.target).push(req)
    except Unsupported as exc:
        result = exc.result(f"push {loaded.spec.name} --target {args.target}")
    return report([result], args.json, command="push")

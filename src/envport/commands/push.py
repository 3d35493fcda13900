"""`envport push NAME --target apptainer|docker --to oras://HOST/REPO[:TAG]`: a built env into a registry."""

from __future__ import annotations

import time
from pathlib import Path

PUSH_TARGETS = ("apptainer", "docker")


def register(sub) -> None:
    p = sub.add_parser("push", help="push a built SIF (ORAS, as apptainer push does) or image to a registry",
                       description="Push NAME's built env to a registry under the env's hash12 tag, plus the "
                       "tag in --to and every --tag. apptainer: the SIF <sif_dir>/<name>-<hash12>.sif (or "
                       "--sif FILE) as `apptainer push` writes it: an OCI manifest with config "
                       "application/vnd.sylabs.sif.config.v1+json `{}` and one layer "
                       "application/vnd.sylabs.sif.layer.v1.sif titled with the file name. docker: the image "
                       "envport/<name>:<hash12>, tagged HOST/REPO:TAG and pushed by the docker engine (which "
                       "reads the registry's CA from /etc/docker/certs.d/HOST/ca.crt). TLS: the site profile's "
                       "registry_ca, else the system's CAs. Credentials: ENVPORT_REGISTRY_USER and "
                       "ENVPORT_REGISTRY_PASSWORD, else the docker config file (never on the command line). "
                       "Exit 0 pushed, 3 refused (registry_unreachable, sif_missing, image_missing, denied, "
                       "tls_failed), 1 failed, 2 usage.")
    p.add_argument("spec", metavar="NAME|PATH")
    p.add_argument("--to", required=True, metavar="oras://HOST/REPO[:TAG]", help="the registry repository")
    p.add_argument("--target", choices=PUSH_TARGETS, default="apptainer", help="what to push (default: apptainer)")
    p.add_argument("--tag", action="append", default=[], help="one more tag (repeatable); the hash12 tag is always "
                   "pushed")
    p.add_argument("--sif", default=None, metavar="FILE", help="apptainer: push this SIF instead of the built one")
    p.add_argument("--site", default=None, help="site profile (default: local): the env's hash and registry_ca")
    p.add_argument("--json", action="store_true", help="print the verdict as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from envport.commands._common import load_one, project_root
    from envport.core.errors import EnvportError
    from envport.core.verdict import report
    from envport.engines import registry
    from envport.plan.site import load_site
    from envport.recipe.identity import resolve

    try:
        ref = registry.parse_ref(args.to)
        for tag in args.tag:
            registry.check_tag(tag)
    except ValueError as exc:
        raise EnvportError(f"--to/--tag: {exc}") from None
    root = project_root(args)
    loaded = load_one(args, args.spec)
    site = load_site(args.site, root)
    identity = resolve(loaded, site, args.target).identity
    tags = list(dict.fromkeys([identity.hash12, *([ref.tag] if ref.tag else []), *args.tag]))
    if args.target == "docker":
        result = _push_image(identity, ref, tags, loaded.spec.name)
    else:
        from envport.builders.apptainer.builder import sif_path

        sif = Path(args.sif) if args.sif else sif_path(site, root, identity)
        result = _push_sif(sif, ref, tags, site.registry_ca, loaded.spec.name)
    return report([result], args.json, command="push")


def _push_sif(sif: Path, ref, tags: list[str], ca, name: str):
    from envport.core.progress import transfer_progress
    from envport.core.verdict import StepResult, Verdict
    from envport.engines import registry

    step = f"push {sif.name} -> {ref.with_tag(tags[0])}"
    if not sif.is_file():
        return StepResult(step, Verdict.REFUSED, f"no SIF at {sif}", reason="sif_missing",
                          lines=[f"fix: envport build {name} --target apptainer"])
    start = time.monotonic()
    try:
        out = registry.push_sif(sif, ref, tags, ca=ca, progress=transfer_progress(f"push {sif.name}"))
    except registry.RegistryError as exc:
        return StepResult(step, Verdict.REFUSED, str(exc), reason=exc.reason, seconds=time.monotonic() - start)
    return StepResult(step, Verdict.OK, f"{out['size']} bytes, layer {out['digest']}, tags {', '.join(tags)}",
                      seconds=time.monotonic() - start, data={**out, "repository": f"{ref.host}/{ref.repo}"})


def _push_image(identity, ref, tags: list[str], name: str):
    from envport.core.verdict import StepResult, Verdict
    from envport.core.proc import run as proc_run
    from envport.core.progress import tail
    from envport.engines import registry
    from envport.engines.docker import cli_env, image_exists

    step = f"push {identity.image_tag} -> {ref.with_tag(tags[0])}"
    if not image_exists(identity.image_tag):
        return StepResult(step, Verdict.REFUSED, f"the engine has no image {identity.image_tag}",
                          reason="image_missing", lines=[f"fix: envport build {name} --target docker"])
    start = time.monotonic()
    try:
        registry.reachable(ref.host)
    except registry.RegistryError as exc:
        return StepResult(step, Verdict.REFUSED, str(exc), reason=exc.reason)
    pushed = []
    for tag in tags:
        dest = str(ref.with_tag(tag))
        for argv in (["docker", "tag", identity.image_tag, dest], ["docker", "push", dest]):
            proc = proc_run(argv, env=cli_env(), timeout=1800)
            if not proc.ok:
                return StepResult(step, Verdict.FAILED, f"`{' '.join(argv)}` exited {proc.returncode}",
                                  lines=tail(proc.stderr or proc.stdout or proc.why, 15),
                                  seconds=time.monotonic() - start)
        digest = next((w for w in proc.stdout.split() if w.startswith("sha256:")), "")
        pushed.append(dest)
    return StepResult(step, Verdict.OK, f"tags {', '.join(tags)}, manifest {digest}",
                      seconds=time.monotonic() - start, data={"pushed": pushed, "manifest_digest": digest})

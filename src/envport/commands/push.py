"""`envport push NAME --target apptainer|docker --to oras://HOST/REPO[:TAG]`: a built env into a registry."""

from __future__ import annotations

import re
import time
from pathlib import Path

PUSH_TARGETS = ("apptainer", "docker")
HASH_RE = re.compile(r"[0-9a-f]{64}")
NAME_RE = re.compile(r"[a-z0-9][a-z0-9-]*")


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
                       "reads the registry's CA from /etc/docker/certs.d/HOST/ca.crt). TLS: the site profile's "
                       "registry_ca, else the system's CAs. Credentials: ENVPORT_REGISTRY_USER and "
                       "ENVPORT_REGISTRY_PASSWORD, else the docker config file (never on the command line). "
                       "Exit 0 pushed, 3 refused (registry_unreachable, sif_missing, image_missing, denied, "
                       "tls_failed, sif_other_env, not_envport), 1 failed, 2 usage.")
    p.add_argument("spec", metavar="NAME|PATH")
    p.add_argument("--to", required=True, metavar="oras://HOST/REPO[:TAG]", help="the registry repository")
    p.add_argument("--target", choices=PUSH_TARGETS, default="apptainer", help="what to push (default: apptainer)")
    p.add_argument("--tag", action="append", default=[], help="one more tag (repeatable); the hash12 tag is always "
                   "pushed (a --sif FILE's: of its own envport.hash label, when it has one)")
    p.add_argument("--sif", default=None, metavar="FILE", help="apptainer: push this SIF instead of the built one, "
                   "under the hash12 of its own envport.hash label (never the spec's)")
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
    named = [*([ref.tag] if ref.tag else []), *args.tag]
    if args.target == "docker":
        result = _push_image(identity, ref, list(dict.fromkeys([identity.hash12, *named])), loaded.spec.name)
    else:
        from envport.builders.apptainer.builder import sif_path

        sif = Path(args.sif) if args.sif else sif_path(site, root, identity)
        result = _push_sif(sif, ref, named, site.registry_ca, loaded.spec.name, given=bool(args.sif))
    return report([result], args.json, command="push")


def _shown(text: str) -> str:
    """A label's value as a person should see it: escapes escaped, at most 80 characters."""
    return repr(text if len(text) <= 80 else text[:77] + "...")


def _push_sif(sif: Path, ref, named: list[str], ca, name: str, given: bool):
    """SIF pushed under the hash12 of its own envport.hash label plus the NAMED tags. A SIF of another env
    (its envport.name label) is refused; one without an envport.hash label goes under NAMED alone.  The file
    goes through the trust gate and inspect's content checks first (a damaged SIF is not published), and the
    bytes sent are read from the file the gate opened, not from the path again."""
    from envport.builders.apptainer.sif_inspect import admitted
    from envport.core.progress import transfer_progress
    from envport.core.verdict import StepResult, Verdict
    from envport.engines import registry
    from envport.sif.format import SifError, sif_labels

    step = f"push {sif.name} -> {ref}"
    checked = admitted(sif, step=step, fix="the file you named with --sif does not exist: check the path" if given
                       else f"envport build {name} --target apptainer")
    if isinstance(checked, StepResult):
        return checked
    gated, _ = checked
    try:
        labels, unreadable = sif_labels(gated.info), ""
    except SifError as exc:
        labels, unreadable = {}, exc.message
    own_name, own_hash = labels.get("envport.name"), labels.get("envport.hash")
    if own_name is not None and own_name != name:
        fix = f"envport push {own_name} --sif {sif} ..." if NAME_RE.fullmatch(own_name) else f"{name}'s own SIF"
        return StepResult(step, Verdict.REFUSED, f"{sif} is a build of {_shown(own_name)} (its envport.name "
                          f"label), not of {name}: it is not pushed under {name}'s name", reason="sif_other_env",
                          lines=[f"fix: push it as its own env ({fix}), or pass {name}'s SIF"])
    if own_hash is not None and not HASH_RE.fullmatch(own_hash):
        return StepResult(step, Verdict.REFUSED, f"{sif}: its envport.hash label {_shown(own_hash)} is not 64 "
                          "hex digits: the file is damaged or crafted; nothing was pushed", reason="not_envport",
                          lines=["fix: get the file again from its builder, or rebuild it"])
    tags = list(dict.fromkeys([*([own_hash[:12]] if own_hash else []), *named]))
    if not tags:
        why = f"it is not a readable SIF ({unreadable})" if unreadable else "it carries no envport.hash label"
        return StepResult(step, Verdict.REFUSED, f"{sif}: {why}, so it has no hash12 tag (envport never tags a "
                          "file with the spec's hash on trust): name the tag, --to oras://HOST/REPO:TAG or "
                          "--tag T", reason="not_envport")
    step = f"push {sif.name} -> {ref.with_tag(tags[0])}"
    source = f"hash12 {own_hash[:12]} from its envport.hash label" if own_hash else \
        "no hash12 tag: no envport.hash label"
    start = time.monotonic()
    try:
        layer = registry.Layer(sif.name, gated.file.size, gated.file.digest(0, gated.file.size),
                               lambda: open(gated.file.child_path, "rb"))
        out = registry.push_sif(layer, ref, tags, ca=ca, progress=transfer_progress(f"push {sif.name}"))
    except registry.RegistryError as exc:
        return StepResult(step, Verdict.REFUSED, str(exc), reason=exc.reason, seconds=time.monotonic() - start)
    return StepResult(step, Verdict.OK, f"{out['size']} bytes, layer {out['digest']}, tags {', '.join(tags)} "
                      f"({source})", seconds=time.monotonic() - start,
                      data={**out, "repository": f"{ref.host}/{ref.repo}"})


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

"""What `envport push` does for the targets that can push (the SIF as ORAS, an image by its engine).

Moved from commands/push.py: each target's `push()` calls one of these; the command asks the target.
An image pushed with `--attest` gets its build provenance as an OCI referrer of the manifest the registry holds
(`attach_provenance`: the engine and the registry are read here, the statement is sif/provenance/image.py's);
a SIF carries its statements and `push_sif` attaches them.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from envport.spec.model import SHA256_RE

NAME_RE = re.compile(r"[a-z0-9][a-z0-9-]*")


def _shown(text: str) -> str:
    """A label's value as a person should see it: escapes escaped, at most 80 characters."""
    return repr(text if len(text) <= 80 else text[:77] + "...")


def push_sif(sif: Path, ref, named: list[str], ca, name: str, given: bool):
    """SIF pushed under the hash12 of its own envport.hash label plus the NAMED tags. A SIF of another env
    (its envport.name label) is refused; one without an envport.hash label goes under NAMED alone.  The file
    goes through the trust gate and inspect's content checks first (a damaged SIF is not published), and the
    bytes sent are read from the file the gate opened, not from the path again."""
    from envport.sif.report import admitted
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
    if own_hash is not None and not SHA256_RE.fullmatch(own_hash):
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
    try:
        referrers = _attach_statements(gated.info, ref.with_tag(tags[0]), ca)
    except registry.RegistryError as exc:
        return StepResult(step, Verdict.REFUSED, f"the SIF was pushed ({out['digest']}), its in-toto statements "
                          f"were not attached as referrers: {exc}", reason=exc.reason,
                          seconds=time.monotonic() - start, data=out)
    attached = f"; {len(referrers)} in-toto statement(s) attached as OCI referrers" if referrers else ""
    return StepResult(step, Verdict.PRESENT if out["present"] and not referrers else Verdict.OK,
                      f"{out['size']} bytes, layer {out['digest']}, tags {', '.join(tags)} ({source}){_sent(out)}"
                      f"{attached}", seconds=time.monotonic() - start,
                      data={**out, "repository": f"{ref.host}/{ref.repo}", "referrers": referrers})


def _attach_statements(info, ref, ca) -> list[str]:
    """The SIF's in-toto statements (sif/provenance/store.py) pushed as OCI referrers of its manifest at REF
    (engines/referrers.py); their manifest digests. A statement that does not decode is not published."""
    from envport.engines.referrers import push_statements
    from envport.sif.provenance.envelope import open_envelope
    from envport.sif.provenance.statement import BadStatement
    from envport.sif.provenance.store import read_statement_object, statement_objects

    statements = []
    for d in statement_objects(info):
        data = read_statement_object(info, d)
        try:
            statements.append((data, str(open_envelope(data)[1]["predicateType"])))
        except BadStatement:
            continue
    return push_statements(ref, statements, ca=ca) if statements else []


def _sent(out: dict) -> str:
    """What a push sent, as the registry's answers showed it (engines/registry.py `push_sif`): nothing, only
    some tags, or the layer too."""
    if out["present"]:
        return ("; already in the registry (the registry has the layer, and its manifest under every tag names "
                "this layer's sha256): nothing was sent")
    if not out["layer_sent"]:
        return f"; the layer was already there, not sent again: tagged {', '.join(out['tags_sent'])}"
    return ""


@dataclass(frozen=True)
class ImageEngine:
    """How one image target's engine is asked: its CLI, that CLI's environment, whether it holds a tag."""

    target: str  # the target's name, for the fix line
    cli: str  # the binary: docker, podman
    env: dict
    has_image: Callable[[str], bool]
    push_args: Callable[[str], list[str]] = lambda host: []  # TLS/auth options of `CLI push` for a registry HOST
    read_digest: Callable[[], str] = lambda: ""  # the manifest digest, where the CLI writes it to a file


def push_image(engine: ImageEngine, req, tags: list[str], target):
    """The image envport/<name>:<hash12> of REQ (targets/base.py PushRequest) tagged HOST/REPO:TAG for each of
    TAGS and pushed by ENGINE; with REQ.attest, its build provenance attached as a referrer
    (`attach_provenance`)."""
    from envport.core.verdict import StepResult, Verdict
    from envport.core.proc import run as proc_run
    from envport.core.progress import tail
    from envport.engines import registry

    identity, ref, name = req.identity, req.ref, req.loaded.spec.name
    step = f"push {identity.image_tag} -> {ref.with_tag(tags[0])}"
    if not engine.has_image(identity.image_tag):
        return StepResult(step, Verdict.REFUSED, f"the {engine.cli} engine has no image {identity.image_tag}",
                          reason="image_missing", lines=[f"fix: envport build {name} --target {engine.target}"])
    start = time.monotonic()
    try:
        registry.reachable(ref.host)
    except registry.RegistryError as exc:
        return StepResult(step, Verdict.REFUSED, str(exc), reason=exc.reason)
    pushed = []
    for tag in tags:
        dest = str(ref.with_tag(tag))
        for argv in ([engine.cli, "tag", identity.image_tag, dest],
                     [engine.cli, "push", *engine.push_args(ref.host), dest]):
            proc = proc_run(argv, env=engine.env, timeout=1800)
            if not proc.ok:
                return StepResult(step, Verdict.FAILED, f"`{' '.join(argv)}` exited {proc.returncode}",
                                  lines=tail(proc.stderr or proc.stdout or proc.why, 15),
                                  seconds=time.monotonic() - start)
        digest = next((w for w in proc.stdout.split() if w.startswith("sha256:")), "") or engine.read_digest()
        pushed.append(dest)
    data = {"pushed": pushed, "manifest_digest": digest}
    if req.attest is None:
        return StepResult(step, Verdict.OK, f"tags {', '.join(tags)}, manifest {digest}",
                          seconds=time.monotonic() - start, data=data)
    return _attested(step, engine, req, target, ref.with_tag(tags[0]), tags, data, start)


def _attested(step: str, engine: ImageEngine, req, target, ref, tags: list[str], data: dict, start: float):
    """The push's result once the image's build provenance is attached at REF (its hash12 tag), or why not."""
    from envport.core.verdict import StepResult, Verdict
    from envport.engines.registry import RegistryError
    from envport.sif.provenance.statement import BadStatement

    try:
        attached = attach_provenance(engine, req, target, ref, data["manifest_digest"])
    except BadStatement as exc:  # envport's own statement did not validate: a bug, said as one
        return StepResult(step, Verdict.FAILED, f"the image was pushed (manifest {data['manifest_digest'] or '?'}), "
                          f"its build provenance is not a valid statement: {exc}", seconds=time.monotonic() - start,
                          data=data)
    except RegistryError as exc:
        return StepResult(step, Verdict.REFUSED, f"the image was pushed (manifest {data['manifest_digest'] or '?'}), "
                          f"its build provenance was not attached as a referrer: {exc}", reason=exc.reason,
                          seconds=time.monotonic() - start, data=data)
    return StepResult(step, Verdict.OK, f"tags {', '.join(tags)}, manifest {attached['manifest_digest']} "
                      f"({attached['manifest_media_type']}); 1 in-toto statement attached as an OCI referrer",
                      seconds=time.monotonic() - start, data={**data, **attached})


def engine_image(engine: ImageEngine, ref: str):
    """REF as ENGINE holds it (sif/provenance/image.py EngineImage: id, layers), or None when it has none."""
    from envport.core.proc import run as proc_run
    from envport.sif.provenance.image import EngineImage

    proc = proc_run([engine.cli, "image", "inspect", "--format", "{{.Id}}\t{{json .RootFS.Layers}}", ref],
                    env=engine.env, timeout=60)
    if not proc.ok:
        return None
    image_id, _, layers = proc.stdout.strip().partition("\t")
    # podman writes the id without its algorithm; docker with it.
    return EngineImage(image_id if image_id.startswith("sha256:") else f"sha256:{image_id}",
                       tuple(json.loads(layers or "null") or ()))


def attach_provenance(engine: ImageEngine, req, target, ref, cli_digest: str) -> dict:
    """Sign the SLSA provenance of REQ's image (pushed by ENGINE for TARGET) about the manifest the registry
    holds at REF, checked to be that image (sif/provenance/image.py), and attach it as a referrer; {manifest_digest,
    manifest_media_type, referrers, base, times}. RegistryError as the push's own: `digest_mismatch` when the
    registry's manifest is another image's (nothing attached)."""
    from envport.builders.spec_object import spec_object
    from envport.engines.referrers import push_statements, subject_media_type
    from envport.engines.registry import Client, RegistryError
    from envport.plan.steps import BaseStep
    from envport.recipe.identity import resolve
    from envport.sif.provenance.image import base_source, manifest_mismatch, statement_envelope
    from envport.sif.provenance.slsa import facts_from_embedded
    from envport.sif.provenance.statement import SLSA_PROVENANCE

    image = engine_image(engine, req.identity.image_tag)
    if image is None:
        raise RegistryError("image_missing", f"the {engine.cli} engine no longer has {req.identity.image_tag}: no "
                            "statement was attached; build it again and push")
    resolved = resolve(req.loaded, req.site, target)
    base = next(s.image for s in resolved.plan.steps if isinstance(s, BaseStep))
    source = base_source(target.name, base, engine_image(engine, base), image)
    facts = facts_from_embedded(spec_object(req.loaded, resolved, req.site.name, source), target=target.name,
                                started=req.attest.started, finished=req.attest.finished)
    manifest = Client(ref.host, req.site.registry_ca).manifest_bytes(ref)
    mismatch = manifest_mismatch(manifest, image, cli_digest)
    if mismatch:
        raise RegistryError("digest_mismatch", f"{ref}: {mismatch}; no statement was attached: push again")
    envelope = statement_envelope(facts, f"{ref.host}/{ref.repo}", manifest, req.attest.signers)
    referrers = push_statements(ref, [(envelope, SLSA_PROVENANCE)], ca=req.site.registry_ca,
                                subject_manifest=manifest)
    return {"manifest_digest": f"sha256:{hashlib.sha256(manifest).hexdigest()}",
            "manifest_media_type": subject_media_type(manifest), "referrers": referrers, "base": source,
            "times": "the ledger's build record" if req.attest.finished else "none (no build record here)"}

"""What `envport sbom NAME` reads for each target that has one: a SIF's partition, a docker image's files
(only those the SBOM reads: sif/sbom.py image_sbom), a podman image's (its export streamed, only those files
written: from_image), a venv in place.  Moved from commands/sbom.py: each target's `sbom()` calls one of these.
"""

from __future__ import annotations

from pathlib import Path


def from_sif(path: Path, lock, fmt: str, from_content: bool = False):
    """The SBOM of the SIF at PATH: the CycloneDX object the SIF carries, read without mounting anything (its
    builder's, with whether a verified signature covers it), or with FROM_CONTENT (or for SPDX, or a SIF that
    carries none) read from its partition, mounted or extracted."""
    from envport.sif.report import admitted
    from envport.core.verdict import StepResult, Verdict
    from envport.sif.format import SifError
    from envport.sif.run import MountError
    from envport.sif import sbom

    step = f"sbom {path.name}"
    # The gate and inspect's content checks first: an SBOM of a damaged or tampered file is no SBOM of it.
    checked = admitted(path, step=step, fix="the file you named does not exist: check the path")
    if isinstance(checked, StepResult):
        return checked, None
    gated, _ = checked
    carried = None if from_content or fmt != "cyclonedx" else carried_sbom(gated, step)
    if carried is not None:
        return carried
    try:
        text, packages = sbom.sif_sbom(gated, sbom.sif_facts(gated.info, lock), fmt)
    except SifError as exc:
        return StepResult(step, Verdict.FAILED, str(exc), reason=exc.reason), None
    except MountError as exc:
        fix = sbom.mount_fix("the partition is no squashfs they can read (their words above): the file is "
                             "damaged, or not the SIF it claims to be")
        return StepResult(step, Verdict.REFUSED, str(exc), reason=exc.reason, lines=[f"fix: {fix}"]), None
    return _described(step, packages, fmt), text


def carried_sbom(gated, step: str):
    """(verdict, text) of the one CycloneDX SBOM object GATED carries, read from the open file (no mount), or
    None where it carries none, several, or one that is no CycloneDX JSON (the content route decides then)."""
    import json

    from envport.core.verdict import StepResult, Verdict
    from envport.sif import sbom
    from envport.sif.format import SifError, read_object

    objects = [d for d in gated.info.descriptors if d.datatype == sbom.SBOM_DATATYPE]
    if len(objects) != 1:
        return None
    (obj,) = objects
    try:
        text = read_object(gated.info, obj).decode("utf-8")
        bom = json.loads(text)
    except (SifError, UnicodeDecodeError, ValueError):
        return None
    if not isinstance(bom, dict) or bom.get("bomFormat") != "CycloneDX":
        return None
    count = len(bom.get("components") or [])
    detail = (f"the SIF's own SBOM object {obj.name or obj.id} (CycloneDX {bom.get('specVersion', '?')}, {count} "
              f"components), read without mounting anything; {_coverage(gated, obj)}")
    return StepResult(step, Verdict.OK, detail, data={"source": "sif object", "object": obj.id}), \
        text if text.endswith("\n") else text + "\n"


def _coverage(gated, obj) -> str:
    """Whether a signature verified against the site's trust.keys covers the SBOM object OBJ of GATED."""
    from pathlib import Path

    from envport.plan.site import active_trust
    from envport.sif.gate import VERIFIED, judge_signatures

    keys = active_trust().keys
    if keys:
        verdict, _, signed = judge_signatures(gated.info, keys)
        if verdict == VERIFIED and obj.id in signed:
            return "covered by a signature verified against " + ", ".join(Path(k).name for k in keys)
    return ("no signature verified against the site's trust.keys covers it: its builder's word, not checked "
            "(--from-content reads the partition itself)")


def from_venv(loaded, identity, lock, fmt: str):
    from envport.core import layout
    from envport.sif import sbom

    prefix = layout.env_prefix(loaded.spec.name)
    step = f"sbom {identity.ref} (venv)"
    try:
        recorded = (prefix / ".envport" / "hash").read_text().strip()
    except OSError:
        return missing(step, f"no env at {prefix}", "env_missing",
                        f"envport build {loaded.spec.name} --target venv"), None
    if recorded != identity.hash:
        return missing(step, f"the env at {prefix} was built as {recorded[:12]}, the spec now resolves to "
                        f"{identity.hash12}", "stale", f"envport build {loaded.spec.name} --target venv"), None
    created = sbom.timestamp((prefix / "pyvenv.cfg").stat().st_mtime)
    facts = sbom.EnvFacts(loaded.spec.name, identity.hash, "venv", lock=lock, created=created, container=False)
    return _written(step, prefix, facts, fmt, venv=())


def from_docker_image(loaded, identity, lock, fmt: str):
    from datetime import datetime

    from envport.core.verdict import StepResult, Verdict
    from envport.engines.docker import ExportError, connect, get_image
    from envport.sif import sbom

    step = f"sbom {identity.image_tag}"
    client, refused = connect(step)
    if refused is not None:
        return refused, None
    image = get_image(client, identity.image_tag)
    if image is None:
        return missing(step, f"the engine has no image {identity.image_tag}", "image_missing",
                        f"envport build {loaded.spec.name} --target docker"), None
    created = datetime.fromisoformat(image.attrs["Created"][:19] + "+00:00")
    facts = facts_of(loaded, identity, "docker", lock, created)
    try:
        # Only the files the SBOM reads, as the builder read them (sif/sbom.py image_sbom), not the whole tree.
        text, packages, _ = sbom.image_sbom(image.id, facts, fmt, graph=image.attrs.get("GraphDriver"))
    except ExportError as exc:
        return StepResult(step, Verdict.FAILED, str(exc)), None
    return _described(step, packages, fmt), text


def facts_of(loaded, identity, target: str, lock, created):
    from envport.sif import sbom

    return sbom.EnvFacts(loaded.spec.name, identity.hash, target, lock=lock, created=created)


def from_image(step: str, identity, client: str, env: dict, facts, fmt: str):
    """The SBOM of the image IDENTITY.image_tag at the cost of what it reads: `CLIENT export` of a container
    created and never started (CLIENT podman or docker, ENV its environment) streamed, and only the files the
    SBOM reads written to a private tmp dir (engines/docker.py export_files: docker's streamed route, `needed`).
    The same SBOM as of the whole exported filesystem."""
    from envport.engines.docker import ExportError, image_files
    from envport.sif import sbom

    try:
        # graph={}: CLIENT's layers are not the docker engine's overlay2 mounts, so the export is streamed.
        with image_files(identity.image_tag, sbom.needed(sbom.CONTAINER_VENV), graph={}, docker=client,
                         env=env) as (tree, _):
            return _written(step, tree, facts, fmt)
    except ExportError as exc:
        from envport.core.verdict import StepResult, Verdict
        return StepResult(step, Verdict.FAILED, str(exc)), None


def from_built_sif(req, sif_path: Path):
    """The SBOM of the SIF a build of REQ's env made at SIF_PATH (the lock known from the spec's side)."""
    if not sif_path.is_file():
        return missing(f"sbom {req.identity.ref}", f"no SIF at {sif_path}", "sif_missing",
                        f"envport build {req.loaded.spec.name} --target apptainer"), None
    return from_sif(sif_path, req.lock, req.fmt)


def missing(step: str, detail: str, reason: str, fix: str):
    from envport.core.verdict import StepResult, Verdict
    return StepResult(step, Verdict.REFUSED, detail, reason=reason, lines=[f"fix: {fix}"])


def _written(step: str, tree: Path, facts, fmt: str, venv=None):
    from envport.sif import sbom

    text, packages = sbom.make_sbom(tree, facts, sbom.CONTAINER_VENV if venv is None else venv, fmt)
    return _described(step, packages, fmt), text


def _described(step: str, packages, fmt: str):
    from envport.core.verdict import StepResult, Verdict

    debs = sum(p.kind == "deb" for p in packages)
    return StepResult(step, Verdict.OK, f"{debs} Debian packages, {len(packages) - debs} Python distributions "
                      f"({'SPDX 2.3, validated by spdx-tools' if fmt == 'spdx' else 'CycloneDX 1.6, schema-valid'})")

"""The SLSA provenance v1 predicate of a build (https://slsa.dev/spec/v1.0/provenance).

What it records, all of it known to the build: `buildDefinition.externalParameters` the resolved spec, its
content hash and the site; `resolvedDependencies` the base image (with its digest) and every dist of the lock with
its file's sha256 (the lock pins files by hash, so a verifier can fetch and recompute each); `runDetails.builder` envport
with its version and renderer version; `runDetails.metadata` the build's start and finish. Validated
against the in-toto-attestation library's protobuf Provenance (field names and types).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Optional

from envport.sif.provenance.statement import BadStatement

# envport-spec.json's base: "docker-daemon IMAGE (sha256:HEX)" or a rootfs source with its digest.
_BASE_DIGEST = re.compile(r"\(sha256:([0-9a-f]{64})\)")

BUILD_TYPE = "https://envport.dev/build/v1"
BUILDER_ID = "https://envport.dev/builder/envport"


@dataclass(frozen=True)
class BuildFacts:
    """What a build was, in words a verifier can check: the pure input of `predicate`."""

    spec: dict  # the resolved spec (pydantic's JSON dump)
    spec_hash: str  # envport's content hash of spec + site + renderer
    site: str
    target: str  # apptainer, docker, podman, venv
    base: str  # the base image reference the recipe starts from
    wheels: tuple[tuple[str, str, str], ...]  # (name==version, purl, sha256 of its file) of every locked dist
    envport_version: str
    renderer_version: str
    started: Optional[datetime] = None
    finished: Optional[datetime] = None


def rfc3339(when: datetime) -> str:
    return when.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _base(ref: str) -> dict:
    out = {"name": "base", "uri": f"docker://{ref}"}
    if "@sha256:" in ref:
        out["digest"] = {"sha256": ref.rsplit("@sha256:", 1)[1]}
    return out


def predicate(facts: BuildFacts) -> dict:
    deps = [_base(facts.base)] + [{"name": file, "uri": purl, "digest": {"sha256": sha}}
                                   for file, purl, sha in facts.wheels]
    metadata = {"invocationId": f"{facts.spec_hash}/{facts.target}"}
    if facts.started:
        metadata["startedOn"] = rfc3339(facts.started)
    if facts.finished:
        metadata["finishedOn"] = rfc3339(facts.finished)
    doc = {
        "buildDefinition": {
            "buildType": BUILD_TYPE,
            "externalParameters": {"spec": facts.spec, "specHash": facts.spec_hash, "site": facts.site},
            "internalParameters": {"target": facts.target},
            "resolvedDependencies": deps,
        },
        "runDetails": {
            "builder": {"id": BUILDER_ID, "version": {"envport": facts.envport_version,
                                                      "renderer": facts.renderer_version}},
            "metadata": metadata,
        },
    }
    validate(doc)
    return doc


def validate(doc) -> None:
    """DOC is a SLSA provenance v1 predicate (the library's protobuf shape, and the fields the spec
    requires: buildType, externalParameters, builder.id), else BadStatement."""
    from google.protobuf import json_format
    from in_toto_attestation.predicates.provenance.v1 import provenance_pb2

    try:
        json_format.ParseDict(doc, provenance_pb2.Provenance())
    except (json_format.ParseError, TypeError) as exc:
        raise BadStatement(f"not a SLSA provenance v1 predicate: {exc}") from None
    bd, rd = doc.get("buildDefinition") or {}, doc.get("runDetails") or {}
    missing = [name for name, ok in (("buildDefinition.buildType", bd.get("buildType")),
                                     ("buildDefinition.externalParameters", "externalParameters" in bd),
                                     ("runDetails.builder.id", (rd.get("builder") or {}).get("id")))
               if not ok]
    if missing:
        raise BadStatement(f"not a SLSA provenance v1 predicate: {', '.join(missing)} required")


def facts_from_embedded(doc: dict, target: str = "apptainer", started=None, finished=None) -> BuildFacts:
    """The BuildFacts of a SIF envport built, from the spec object it embeds (envport-spec.json: the resolved
    spec, its hash, the site, the base with its digest, the locked dists with their sha256), which its
    builder wrote from the same plan it built. KeyError/TypeError when DOC is not such an object."""
    from envport.renderers import RENDERER_VERSION

    base = str(doc["base"])
    m = _BASE_DIGEST.search(base)
    base_ref = base.split()[1] if len(base.split()) > 1 else base
    if m:
        base_ref = f"{base_ref}@sha256:{m.group(1)}"
    wheels = {}
    for phase in doc.get("lock") or []:
        for name, version, sha in phase["dists"]:
            wheels[f"{name}=={version}"] = (f"{name}=={version}", f"pkg:pypi/{name}@{version}", str(sha))
    return BuildFacts(dict(doc["spec"]), str(doc["hash"]), str(doc.get("site") or "local"), target, base_ref,
                      tuple(wheels[k] for k in sorted(wheels)), str(doc.get("envport_version") or ""),
                      str(RENDERER_VERSION), started, finished)

"""The build provenance of a pushed docker or podman image: what its statement says, as pure functions.

The statement is a SLSA provenance v1 about the manifest the registry holds under the image's hash12 tag
(subject: HOST/REPO by the manifest's sha256), made from the same spec object a SIF embeds
(builders/spec_object.py) through `facts_from_embedded`, so a SIF's provenance and an image's say the same
things in the same words. targets/push.py reads the engine and the registry and attaches it as a referrer.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Optional


@dataclass(frozen=True)
class ImageAttest:
    """What `push --attest` hands an image target: the keys (sif/keys.py PrivateKeys) and the build's times
    as this machine's ledger recorded them (None: not recorded here, and left out of the statement)."""

    signers: tuple
    started: Optional[datetime] = None
    finished: Optional[datetime] = None


@dataclass(frozen=True)
class EngineImage:
    """An image as its engine holds it: the id (its config's sha256) and its layers' diff ids, base first."""

    id: str
    layers: tuple[str, ...]


def base_source(kind: str, base: str, base_image: Optional[EngineImage], image: EngineImage) -> str:
    """The spec object's base: "KIND BASE (sha256:ID)" when BASE_IMAGE's layers begin IMAGE's, else "KIND BASE".
    The base may have been re-tagged since the build: then it is named without a digest, never a guessed one."""
    if base_image is not None and base_image.layers and image.layers[:len(base_image.layers)] == base_image.layers:
        return f"{kind} {base} ({base_image.id})"
    return f"{kind} {base}"


def manifest_mismatch(manifest: bytes, image: EngineImage, cli_digest: str) -> Optional[str]:
    """Why MANIFEST (the registry's, under the pushed tag) is not IMAGE as the engine pushed it (its config is
    not the image's id, or its digest is not CLI_DIGEST, the one the engine printed, when it printed one);
    None when it is."""
    digest = f"sha256:{hashlib.sha256(manifest).hexdigest()}"
    try:
        config = json.loads(manifest).get("config", {}).get("digest")
    except (ValueError, AttributeError, RecursionError):
        config = None
    if (cli_digest and cli_digest != digest) or config != image.id:
        return (f"the registry holds manifest {digest} (config {config}), not the image the engine pushed "
                f"(manifest {cli_digest or 'not printed'}, image {image.id}): another push took the tag")
    return None


def statement_envelope(facts, repository: str, manifest: bytes, signers) -> bytes:
    """The DSSE envelope of the SLSA provenance of FACTS (slsa.py BuildFacts) about MANIFEST (by its sha256)
    in REPOSITORY (HOST/REPO), signed by SIGNERS."""
    from envport.sif.provenance.envelope import seal
    from envport.sif.provenance.slsa import predicate
    from envport.sif.provenance.statement import SLSA_PROVENANCE, statement, subject

    doc = statement([subject(repository, hashlib.sha256(manifest).hexdigest())], SLSA_PROVENANCE, predicate(facts))
    return seal(doc, signers)

"""In-toto statements as OCI referrers of a pushed SIF or image (the OCI distribution spec 1.1's referrers).

Each statement (a DSSE envelope, sif/provenance/) becomes one artifact manifest in the subject's repository:
`artifactType` application/vnd.in-toto+json, the empty config (`{}`, application/vnd.oci.empty.v1+json),
one layer holding the envelope (application/vnd.dsse.envelope.v1+json, annotated with its predicate type),
and `subject` = the SIF's or image's manifest, with the media type the registry holds it under (an image
docker pushed is a Docker v2 schema-2 manifest). A registry with the referrers API
(`GET /v2/REPO/referrers/DIGEST`) lists them itself; for one without it (CNCF distribution 2.8, Debian's
docker-registry) the spec's fallback is kept too: an image index under the tag `sha256-<hex of the subject
digest>` listing every referrer, which is what `oras discover` reads there. Pushing the same statement twice
writes the same manifest (same digest) and lists it once.
"""

from __future__ import annotations

import hashlib
import json
from typing import Optional

from envport.engines.registry import IDLE_S, OCI_MANIFEST, Client, Ref, RegistryError

INTOTO = "application/vnd.in-toto+json"
DSSE_LAYER = "application/vnd.dsse.envelope.v1+json"
EMPTY_MEDIA_TYPE = "application/vnd.oci.empty.v1+json"
EMPTY = b"{}"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
PREDICATE_ANNOTATION = "in-toto.io/predicate-type"
MAX_STATEMENT_BYTES = 1 << 20  # as a SIF's statement object (sif/dsse.py MAX_ENVELOPE_BYTES)


def descriptor(media_type: str, data: bytes, **extra) -> dict:
    return {"mediaType": media_type, "digest": f"sha256:{hashlib.sha256(data).hexdigest()}", "size": len(data),
            **extra}


def canonical(doc: dict) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def referrer_manifest(subject: dict, envelope: bytes, predicate_type: str) -> bytes:
    """The artifact manifest of one statement about SUBJECT (the SIF manifest's descriptor); deterministic."""
    layer = descriptor(DSSE_LAYER, envelope, annotations={PREDICATE_ANNOTATION: predicate_type})
    return canonical({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": INTOTO,
                      "config": descriptor(EMPTY_MEDIA_TYPE, EMPTY), "layers": [layer], "subject": subject})


def fallback_tag(digest: str) -> str:
    return digest.replace(":", "-")


def _url(client: Client, ref: Ref, kind: str, reference: str) -> str:
    return f"{client.registry.prefix}://{ref.host}/v2/{ref.repo}/{kind}/{reference}"


def _get(client: Client, ref: Ref, url: str, accept: str, what: str, limit: int = MAX_STATEMENT_BYTES) -> bytes:
    too_big = RegistryError("registry_error", f"{ref}: the {what} is over {limit} bytes: not read")
    with client.errors(ref, f"reading the {what} of"):
        return b"".join(client.fetch(ref, url, accept, what, IDLE_S, limit=limit, too_big=too_big))


def _put_manifest(client: Client, ref: Ref, reference: str, data: bytes, media_type: str) -> None:
    headers = {"Content-Type": media_type}
    if client.credentials:
        headers.update(client.registry.auth.get_auth_header())
    r = client.registry.session.put(_url(client, ref, "manifests", reference), data=data, headers=headers,
                                    verify=client.ca or True)
    if r.status_code not in (200, 201):
        raise ValueError(f"writing manifest {reference}: {r.status_code} {r.reason} {r.text[:300]}")


def _listed(client: Client, ref: Ref, subject_digest: str) -> Optional[list]:
    """The referrers the registry's API lists for SUBJECT_DIGEST, or None where it has no such API."""
    try:
        data = _get(client, ref, _url(client, ref, "referrers", subject_digest), OCI_INDEX, "referrers")
    except RegistryError as exc:
        if exc.reason == "not_found":
            return None
        raise
    return list(json.loads(data).get("manifests") or [])


def _fallback_index(client: Client, ref: Ref, subject_digest: str) -> list:
    try:
        data = _get(client, ref, _url(client, ref, "manifests", fallback_tag(subject_digest)), OCI_INDEX,
                    "referrers index")
    except RegistryError as exc:
        if exc.reason == "not_found":
            return []
        raise
    return list(json.loads(data).get("manifests") or [])


def subject_media_type(manifest: bytes) -> str:
    """The media type of the manifest MANIFEST (bytes as the registry serves them): its own `mediaType`, which
    a Docker v2 schema-2 manifest (docker push) and an OCI one (apptainer, podman) both carry; a manifest
    without one is OCI's, where the field is optional. A referrer's `subject` must name the type the
    registry holds, not the one a pusher assumes."""
    try:
        doc = json.loads(manifest)
    except (ValueError, RecursionError):
        raise RegistryError("registry_error", "the registry's manifest is not JSON: no statement can name it as "
                            "its subject") from None
    media_type = doc.get("mediaType") if isinstance(doc, dict) else None
    return media_type if isinstance(media_type, str) and media_type else OCI_MANIFEST


def push_statements(ref: Ref, statements: list[tuple[bytes, str]], *, ca: Optional[str] = None,
                    insecure: bool = False, subject_manifest: Optional[bytes] = None) -> list[str]:
    """Attach each (DSSE envelope, predicate type) of STATEMENTS to the manifest REF names (a SIF's or an
    image's); the referrer manifests' digests. SUBJECT_MANIFEST: that manifest's bytes as the caller already
    read them from the registry (the statements name its digest), else read here. RegistryError as the
    push's own."""
    client = Client(ref.host, ca, insecure)
    subject_bytes = client.manifest_bytes(ref) if subject_manifest is None else subject_manifest
    subject = descriptor(subject_media_type(subject_bytes), subject_bytes)
    container = client.container(ref)
    added = []
    with client.errors(ref, "attaching statements to"):
        client.put_blob(container, descriptor(EMPTY_MEDIA_TYPE, EMPTY), lambda: _bytes(EMPTY))
        for envelope, predicate_type in statements:
            client.put_blob(container, descriptor(DSSE_LAYER, envelope), lambda e=envelope: _bytes(e))
            manifest = referrer_manifest(subject, envelope, predicate_type)
            entry = descriptor(OCI_MANIFEST, manifest, artifactType=INTOTO,
                               annotations={PREDICATE_ANNOTATION: predicate_type})
            _put_manifest(client, ref, entry["digest"], manifest, OCI_MANIFEST)
            added.append(entry)
    if added and _listed(client, ref, subject["digest"]) is None:
        known = _fallback_index(client, ref, subject["digest"])
        have = {m.get("digest") for m in known}
        index = {"schemaVersion": 2, "mediaType": OCI_INDEX,
                 "manifests": known + [e for e in added if e["digest"] not in have]}
        with client.errors(ref, "listing statements of"):
            _put_manifest(client, ref, fallback_tag(subject["digest"]), canonical(index), OCI_INDEX)
    return [e["digest"] for e in added]


def fetch_statements(ref: Ref, *, ca: Optional[str] = None, insecure: bool = False) -> list[bytes]:
    """The DSSE envelopes of every in-toto referrer of the SIF manifest REF names (the referrers API, else the
    fallback tag), as the registry holds them: judged by whoever reads them (sif/provenance/judge.py)."""
    client = Client(ref.host, ca, insecure)
    subject_digest = descriptor(OCI_MANIFEST, client.manifest_bytes(ref))["digest"]
    listed = _listed(client, ref, subject_digest)
    listed = _fallback_index(client, ref, subject_digest) if listed is None else listed
    out = []
    for entry in listed:
        if entry.get("artifactType") != INTOTO:
            continue
        manifest = json.loads(_get(client, ref, _url(client, ref, "manifests", entry["digest"]), OCI_MANIFEST,
                                   "statement manifest"))
        for layer in manifest.get("layers") or []:
            if layer.get("mediaType") == DSSE_LAYER:
                out.append(_get(client, ref, _url(client, ref, "blobs", layer["digest"]), DSSE_LAYER, "statement"))
    return out


def _bytes(data: bytes):
    import io

    return io.BytesIO(data)

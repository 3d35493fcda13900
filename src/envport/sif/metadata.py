"""The image metadata a SIF signature signs: digests of the header, of each descriptor and of each object.

apptainer/sif `pkg/integrity/metadata.go` defines it (its source has the
byte layout): compact JSON
`{"version":1,"header":{"digest":"sha256:…"},"objects":[{"relativeId":N,"descriptorDigest":…,"objectDigest":…}]}`.
Only the fields that say what the image IS enter a digest: the header's launch
script, magic, version and uuid (not its times, counts or offsets, which every
later append rewrites) and a descriptor's type, link, size, ctime, uid, gid, name
and Extra (not its ID, group, offset or mtime). So a signature appended later
leaves an earlier one valid, and any change of what runs breaks it.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass

from envport.sif.image import RawDescriptor, RawImage

# Hash names as the digests spell them (Go's crypto.Hash names in metadata.go).
HASHES = ("sha1", "sha224", "sha256", "sha384", "sha512")
# The descriptor's hash-type code (sif `Hashtype`), by name; 4/5 are BLAKE2s/BLAKE2b, which sif's
# integrity package does not sign with.
HASH_CODES = {"sha256": 1, "sha384": 2, "sha512": 3}
HASH_NAMES = {code: name for name, code in HASH_CODES.items()} | {4: "blake2s", 5: "blake2b"}

SIGNED_DESCRIPTOR = struct.Struct("<i?IIqqqq128s384s")  # 557 bytes


def header_bytes(image: RawImage) -> bytes:
    """launch[32] ‖ magic[10] ‖ version[3] ‖ uuid[16]: the 61 header bytes a signature covers."""
    h = image.header
    return h["launch"] + h["magic"] + h["version"] + h["uuid"]


def descriptor_bytes(d: RawDescriptor, relative_id: int) -> bytes:
    return SIGNED_DESCRIPTOR.pack(d.datatype, d.used, relative_id, d.link, d.size, d.ctime, d.uid, d.gid,
                                  d.name, d.extra)


def object_digest(image: RawImage, d: RawDescriptor, hash_name: str) -> str:
    """The digest of the object's bytes [offset, offset+size), read in chunks from the image's open file (a
    partition is GBs: the file keeps each digest, so the content check does not hash it again)."""
    return f"{hash_name}:{image.file.digest(d.offset, d.size, hash_name)}"


def digest(data: bytes, hash_name: str) -> str:
    return f"{hash_name}:{hashlib.new(hash_name, data).hexdigest()}"


def image_metadata(image: RawImage, objects: list[RawDescriptor], hash_name: str = "sha256") -> bytes:
    """The payload a signature over OBJECTS (one group, sorted by ID) carries, byte for byte as sif writes it."""
    base = min(d.id for d in objects)
    doc = {"version": 1, "header": {"digest": digest(header_bytes(image), hash_name)},
           "objects": [{"relativeId": d.id - base,
                        "descriptorDigest": digest(descriptor_bytes(d, d.id - base), hash_name),
                        "objectDigest": object_digest(image, d, hash_name)} for d in objects]}
    return json.dumps(doc, separators=(",", ":")).encode()


@dataclass(frozen=True)
class Mismatch:
    """What differs between a verified payload and the file: `what` is header / descriptor / object / set."""

    what: str
    object_id: int | None
    message: str


class BadPayload(ValueError):
    """A payload that is not sif image metadata (the signature verified, but over something else)."""


def _parse_digest(value, field: str) -> tuple[str, str]:
    name, sep, hexval = str(value).partition(":")
    if not sep or name not in HASHES:
        raise BadPayload(f"{field}: digest {value!r} is not <{'|'.join(HASHES)}>:<hex>")
    return name, hexval.lower()


def compare(image: RawImage, objects: list[RawDescriptor], payload: bytes) -> list[Mismatch]:
    """Every difference between the signed PAYLOAD and the file's header and OBJECTS (what the signature covers
    now); empty when the file is as it was signed. Each digest's own prefix says its hash, as sif reads it."""
    try:
        doc = json.loads(payload)
        header_digest = _parse_digest(doc["header"]["digest"], "header.digest")
        signed = {int(o["relativeId"]): o for o in doc["objects"]}
    except (ValueError, KeyError, TypeError) as exc:
        raise BadPayload(f"the signed payload is not SIF image metadata ({exc})") from None
    out = []
    name, value = header_digest
    if digest(header_bytes(image), name) != f"{name}:{value}":
        out.append(Mismatch("header", None, "the global header changed (launch script, magic, version or uuid)"))
    base = min((d.id for d in objects), default=1)
    present = {d.id - base: d for d in objects}
    for rel in sorted(set(present) - set(signed)):
        d = present[rel]
        out.append(Mismatch("set", d.id, f"object {d.id} ({d.kind}) is in the group but not signed: "
                                         "added after signing"))
    for rel in sorted(set(signed) - set(present)):
        out.append(Mismatch("set", base + rel, f"signed object {base + rel} is no longer in the group"))
    for rel in sorted(set(signed) & set(present)):
        d, o = present[rel], signed[rel]
        try:
            dname, dvalue = _parse_digest(o["descriptorDigest"], f"objects[{rel}].descriptorDigest")
            oname, ovalue = _parse_digest(o["objectDigest"], f"objects[{rel}].objectDigest")
        except KeyError as exc:
            raise BadPayload(f"the signed payload's object {rel} has no {exc}") from None
        if digest(descriptor_bytes(d, rel), dname) != f"{dname}:{dvalue}":
            out.append(Mismatch("descriptor", d.id, f"the descriptor of object {d.id} ({d.kind}) changed "
                                                    "(type, link, size, ctime, uid, gid, name or extra)"))
        if object_digest(image, d, oname) != f"{oname}:{ovalue}":
            out.append(Mismatch("object", d.id, f"the data of object {d.id} ({d.kind}, bytes "
                                                f"{d.offset}..{d.end}) changed"))
    return out

"""Sign a SIF as `apptainer sign` does: one signature object per object group, appended after everything else.

Each group (ascending) gets a DataSignature object (0x4005) in no group,
linked to the group (LinkedID 0xF0000000 | n), its Extra the hash type
(int32 LE, 1 = SHA-256) and a 256-byte entity (zeros for DSSE, the PGP primary
key's fingerprint for PGP), its data the signed image metadata of the group
(sif/metadata.py). Sign last: an object added to a group afterwards makes
apptainer's verifier fail the group ("object not signed").
"""

from __future__ import annotations

import struct
import time as _time
from dataclasses import dataclass

from envport.sif.format import DATA_SIGNATURE, GROUP_MASK, SifError
from envport.sif import dsse, keys, metadata, pgp
from envport.sif.append import append_object
from envport.sif.image import RawImage, read_raw

# Go's zero time.Time as Unix seconds: what a "deterministic" SIF (nil uuid) carries in every time field.
GO_ZERO_TIME = -62135596800
SIGNATURE_EXTRA = struct.Struct("<i256s")
HASH = "sha256"


@dataclass(frozen=True)
class Signed:
    group: int
    object_id: int  # the new signature object
    form: str  # dsse | pgp
    signer: str  # keyids (DSSE) or the PGP fingerprint
    objects: tuple[int, ...]  # what it covers

    def to_dict(self) -> dict:
        return {"group": self.group, "signature_id": self.object_id, "form": self.form, "signer": self.signer,
                "objects": list(self.objects)}


def deterministic(image: RawImage) -> bool:
    """A SIF built reproducibly (nil uuid, both header times Go's zero): sif then dates signatures the same."""
    h = image.header
    return h["uuid"] == bytes(16) and h["created"] == h["modified"] == GO_ZERO_TIME


def signable_groups(image: RawImage) -> list[int]:
    groups = sorted({d.group for d in image.descriptors if d.group and d.datatype != DATA_SIGNATURE})
    if not groups:
        raise SifError("nothing_to_sign", f"{image.path}: no object is in an object group, so there is nothing "
                                          "a signature could cover; build the SIF with envport or apptainer")
    return groups


def existing_signatures(image: RawImage, group: int) -> list[int]:
    return [d.id for d in image.descriptors if d.datatype == DATA_SIGNATURE and d.link == GROUP_MASK | group]


def sign_sif(path, signers: list[keys.PrivateKey] = (), *, pgp_key: str | None = None,
             now: int | None = None) -> list[Signed]:
    """Append one signature per group to the SIF at PATH, in place: DSSE with every key in SIGNERS in one
    envelope (their order), or PGP clear-signed with the gpg secret key PGP_KEY. Refuses a group that is
    already signed (`already_signed`): apptainer's verifier would then need every signer's key."""
    if bool(signers) == bool(pgp_key):
        raise ValueError("sign_sif: give signers (PEM keys) or pgp_key, not both or neither")
    image = read_raw(path)
    groups = signable_groups(image)
    for group in groups:
        if existing_signatures(image, group):
            ids = ", ".join(map(str, existing_signatures(image, group)))
            raise SifError("already_signed", f"{path}: object group {group} is already signed (signature object "
                                             f"{ids}); a second signer would make `apptainer verify` need both "
                                             f"keys: sign an unsigned copy, or remove it with `siftool del {ids} "
                                             f"{path}`")
    at = GO_ZERO_TIME if deterministic(image) else int(_time.time() if now is None else now)
    entity, fingerprint = bytes(256), ""
    if pgp_key:
        fingerprint = pgp.primary_fingerprint(pgp_key)
        entity = bytes.fromhex(fingerprint)
    done = []
    for group in groups:
        objects = image.in_group(group)
        payload = metadata.image_metadata(image, objects, HASH)
        if pgp_key:
            data, signer = pgp.clearsign(payload, fingerprint), fingerprint
        else:
            message = dsse.pae(dsse.PAYLOAD_TYPE, payload)
            data = dsse.encode(payload, [(k.public.keyid, keys.sign(k, message, HASH)) for k in signers])
            signer = ", ".join(k.public.keyid for k in signers)
        extra = SIGNATURE_EXTRA.pack(metadata.HASH_CODES[HASH], entity)
        new_id = append_object(image, datatype=DATA_SIGNATURE, group_word=GROUP_MASK, link=GROUP_MASK | group,
                               data=data, time=at, extra=extra)
        done.append(Signed(group, new_id, "pgp" if pgp_key else "dsse", signer, tuple(d.id for d in objects)))
        image = read_raw(path)  # the next append starts from the file as it is now
    return done

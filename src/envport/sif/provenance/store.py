"""Statements inside a SIF: one object each, outside every object group, next to the signature and SBOM.

apptainer's verifier requires every object other than a signature to be in an object group, and checks
the signatures linked to each group (sif `pkg/integrity/verify.go`). So a statement is stored as a
signature object (datatype 0x4005, in no group) LINKED TO THE PRIMARY PARTITION'S OBJECT, not to a group,
and named STATEMENT_NAME: `apptainer verify` of the groups never reads it, `envport sign`'s group
signature does not cover it (adding one later changes no signed byte: the header digest covers launch
script, magic, version and uuid only), and `siftool list` / `siftool dump ID FILE` show and print it.
sif/verify.py leaves objects so named and linked out of the image's signature verdict; judge.py reads them.
"""

from __future__ import annotations

import time as _time
from pathlib import Path

from envport.sif.format import DATA_SIGNATURE, GROUP_MASK, SifDescriptor, SifInfo, read_object
from envport.sif.dsse import MAX_ENVELOPE_BYTES

STATEMENT_NAME = "envport-statement.intoto.json"


def is_statement(d) -> bool:
    """D (a SifDescriptor or sif/image.py's RawDescriptor) is a statement object, by its descriptor alone: a
    signature object linked to one object (never a group) under STATEMENT_NAME."""
    name = d.name.split(b"\0", 1)[0].decode("utf-8", "replace") if isinstance(d.name, bytes) else d.name
    return d.datatype == DATA_SIGNATURE and d.link & GROUP_MASK != GROUP_MASK and name == STATEMENT_NAME


def statement_objects(info: SifInfo) -> list[SifDescriptor]:
    return [d for d in info.descriptors if is_statement(d)]


def read_statement_object(info: SifInfo, d: SifDescriptor) -> bytes:
    return read_object(info, d, limit=MAX_ENVELOPE_BYTES)


def append_statement(path: str | Path, envelope: bytes, partition_id: int) -> int:
    """Add ENVELOPE to the SIF at PATH as a statement object linked to object PARTITION_ID; its new ID."""
    from envport.sif.append import append_object
    from envport.sif.image import read_raw
    from envport.sif.metadata import HASH_CODES
    from envport.sif.sign import GO_ZERO_TIME, SIGNATURE_EXTRA, deterministic

    image = read_raw(path)
    at = GO_ZERO_TIME if deterministic(image) else int(_time.time())
    try:
        return append_object(image, datatype=DATA_SIGNATURE, group_word=GROUP_MASK, link=partition_id,
                             data=envelope, time=at, name=STATEMENT_NAME.encode(),
                             extra=SIGNATURE_EXTRA.pack(HASH_CODES["sha256"], bytes(256)))
    finally:
        image.file.close()

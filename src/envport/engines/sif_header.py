"""The SIF layout's constants and one stdlib-only question: "is this a whole SIF, and what is object NAME?".

engines/sif.py reads and writes SIFs with an error for people at every
fault; that costs dataclasses, platform and the error types (tens of
milliseconds of imports).  The no-op `envport build NAME --target apptainer`
(build/apptainer/present.py) must cost less than that, so the layout lives
here, with `struct` alone, and sif.py builds on it.  `generic_json` applies
the same checks as sif.read_sif (header, descriptor table, every used
descriptor inside the file) and answers None on any fault instead of saying
which: the caller then takes the full path, which says it.
"""

from __future__ import annotations

import os
import stat
import struct

LAUNCH_SCRIPT = b"#!/usr/bin/env run-singularity\n"
MAGIC = b"SIF_MAGIC\0"
VERSION = b"01\0"

HEADER = struct.Struct("<32s10s3s3s16sqqqqqqqq")
DESCRIPTOR = struct.Struct("<i?IIIqqqqqqq128s384s")
DESCRIPTORS_OFFSET = 4096
DESCRIPTOR_SLOTS = 48
DATA_OFFSET = DESCRIPTORS_OFFSET + DESCRIPTOR_SLOTS * DESCRIPTOR.size  # 32176

DATA_PARTITION = 0x4004
DATA_GENERIC_JSON = 0x4006


def table_consistent(fields: tuple) -> bool:
    """The header's descriptor-table and data fields (HEADER.unpack order) agree with each other."""
    dfree, dtotal, doff, dsize, dataoff, datasize = fields[7:13]
    return (0 < dtotal <= 1 << 16 and 0 <= dfree <= dtotal and doff >= HEADER.size
            and dsize == dtotal * DESCRIPTOR.size and dataoff >= doff + dsize and datasize >= 0)


def object_inside(offset: int, size: int, padded: int, data_offset: int, file_size: int) -> bool:
    """One descriptor's object lies in the data section of a file of FILE_SIZE bytes."""
    return offset >= data_offset and size >= 0 and padded >= size and offset + size <= file_size


def generic_json(path: str, name: str, limit: int = 1 << 20) -> tuple[bytes, int] | None:
    """(bytes of the JSON.Generic object NAME, file size) when PATH is a whole SIF holding one; else None.

    Reads the 128-byte header, the descriptor table and that object: nothing of the partition."""
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            return None
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            head = fh.read(HEADER.size)
            if len(head) < HEADER.size or head[32:42] != MAGIC:
                return None
            fields = HEADER.unpack(head)
            if fields[2] != VERSION or not table_consistent(fields) or fields[11] + fields[12] > size:
                return None
            fh.seek(fields[9])
            table = fh.read(fields[10])
            if len(table) != fields[10]:
                return None
            found = None
            for (dtype, used, _id, _group, _link, off, dsize, padded, *_rest, oname, _extra) in \
                    DESCRIPTOR.iter_unpack(table):
                if not used:
                    continue
                if not object_inside(off, dsize, padded, fields[11], size):
                    return None
                if found is None and dtype == DATA_GENERIC_JSON and oname.split(b"\0", 1)[0] == name.encode():
                    found = (off, dsize)
            if found is None or found[1] > limit:
                return None
            fh.seek(found[0])
            data = fh.read(found[1])
    except (OSError, ValueError):
        return None
    return (data, size) if len(data) == found[1] else None

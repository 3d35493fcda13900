"""The SIF layout's constants and its two consistency rules, with `struct` alone.

sif/format.py reads and writes SIFs with an error for people at every
fault, and envport/sif/ appends and signs objects; both take the layout from
here, so one set of numbers describes every SIF envport reads or writes.
(The no-op build no longer reads the SIF at all: it takes a file only on
this machine's build record, sif/record.py.)
"""

from __future__ import annotations

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

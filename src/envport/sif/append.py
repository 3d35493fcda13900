"""Append one data object to a SIF in place, as sif's `AddObject` does (`pkg/sif/add.go`).

The object goes in the first unused descriptor slot (ID = slot + 1), its
bytes at data offset + data size (no alignment for a signature), and the
header gets one fewer free descriptor, the larger data size and the new
ModifiedAt. Written in that order, data first and header last, each step
synced: a crash part way leaves bytes past the header's data end that no
reader looks at, never a descriptor pointing at nothing.
"""

from __future__ import annotations

import os
import struct

from envport.sif.format import SifError
from envport.sif.header import DESCRIPTOR, HEADER
from envport.sif.image import RawImage

# The header's int64 fields from `created` on, and where they start.
HEADER_TIMES_AND_COUNTS = struct.Struct("<qqqqqqqq")
HEADER_INTS_AT = HEADER.size - HEADER_TIMES_AND_COUNTS.size


def append_object(image: RawImage, *, datatype: int, group_word: int, link: int, data: bytes, time: int,
                  name: bytes = b"", extra: bytes = b"") -> int:
    """Write DATA as a new object of IMAGE's file; returns its ID. IMAGE must be the file as it is now."""
    if image.free_slot is None:
        raise SifError("descriptors_full", f"{image.path}: all {image.header['descriptors_total']} descriptor "
                                           "slots are used; no object can be added (delete one with "
                                           "`siftool del ID FILE`)")
    h = image.header
    offset = h["data_offset"] + h["data_size"]
    last = max((d.end for d in image.descriptors), default=h["data_offset"])
    if last > offset:
        raise SifError("corrupt_header", f"{image.path}: object data reaches byte {last}, past the header's data "
                                         f"end {offset}: the file is damaged; rebuild it")
    slot = image.free_slot
    new_id = slot + 1
    if any(d.id == new_id for d in image.descriptors):
        new_id = max(d.id for d in image.descriptors) + 1
    entry = DESCRIPTOR.pack(datatype, True, new_id, group_word, link, offset, len(data), len(data), time, time,
                            0, 0, name, extra)
    ints = HEADER_TIMES_AND_COUNTS.pack(h["created"], time, h["descriptors_free"] - 1, h["descriptors_total"],
                                        h["descriptors_offset"], h["descriptors_size"], h["data_offset"],
                                        h["data_size"] + len(data))
    try:
        fd = os.open(image.path, os.O_WRONLY)
    except OSError as exc:
        raise SifError("unwritable", f"{image.path}: cannot open for writing ({exc.strerror}); signing writes "
                                     "the signature into the file itself: sign a copy you own") from None
    try:
        for at, chunk in ((offset, data), (h["descriptors_offset"] + slot * DESCRIPTOR.size, entry),
                          (HEADER_INTS_AT, ints)):
            os.pwrite(fd, chunk, at)
            os.fsync(fd)
    except OSError as exc:
        raise SifError("unwritable", f"{image.path}: writing the new object failed ({exc.strerror})") from None
    finally:
        os.close(fd)
    return new_id

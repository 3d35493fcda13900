"""A SIF's header and descriptor table as raw fields: what signatures cover and what signing rewrites.

engines/sif.py reads a SIF for people (checked, named fields); a signature
covers fields it drops (uid, gid, the whole Extra, the raw group and link
words), so this module keeps every field of every used slot, read after
engines.sif.read_sif has checked the file (one reader decides what is a SIF).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from envport.engines.sif import DATATYPE_NAMES, GROUP_MASK, SifError, read_sif
from envport.engines.sif_header import DESCRIPTOR, HEADER

HEADER_FIELDS = ("launch", "magic", "version", "arch", "uuid", "created", "modified", "descriptors_free",
                 "descriptors_total", "descriptors_offset", "descriptors_size", "data_offset", "data_size")


@dataclass(frozen=True)
class RawDescriptor:
    slot: int  # 0-based index in the table
    datatype: int
    used: bool
    id: int
    group_word: int  # GroupID as stored: 0xF0000000 | n, or 0xF0000000 for "no group"
    link: int  # LinkedID as stored: 0xF0000000 | group for a group, an object ID, or 0
    offset: int
    size: int
    size_with_padding: int
    ctime: int
    mtime: int
    uid: int
    gid: int
    name: bytes
    extra: bytes

    @property
    def group(self) -> int:
        """The object group (1, 2, ...), 0 for none."""
        return self.group_word & ~GROUP_MASK

    @property
    def kind(self) -> str:
        return DATATYPE_NAMES.get(self.datatype, f"{self.datatype:#x}")

    @property
    def end(self) -> int:
        return self.offset + self.size


@dataclass(frozen=True)
class RawImage:
    path: str
    file_size: int
    header: dict  # HEADER_FIELDS -> value
    descriptors: tuple[RawDescriptor, ...]  # used slots only, in slot order
    free_slot: int | None  # the first unused slot, None when the table is full

    def in_group(self, group: int) -> list[RawDescriptor]:
        return sorted((d for d in self.descriptors if d.group == group), key=lambda d: d.id)

    def by_id(self, object_id: int) -> RawDescriptor | None:
        return next((d for d in self.descriptors if d.id == object_id), None)


def read_raw(path: str | os.PathLike) -> RawImage:
    """Every field of the header and of each used descriptor; raises SifError (engines/sif.py) on a bad file."""
    info = read_sif(path)  # the checks: magic, version, table and every object inside the file
    try:
        with open(path, "rb") as fh:
            head = fh.read(HEADER.size)
            fh.seek(info.descriptors_offset)
            table = fh.read(info.descriptors_size)
    except OSError as exc:
        raise SifError("unreadable", f"{path}: read failed ({exc.strerror})") from None
    header = dict(zip(HEADER_FIELDS, HEADER.unpack(head)))
    used, free = [], None
    for slot, fields in enumerate(DESCRIPTOR.iter_unpack(table)):
        d = RawDescriptor(slot, *fields)
        if d.used:
            used.append(d)
        elif free is None:
            free = slot
    return RawImage(str(path), info.file_size, header, tuple(used), free)

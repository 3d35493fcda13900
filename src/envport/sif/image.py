"""A SIF's header and descriptor table as raw fields: what signatures cover and what signing rewrites.

sif/format.py reads a SIF for people (checked, named fields); a signature
covers fields it drops (uid, gid, the whole Extra, the raw group and link
words), so this module keeps every field of every used slot, parsed from the
very bytes sif.format.read_sif read and judged (one reader decides what is a
SIF, and both views are of one read of one open file).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from envport.sif.format import DATATYPE_NAMES, GROUP_MASK, SifInfo, read_sif
from envport.sif.handle import SifFile
from envport.sif.header import DESCRIPTOR, HEADER

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
    file: SifFile  # the open file the table was read from: objects are read and hashed through it
    file_size: int
    header: dict  # HEADER_FIELDS -> value
    descriptors: tuple[RawDescriptor, ...]  # used slots only, in slot order
    free_slot: int | None  # the first unused slot, None when the table is full

    def in_group(self, group: int) -> list[RawDescriptor]:
        return sorted((d for d in self.descriptors if d.group == group), key=lambda d: d.id)

    def by_id(self, object_id: int) -> RawDescriptor | None:
        return next((d for d in self.descriptors if d.id == object_id), None)


def read_raw(source: "str | os.PathLike | SifFile | SifInfo") -> RawImage:
    """Every field of the header and of each used descriptor; raises SifError (sif/format.py) on a bad file.
    SOURCE: a SifInfo already read (its bytes are parsed again, nothing is reread), an open file or a path."""
    info = source if isinstance(source, SifInfo) else read_sif(source)
    header = dict(zip(HEADER_FIELDS, HEADER.unpack(info.header_raw)))
    used, free = [], None
    for slot, fields in enumerate(DESCRIPTOR.iter_unpack(info.table_raw)):
        d = RawDescriptor(slot, *fields)
        if d.used:
            used.append(d)
        elif free is None:
            free = slot
    return RawImage(info.path, info.file, info.file_size, header, tuple(used), free)

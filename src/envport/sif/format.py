"""The SIF container file format, read and written with the stdlib alone.

Layout (apptainer/sif v2, checked against Debian's `siftool` 2.8.3):

- a 128-byte global header at offset 0: launch script (32 bytes), magic
  `SIF_MAGIC\\0`, version `01\\0`, arch (`02\\0` = amd64), a 16-byte uuid, then
  eight little-endian int64: created, modified, descriptors free, descriptors
  total, descriptors offset, descriptors size, data offset, data size;
- 48 descriptor slots of 585 bytes from offset 4096;
- the data section from 32176 (= 4096 + 48 * 585).

What `apptainer build` writes, and so what `write_sif` writes: Def.FILE (the
def text), one JSON.Generic named `inspect-metadata.json` (what `apptainer
inspect` reads instead of opening the image), then the primary system
squashfs partition; all in object group 1. Data objects follow one another
unaligned and the partition starts on a 4096-byte boundary, as in apptainer's
own SIFs (`siftool list` of one: Def.FILE 32176-32214, JSON.Generic
32214-36205, FS 36864-...).

Every malformed input raises `SifError(reason, message)`: `reason` is one
stable token a caller can branch on (an exit code, a verdict), `message` says
what was found, where, and what to do.
"""

from __future__ import annotations

import errno
import os
import platform
import stat
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional
from envport.core.files import replacing
from envport.sif.handle import SifError, SifFile
# The layout's constants live with the stdlib-only reader of the no-op build (sif/header.py).
from envport.sif.header import (
    DATA_GENERIC_JSON, DATA_OFFSET, DATA_PARTITION, DESCRIPTOR, DESCRIPTOR_SLOTS, DESCRIPTORS_OFFSET, HEADER,
    LAUNCH_SCRIPT, MAGIC, VERSION, object_inside, table_consistent)

PARTITION_EXTRA = struct.Struct("<ii3s")
PARTITION_ALIGN = 4096
GROUP_MASK = 0xF0000000
DEFAULT_GROUP = 1

DATA_DEFFILE = 0x4001
DATA_ENVVAR = 0x4002
DATA_LABELS = 0x4003
DATA_SIGNATURE = 0x4005
# Names as `siftool list` prints them (2 and 3 measured: --datatype 2 lists as
# Env.Vars, 3 as JSON.Labels).
DATATYPE_NAMES = {
    DATA_DEFFILE: "Def.FILE", DATA_ENVVAR: "Env.Vars", DATA_LABELS: "JSON.Labels",
    DATA_PARTITION: "FS", DATA_SIGNATURE: "Signature", DATA_GENERIC_JSON: "JSON.Generic",
    0x4007: "Generic/Raw", 0x4008: "Cryptographic Message", 0x4009: "SBOM",
    0x400A: "OCI.RootIndex", 0x400B: "OCI.Blob",
}
FS_SQUASHFS = 1
FS_NAMES = {1: "Squashfs", 2: "Ext3", 3: "Data", 4: "Raw", 5: "Encrypted squashfs"}
PART_PRIMSYS = 2
PART_NAMES = {1: "System", 2: "Primary system", 3: "Data", 4: "Overlay"}
ARCH_CODES = {
    "386": b"01", "amd64": b"02", "arm": b"03", "arm64": b"04", "ppc64": b"05",
    "ppc64le": b"06", "mips": b"07", "mipsle": b"08", "mips64": b"09",
    "mips64le": b"10", "s390x": b"11", "riscv64": b"12",
}
ARCH_NAMES = {code: name for name, code in ARCH_CODES.items()}
MACHINE_TO_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64",
                   "ppc64le": "ppc64le", "s390x": "s390x", "riscv64": "riscv64", "i686": "386"}

SQUASHFS_SUPERBLOCK = struct.Struct("<IIIIIHHHHHHQQQQQQQQ")
SQUASHFS_MAGIC = 0x73717368  # "hsqs"
SQUASHFS_COMPRESSION = {1: "gzip", 2: "lzma", 3: "lzo", 4: "xz", 5: "lz4", 6: "zstd"}

# The spec (and site, partition sha256) envport's builder embeds as a JSON.Generic object (sif/embedded.py).
SPEC_OBJECT = "envport-spec.json"

COPY_CHUNK = 8 << 20
READ_OBJECT_LIMIT = 64 << 20


@dataclass(frozen=True)
class SifDescriptor:
    """One used descriptor slot. Partition fields are None for other objects."""

    id: int
    datatype: int
    datatype_name: str
    group: int | None  # None: in no group
    link: int
    offset: int
    size: int
    size_with_padding: int
    created: int
    modified: int
    name: str
    fs_type: int | None = None
    partition_type: int | None = None
    arch: str | None = None  # Go arch name ("amd64"), or "unknown:XX"

    @property
    def fs_name(self) -> str | None:
        return None if self.fs_type is None else FS_NAMES.get(self.fs_type, f"unknown({self.fs_type})")

    @property
    def partition_name(self) -> str | None:
        if self.partition_type is None:
            return None
        return PART_NAMES.get(self.partition_type, f"unknown({self.partition_type})")


@dataclass(frozen=True)
class SifInfo:
    """A SIF's header and used descriptors, as read from `file`, the open descriptor every later read of the
    same SIF goes through (sif/handle.py); `header_raw` and `table_raw` are the bytes they were parsed
    from, so the signature check (sif/image.py) judges the very table this reading judged."""

    path: str
    file_size: int
    launch_script: str
    version: str
    arch: str
    uuid: str
    created: int
    modified: int
    descriptors_free: int
    descriptors_total: int
    descriptors_offset: int
    descriptors_size: int
    data_offset: int
    data_size: int
    descriptors: tuple[SifDescriptor, ...]
    file: SifFile = field(repr=False, compare=False, default=None)
    header_raw: bytes = field(repr=False, compare=False, default=b"")
    table_raw: bytes = field(repr=False, compare=False, default=b"")

    def find(self, *, datatype: int | None = None, name: str | None = None) -> SifDescriptor | None:
        """The first descriptor of that type and/or name, or None."""
        for d in self.descriptors:
            if (datatype is None or d.datatype == datatype) and (name is None or d.name == name):
                return d
        return None


@dataclass(frozen=True)
class SquashfsSuperblock:
    inodes: int
    mkfs_time: int
    block_size: int
    compression_id: int
    compression: str
    version: str
    bytes_used: int


def host_arch() -> str:
    """This machine's architecture as SIF (Go) names it: amd64, arm64, ..."""
    machine = platform.machine().lower()
    return MACHINE_TO_ARCH.get(machine, machine)


def _arch_name(code: bytes) -> str:
    code = code.rstrip(b"\0")
    if code == b"00":
        return "unknown"
    return ARCH_NAMES.get(code, "unknown:" + code.decode("ascii", "replace"))


def _cstr(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


# --- reading -----------------------------------------------------------------


def _not_a_sif(path: Path, head: bytes) -> SifError:
    if head[:4] == b"hsqs":
        hint = "it is a bare squashfs image (magic hsqs), not a SIF; mount it directly or rebuild the SIF"
    elif head[:4] == b"\x7fELF":
        hint = "it is an ELF executable"
    elif head[:2] == b"\x1f\x8b":
        hint = "it is gzip data (a docker save tarball?)"
    else:
        hint = "no SIF_MAGIC at byte 32"
    return SifError("not_a_sif", f"{path}: not a SIF file: {hint}")


def _sif_header_prefix(raw: bytes) -> bool:
    """RAW (shorter than a header) could be the start of one."""
    if len(raw) > 32:
        return MAGIC.startswith(raw[32:42])
    return LAUNCH_SCRIPT.ljust(32, b"\0").startswith(raw) or raw.strip(b"\0") == b""


def _parse_header(path: Path, raw: bytes, size: int) -> tuple:
    if size == 0:
        raise SifError("empty_file", f"{path}: the file is empty (0 bytes); the build or copy that made it "
                                     "did not finish: rebuild or copy it again")
    if raw[32:42] != MAGIC:
        if size < HEADER.size and _sif_header_prefix(raw):
            raise SifError("truncated", f"{path}: only {size} bytes, cut short inside the 128-byte SIF "
                                        "header: copy or rebuild it")
        raise _not_a_sif(path, raw)
    if size < HEADER.size:
        raise SifError("truncated", f"{path}: only {size} bytes, cut short inside the 128-byte SIF header: "
                                    "copy or rebuild it")
    fields = HEADER.unpack(raw[:HEADER.size])
    if fields[2] != VERSION:
        found = fields[2].rstrip(b"\0").decode("ascii", "replace")
        raise SifError("unsupported_version", f"{path}: SIF version {found!r}; this reader knows version 01 "
                                              "(apptainer >= 1.0, singularity >= 3.0)")
    return fields


def _check_layout(path: Path, fields: tuple, size: int) -> None:
    dfree, dtotal, doff, dsize, dataoff, datasize = fields[7:13]
    if not table_consistent(fields):
        raise SifError("corrupt_header", f"{path}: inconsistent SIF header (descriptors total={dtotal} "
                                         f"free={dfree} offset={doff} size={dsize}, data offset={dataoff} "
                                         f"size={datasize}): the file is damaged; rebuild it")
    if doff + dsize > size:
        raise SifError("truncated", f"{path}: {size} bytes, but the descriptor table ends at byte "
                                    f"{doff + dsize}: the file was cut short; copy or rebuild it")
    if dataoff + datasize > size:
        raise SifError("truncated", f"{path}: {size} bytes, but the header says the data ends at byte "
                                    f"{dataoff + datasize}: the file was cut short "
                                    f"({dataoff + datasize - size} bytes missing); copy or rebuild it")


def _parse_descriptor(path: Path, slot: int, raw: bytes, fields: tuple, size: int) -> SifDescriptor | None:
    (dtype, used, did, group, link, off, dsize, padded, ctime, mtime, _uid, _gid,
     name, extra) = DESCRIPTOR.unpack(raw)
    if not used:
        return None
    where = f"{path}: descriptor {slot + 1} (id {did}, {DATATYPE_NAMES.get(dtype, hex(dtype))})"
    dataoff = fields[11]
    if not object_inside(off, dsize, padded, dataoff, size):
        raise SifError("corrupt_descriptor", f"{where} points at bytes {off}..{off + dsize}, outside the "
                                             f"data section ({dataoff}..{size}): the file is damaged; rebuild it")
    desc = dict(id=did, datatype=dtype, datatype_name=DATATYPE_NAMES.get(dtype, f"unknown({dtype:#x})"),
                group=(group & ~GROUP_MASK) or None, link=link, offset=off,
                size=dsize, size_with_padding=padded, created=ctime, modified=mtime, name=_cstr(name))
    if dtype == DATA_PARTITION:
        fs, ptype, arch = PARTITION_EXTRA.unpack(extra[:PARTITION_EXTRA.size])
        desc.update(fs_type=fs, partition_type=ptype, arch=_arch_name(arch))
    return SifDescriptor(**desc)


def opened(source: "str | os.PathLike | SifFile") -> SifFile:
    """SOURCE itself when it is an open SIF, else the file at that path opened once (sif/handle.py)."""
    return source if isinstance(source, SifFile) else SifFile.open(source)


def read_sif(source: "str | os.PathLike | SifFile") -> SifInfo:
    """Header and used descriptors of the SIF at SOURCE (a path, or a file already open), read from one
    descriptor and judged as a whole (`judge_table`); raises SifError on anything malformed."""
    fh = opened(source)
    path, size = fh.path, fh.size
    head = fh.read(0, HEADER.size)
    fields = _parse_header(path, head, size)
    _check_layout(path, fields, size)
    table = fh.read(fields[9], fields[10])
    descriptors = []
    for slot in range(fields[8]):
        raw = table[slot * DESCRIPTOR.size:(slot + 1) * DESCRIPTOR.size]
        d = _parse_descriptor(path, slot, raw, fields, size)
        if d is not None:
            descriptors.append(d)
    judge_table(path, descriptors)
    return SifInfo(path=str(path), file_size=size, launch_script=_cstr(fields[0]),
                   version=_cstr(fields[2]), arch=_arch_name(fields[3]), uuid=_uuid_str(fields[4]),
                   created=fields[5], modified=fields[6], descriptors_free=fields[7],
                   descriptors_total=fields[8], descriptors_offset=fields[9],
                   descriptors_size=fields[10], data_offset=fields[11], data_size=fields[12],
                   descriptors=tuple(descriptors), file=fh, header_raw=head, table_raw=table)


def judge_table(path, descriptors: list[SifDescriptor]) -> None:
    """The descriptor table names each object once: no two objects with one ID (a signature check that keeps
    one descriptor per ID judges one object while a reader that takes the first in slot order runs the
    other), one primary partition at most, and no two objects sharing a byte (one signed object's bytes
    read as another's).  apptainer's own SIFs hold to all three; SifError `corrupt_descriptor` otherwise."""
    seen: dict[int, SifDescriptor] = {}
    for d in descriptors:
        if d.id in seen:
            raise SifError("corrupt_descriptor", f"{path}: two objects carry ID {d.id} ({seen[d.id].datatype_name} "
                                                 f"and {d.datatype_name}): a SIF names each object once; the "
                                                 "file is damaged or crafted: get it again from its builder")
        seen[d.id] = d
    primary = [d for d in descriptors if d.datatype == DATA_PARTITION and d.partition_type == PART_PRIMSYS]
    if len(primary) > 1:
        raise SifError("corrupt_descriptor", f"{path}: {len(primary)} primary system partitions (objects "
                                             f"{', '.join(str(d.id) for d in primary)}): a SIF runs one; the "
                                             "file is damaged or crafted: get it again from its builder")
    spans = sorted((d.offset, d.offset + d.size, d) for d in descriptors if d.size > 0)
    for (_, end, a), (start, _, b) in zip(spans, spans[1:]):
        if start < end:
            raise SifError("corrupt_descriptor", f"{path}: objects {a.id} ({a.datatype_name}, bytes "
                                                 f"{a.offset}..{a.offset + a.size}) and {b.id} ({b.datatype_name}, "
                                                 f"bytes {b.offset}..{b.offset + b.size}) overlap: the file is "
                                                 "damaged or crafted: get it again from its builder")


def _uuid_str(raw: bytes) -> str:
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def read_object(info: SifInfo, descriptor: SifDescriptor, *, limit: int = READ_OBJECT_LIMIT) -> bytes:
    """The bytes of one (small) data object: the def file, a JSON object."""
    if descriptor.size > limit:
        raise SifError("too_large", f"{info.path}: object {descriptor.id} ({descriptor.datatype_name}) is "
                                    f"{descriptor.size} bytes, over the {limit}-byte limit for reading "
                                    "into memory; mount partitions instead of reading them")
    fh = info.file
    if descriptor.offset + descriptor.size > fh.size:
        raise SifError("truncated", f"{info.path}: object {descriptor.id} ends at byte "
                                    f"{descriptor.offset + descriptor.size}, past the end ({fh.size} bytes)")
    return fh.read(descriptor.offset, descriptor.size)


def primary_partition(info: SifInfo, *, arch: str | None = None) -> SifDescriptor:
    """The primary system squashfs partition, checked to run on ARCH (default: this machine)."""
    want = arch or host_arch()
    prim = [d for d in info.descriptors if d.datatype == DATA_PARTITION and d.partition_type == PART_PRIMSYS]
    if not prim:
        kinds = ", ".join(d.datatype_name for d in info.descriptors) or "none"
        raise SifError("no_primary_partition", f"{info.path}: no primary system partition (objects: {kinds}); "
                                               "a SIF without a root filesystem cannot run: rebuild it")
    part = prim[0]
    if part.fs_type != FS_SQUASHFS:
        raise SifError("unsupported_filesystem", f"{info.path}: the primary partition is {part.fs_name}, "
                                                 "not squashfs; only squashfs partitions can be mounted here")
    if part.arch != want:
        raise SifError("foreign_arch", f"{info.path}: the primary partition is built for {part.arch}, this "
                                       f"machine is {want}: build the SIF on (or for) {want}")
    return part


def read_squashfs_superblock(source: "str | os.PathLike | SifFile", offset: int = 0) -> SquashfsSuperblock:
    """The superblock of the squashfs image starting at OFFSET in SOURCE (a path or an open file)."""
    fh = opened(source)
    path, size = fh.path, fh.size
    raw = fh.read(offset, SQUASHFS_SUPERBLOCK.size)
    if len(raw) < SQUASHFS_SUPERBLOCK.size:
        raise SifError("truncated", f"{path}: ends before the squashfs superblock at byte {offset}")
    (magic, inodes, mtime, block_size, _frags, comp, _blog, _flags, _ids, major, minor,
     _root, bytes_used, *_tables) = SQUASHFS_SUPERBLOCK.unpack(raw)
    if magic != SQUASHFS_MAGIC:
        raise SifError("bad_squashfs", f"{path}: no squashfs magic (hsqs) at byte {offset}: "
                                       "the partition is damaged or not squashfs")
    if offset + bytes_used > size:
        raise SifError("truncated", f"{path}: the squashfs at byte {offset} says it uses {bytes_used} bytes, "
                                    f"the file ends {offset + bytes_used - size} bytes short")
    return SquashfsSuperblock(inodes=inodes, mkfs_time=mtime, block_size=block_size,
                              compression_id=comp, compression=SQUASHFS_COMPRESSION.get(comp, f"unknown({comp})"),
                              version=f"{major}.{minor}", bytes_used=bytes_used)


# --- writing -----------------------------------------------------------------


def _descriptor(*, id: int, datatype: int, offset: int, size: int, padded: int, created: int,
                name: str = "", extra: bytes = b"") -> bytes:
    return DESCRIPTOR.pack(datatype, True, id, GROUP_MASK | DEFAULT_GROUP, 0, offset, size, padded,
                           created, created, 0, 0, name.encode("utf-8"), extra)


def _layout(objects: list[bytes], squashfs_size: int) -> list[tuple[int, int, int]]:
    """(offset, size, size with padding) of each data object, then of the partition."""
    spans, end = [], DATA_OFFSET
    for size, align in [(len(o), 1) for o in objects] + [(squashfs_size, PARTITION_ALIGN)]:
        offset = -(-end // align) * align
        spans.append((offset, size, offset - end + size))
        end = offset + size
    return spans


def _check_squashfs_input(squashfs_path: Path) -> int:
    try:
        st = os.stat(squashfs_path)
        with open(squashfs_path, "rb") as fh:
            magic = fh.read(4)
    except OSError as exc:
        raise SifError("unreadable", f"{squashfs_path}: cannot read the squashfs image ({exc.strerror})") from None
    if not stat.S_ISREG(st.st_mode) or magic != b"hsqs":
        raise SifError("bad_squashfs", f"{squashfs_path}: not a squashfs image (no hsqs magic); "
                                       "make it with mksquashfs ROOT FILE -noappend")
    return st.st_size


def _copy_into(dst, src_path: Path, offset: int, size: int) -> None:
    """Stream SRC into DST at OFFSET; the kernel copies, nothing is held in memory."""
    dst.seek(offset)
    dst.flush()
    with open(src_path, "rb") as src:
        left = size
        while left:
            try:
                sent = os.sendfile(dst.fileno(), src.fileno(), None, min(left, COPY_CHUNK))
            except OSError as exc:
                if exc.errno not in (errno.EINVAL, errno.ENOSYS):
                    raise
                sent = _copy_chunk(dst, src, min(left, COPY_CHUNK))
            if sent == 0:
                raise SifError("truncated", f"{src_path}: shrank while being copied into the SIF")
            left -= sent
    dst.seek(offset + size)


def _copy_chunk(dst, src, n: int) -> int:
    data = src.read(n)
    dst.write(data)
    dst.flush()
    return len(data)


def write_sif(path: str | os.PathLike, *, deffile: bytes, inspect_metadata: bytes,
              squashfs_path: str | os.PathLike, created: int, uuid: bytes,
              arch: str = "amd64", extra_json: tuple[tuple[str, bytes], ...] = (),
              finish: Optional[Callable[[Path], None]] = None) -> SifInfo:
    """Assemble a SIF as `apptainer build` lays it out; the same inputs give the same bytes.

    EXTRA_JSON adds named JSON.Generic objects after `inspect-metadata.json`
    (apptainer itself adds `oci-config.json` the same way; readers look objects
    up by name).  The file appears under PATH only when complete: it is
    written to a hidden partial name in the same directory and renamed at the end;
    FINISH (e.g. appending an SBOM object) runs on that partial first, so what it adds is there
    before the file has its name."""
    path, squashfs_path = Path(path), Path(squashfs_path)
    if len(uuid) != 16:
        raise ValueError(f"uuid must be 16 bytes, got {len(uuid)}")
    if arch not in ARCH_CODES:
        raise ValueError(f"unknown SIF architecture {arch!r}; known: {', '.join(sorted(ARCH_CODES))}")
    if len(extra_json) > DESCRIPTOR_SLOTS - 3:
        raise ValueError(f"at most {DESCRIPTOR_SLOTS - 3} extra objects fit in the descriptor table")
    sq_size = _check_squashfs_input(squashfs_path)
    objects = [(DATA_DEFFILE, "", deffile), (DATA_GENERIC_JSON, "inspect-metadata.json", inspect_metadata)]
    objects += [(DATA_GENERIC_JSON, name, data) for name, data in extra_json]
    spans = _layout([o[2] for o in objects], sq_size)
    code = ARCH_CODES[arch] + b"\0"
    entries = [_descriptor(id=i, datatype=dtype, offset=span[0], size=span[1], padded=span[2], created=created,
                           name=name) for i, ((dtype, name, _), span) in enumerate(zip(objects, spans), start=1)]
    part = spans[-1]
    entries.append(_descriptor(id=len(objects) + 1, datatype=DATA_PARTITION, offset=part[0], size=part[1],
                               padded=part[2], created=created,
                               extra=PARTITION_EXTRA.pack(FS_SQUASHFS, PART_PRIMSYS, code)))
    table = b"".join(entries).ljust(DESCRIPTOR_SLOTS * DESCRIPTOR.size, b"\0")
    header = HEADER.pack(LAUNCH_SCRIPT, MAGIC, VERSION, code, uuid, created, created,
                         DESCRIPTOR_SLOTS - len(entries), DESCRIPTOR_SLOTS, DESCRIPTORS_OFFSET, len(table),
                         DATA_OFFSET, sum(s[2] for s in spans))
    # 0o755: apptainer makes SIFs executable, the launch script runs them.
    with replacing(path, mode=0o755) as partial:
        with open(partial, "wb") as out:
            out.write(header.ljust(DESCRIPTORS_OFFSET, b"\0") + table)
            for (_, _, data), span in zip(objects, spans):
                out.seek(span[0])
                out.write(data)
            _copy_into(out, squashfs_path, part[0], sq_size)
            out.truncate(part[0] + sq_size)
            out.flush()
            os.fsync(out.fileno())
        if finish is not None:
            finish(partial)
    return read_sif(path)


def read_json_object(info: SifInfo, name: str) -> dict | None:
    """The JSON.Generic object called NAME, parsed; None when the SIF has none by that name.

    The file is untrusted: JSON nested past the parser's recursion limit is a reason, not a traceback."""
    import json

    desc = info.find(datatype=DATA_GENERIC_JSON, name=name)
    if desc is None:
        return None
    raw = read_object(info, desc)
    try:
        value = json.loads(raw)
    except RecursionError:
        raise SifError("corrupt_object", f"{info.path}: object {desc.id} ({name}) is JSON nested too deeply "
                                         "to read: the file is damaged or crafted; get it again") from None
    except ValueError as exc:
        raise SifError("corrupt_object", f"{info.path}: object {desc.id} ({name}) is not valid JSON ({exc}): "
                                         "the file is damaged; rebuild it") from None
    if not isinstance(value, dict):
        raise SifError("corrupt_object", f"{info.path}: object {desc.id} ({name}) is not a JSON object")
    return value


def json_member(info: SifInfo, name: str, obj: dict | None, *keys: str, kind: type = dict):
    """OBJ[keys[0]][keys[1]]... of the JSON object NAME, checked to be a KIND: absent members are KIND(),
    a member of another type is SifError `corrupt_object` (a list where labels belong, a number ...)."""
    value = obj if obj is not None else {}
    where = name
    for key in keys:
        if not isinstance(value, dict):
            raise SifError("corrupt_object", f"{info.path}: {where} is a {type(value).__name__}, "
                                             "not a JSON object: the file is damaged or crafted")
        value = value.get(key)
        where += f".{key}"
        if value is None:
            return kind()
    if not isinstance(value, kind):
        raise SifError("corrupt_object", f"{info.path}: {where} is a {type(value).__name__}, not a "
                                         f"{'JSON object' if kind is dict else kind.__name__}: the file is "
                                         "damaged or crafted")
    return value


def sif_labels(info: SifInfo) -> dict[str, str]:
    """The image labels as `apptainer inspect` shows them: from inspect-metadata.json (unsigned claims)."""
    meta = read_json_object(info, "inspect-metadata.json")
    labels = json_member(info, "inspect-metadata.json", meta, "data", "attributes", "labels")
    return {str(k): v if isinstance(v, str) else str(v) for k, v in labels.items()}

"""A squashfs 4.0 image of a directory tree, written by envport itself: gzip or zstd, 128 KiB blocks, no fragments.

Why not mksquashfs: a rebuild after a last-phase edit changes a few files of a 1.1 GB rootfs, and
mksquashfs compresses all of it again (103 of the 124 s of a cold demo-cpu SIF).  No squashfs tool
takes already-compressed blocks for the files that did not change (mksquashfs' append mode renames
colliding names; it cannot replace a tree), so this writer asks a block store (sif/squash_blocks.py)
for each file's compressed blocks, keyed by the file's content, before it compresses anything.

What it writes, as squashfs-tools' squashfs_fs.h, the kernel's fs/squashfs and squashfs-tools-ng's
format document lay it out (little-endian; the superblock, the data blocks, the inode table, the
directory table, the empty fragment table's place, the id table; padded to 4 KiB):

- data blocks of 128 KiB compressed as mksquashfs' gzip does by default (a zlib stream, level 9, window
  15, memLevel 8, default strategy: zlib.compress(data, 9) is exactly that), or as its zstd does
  (squashfs-tools 4.5.1 zstd_wrapper.c: one ZSTD_compressCCtx frame per block, level 15, the content
  size in the frame header, no checksum: python-zstandard's ZstdCompressor(level=15).compress is that
  frame), a block stored raw (bit 24 of its size) where compression does not make it smaller, a block of
  zeros not stored at all (size 0: a sparse block, as mksquashfs writes it); metadata blocks the same
  way (bit 15 of their header for a raw one);
- NO fragments (flag NO_FRAGMENTS): a file's tail is its own short block, so a file's blocks depend on
  that file alone and can be reused from an earlier image whatever else changed.  The cost is
  size (measured in bench/results/sif.json, "writer");
- files of equal content stored once (flag DUPLICATES, as mksquashfs dedups by default); hard links as
  one inode whose link count is the links inside the tree;
- basic inodes, extended ones where a file has more than one link or its size or start passes 32 bits,
  or a directory has an index (mksquashfs' entry each time the listing crosses 8 KiB: always one past
  64 KiB) or more than 256 entries, as mksquashfs 4.5 chooses; directory runs split at 256 entries, at a change of the inodes' metadata
  block and where an inode number is more than 32767 from the run's; a directory's size is its listing
  + 3 (the kernel's "." and ".."), the root's parent is inode_count + 1 (mksquashfs' convention);
- no export table (NFS export of a container image: never); compressor options only as mksquashfs writes
  them: none at the compressor's default level (gzip 9, zstd 15), else its options struct as an
  uncompressed metadata block after the superblock and the superblock's COMP_OPT flag.

The bytes of a compressed block depend on the compression library's version: zlib's for gzip (the
system's, the one mksquashfs links: the images are mksquashfs' bytes), libzstd's for zstd.  python-
zstandard carries its own libzstd (1.5.7 in zstandard 0.25), Debian 12's mksquashfs links libzstd 1.5.4:
the frames differ (both read back the same; with a zstandard that carries the system's libzstd, e.g.
zstandard 0.20 and 1.5.4, the image is mksquashfs' bytes again).  So `params()` names the versions: a
block store keeps blocks per version, and the builder's label says which wrote the image.

Extended attributes are NOT written (flag NO_XATTRS); the ones the tree had are returned by name and
count (`WriteResult.xattrs_dropped`) and the builder says them.  Decided from the trees this builder
squashes: the base comes from `docker export | tar -x` (envport/debian-bookworm:base exports 11,154
entries, none with an xattr record, and GNU tar without --xattrs would drop them anyway) and %post runs
pip and apt in a bwrap sandbox, which set none on demo-cpu's tree (the bench's build says so when one
appears).  The one a package could set is security.capability (a file capability, e.g. ping's):
apptainer and ch-run mount images nosuid, where the kernel ignores file capabilities, and the builder
clears set-id bits for the same reason (builders/apptainer/builder._defang).

Deterministic: entries sorted by their bytes, data written in one fixed walk order (the inode order),
every number derived from the tree; the same tree (and MTIME) gives the same bytes, with or without
the store (a reused block is the bytes compression gives, checked by its hash).  Compression runs on
a thread pool (zlib and python-zstandard release the GIL; a ZstdCompressor is not thread-safe, so each
worker thread has its own), its results consumed in order.
"""

from __future__ import annotations

import functools
import hashlib
import os
import stat
import struct
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Optional, Protocol

from envport.plan.lock import sha256_file

BLOCK_SIZE = 1 << 17
BLOCK_LOG = 17
METADATA_SIZE = 8192
PAD = 4096
GZIP, ZSTD = "gzip", "zstd"
COMPRESSORS = (GZIP, ZSTD)  # what this writer writes; mksquashfs writes the others
UNCOMPRESSED_BLOCK = 1 << 24
UNCOMPRESSED_META = 0x8000
INVALID = 0xFFFFFFFFFFFFFFFF
NO_FRAG = 0xFFFFFFFF
NO_XATTR = 0xFFFFFFFF
FLAG_NO_FRAGMENTS, FLAG_DUPLICATES, FLAG_NO_XATTRS, FLAG_COMP_OPT = 0x0010, 0x0040, 0x0200, 0x0400
SUPERBLOCK = struct.Struct("<IIIIIHHHHHHQQQQQQQQ")
MAX_RUN = 256
TICK_S = 4.0
# Reading or compressing a block: kept this many blocks ahead of the writer per worker (memory bounded).
AHEAD = 8

DIR, FILE, SYMLINK, BLKDEV, CHRDEV, FIFO, SOCKET = range(1, 8)
EXTENDED = 7  # an extended inode's type is its basic type + 7
KIND = {stat.S_IFDIR: DIR, stat.S_IFREG: FILE, stat.S_IFLNK: SYMLINK, stat.S_IFBLK: BLKDEV,
        stat.S_IFCHR: CHRDEV, stat.S_IFIFO: FIFO, stat.S_IFSOCK: SOCKET}


class WriterError(RuntimeError):
    pass


@dataclass(frozen=True)
class Codec:
    """One compressor as mksquashfs' wrapper for it writes: the superblock's id, the level, the options
    block it writes (empty at the default level), the versions its bytes depend on, and the compression."""

    name: str
    ident: int
    level: int
    options: bytes
    versions: dict
    pack: Callable[[bytes], bytes]

    def params(self) -> dict:
        """What a compressed block depends on besides the data: a store keeps blocks only for these."""
        extra = {"window": 15} if self.name == GZIP else {}
        return {"compressor": self.name, "level": self.level, **extra, "block_size": BLOCK_SIZE, **self.versions}

    def describe(self) -> str:
        """E.g. "zstd level 15, zstandard 0.25.0, libzstd 1.5.7": the label's words for what wrote the blocks."""
        return ", ".join([f"{self.name} level {self.level}"] + [f"{k} {v}" for k, v in self.versions.items()])


def codec(compressor: str = GZIP, level: Optional[int] = None) -> Codec:
    """The Codec for COMPRESSOR at LEVEL (None: mksquashfs' default for it)."""
    if compressor == GZIP:
        return _gzip(9 if level is None else level)
    if compressor == ZSTD:
        return _zstd(15 if level is None else level)
    raise WriterError(f"compressor {compressor!r}: envport's squashfs writer writes {' and '.join(COMPRESSORS)}; "
                      "mksquashfs writes the others")


def _gzip(level: int) -> Codec:
    if not 1 <= level <= 9:
        raise WriterError(f"gzip level {level}: mksquashfs' gzip takes 1..9")
    # gzip_wrapper.c's struct gzip_comp_opts {int level; short window_size; short strategy}, written only when
    # not the defaults (level 9, window 15, no strategy)
    options = b"" if level == 9 else struct.pack("<ihh", level, 15, 0)
    return Codec(GZIP, 1, level, options, {"zlib": zlib.ZLIB_RUNTIME_VERSION},
                 functools.partial(zlib.compress, level=level))


def _zstd(level: int) -> Codec:
    try:
        import zstandard
    except ImportError as exc:
        raise WriterError(f"zstd squashfs needs the zstandard package, an envport dependency ({exc}): "
                          "python3 -m pip install 'zstandard>=0.22'") from None
    if not 1 <= level <= zstandard.MAX_COMPRESSION_LEVEL:
        raise WriterError(f"zstd level {level}: libzstd takes 1..{zstandard.MAX_COMPRESSION_LEVEL}")
    # zstd_wrapper.c's struct zstd_comp_opts {int compression_level}, written only when not the default 15
    options = b"" if level == 15 else struct.pack("<i", level)
    versions = {"zstandard": zstandard.__version__, "libzstd": ".".join(map(str, zstandard.ZSTD_VERSION))}
    return Codec(ZSTD, 6, level, options, versions, functools.partial(_zstd_frame, level))


_per_thread = threading.local()


def _zstd_frame(level: int, data: bytes) -> bytes:
    """One zstd frame of DATA at LEVEL, content size in its header, no checksum (ZSTD_compressCCtx's), with
    this thread's own compressor (python-zstandard's are not thread-safe; a context is reused, not remade)."""
    compressors = _per_thread.__dict__.setdefault("zstd", {})
    compressor = compressors.get(level)
    if compressor is None:
        import zstandard

        compressor = compressors[level] = zstandard.ZstdCompressor(level=level, write_checksum=False,
                                                                   write_content_size=True)
    return compressor.compress(data)


def params(compressor: str = GZIP, level: Optional[int] = None) -> dict:
    """The block params (Codec.params) of COMPRESSOR at LEVEL."""
    return codec(compressor, level).params()


class BlockSource(Protocol):
    """Compressed blocks of earlier images (sif/squash_blocks.BlockStore), all made with `params`."""

    params: dict

    def has(self, sha256: str, size: int) -> bool:
        """Blocks of content SHA256 (SIZE bytes) are kept (not yet checked)."""

    def fetch(self, sha256: str, size: int) -> Optional[tuple[bytes, list[int], str]]:
        """(the file's compressed blocks back to back, each block's size word, their sha256 as checked) for
        content SHA256 of SIZE bytes; None when not kept or not intact."""


@dataclass
class Node:
    path: bytes
    name: bytes
    st: os.stat_result
    kind: int
    children: list["Node"] = field(default_factory=list)
    number: int = 0
    nlink: int = 1
    first: Optional["Node"] = None  # the first link of a hard-link group, which owns the inode
    ref: int = 0  # (metadata block << 16) | offset in the inode table
    sha256: str = ""


@dataclass
class Stored:
    start: int
    words: list[int]
    digest: str = ""  # sha256 of the compressed bytes, for the store's index


@dataclass
class WriteResult:
    size: int
    data_end: int
    files: dict[str, Stored]  # content sha256 -> where its blocks are in the image
    params: dict = field(default_factory=dict)  # what its blocks depend on besides the data (Codec.params)
    blocks_compressed: int = 0
    blocks_reused: int = 0
    files_compressed: int = 0
    files_reused: int = 0
    xattrs_dropped: dict[str, int] = field(default_factory=dict)  # xattr name -> entries that had it


# --- the tree ------------------------------------------------------------------------------------------

def scan(root: Path) -> tuple[Node, list[Node], dict[str, int]]:
    """(the root node, every node in inode order, xattr names seen -> count).  Inode order: a directory's
    entries (subdirectories depth first) before the directory itself, so the root is the last."""
    top = os.fsencode(os.fspath(root))
    st = os.lstat(top)
    if not stat.S_ISDIR(st.st_mode):
        raise WriterError(f"{root}: not a directory; the writer squashes a directory tree")
    rootnode = Node(top, b"", st, DIR)
    xattrs: dict[str, int] = {}
    links: dict[tuple[int, int], Node] = {}
    order: list[Node] = []
    _scan_dir(rootnode, links, xattrs, order)
    return rootnode, order, xattrs


def _scan_dir(node: Node, links: dict, xattrs: dict, order: list[Node]) -> None:
    _note_xattrs(node.path, xattrs)
    with os.scandir(node.path) as it:
        entries = sorted(it, key=lambda e: e.name)
    for entry in entries:
        st = entry.stat(follow_symlinks=False)
        kind = KIND.get(stat.S_IFMT(st.st_mode))
        if kind is None:
            raise WriterError(f"{os.fsdecode(entry.path)}: a file type squashfs cannot hold")
        child = Node(entry.path, entry.name, st, kind)
        node.children.append(child)
        if kind == DIR:
            _scan_dir(child, links, xattrs, order)
            continue
        _note_xattrs(entry.path, xattrs)
        if st.st_nlink > 1:
            first = links.setdefault((st.st_dev, st.st_ino), child)
            if first is not child:
                child.first = first
                first.nlink += 1
                continue
        order.append(child)
    order.append(node)


def _note_xattrs(path: bytes, seen: dict[str, int]) -> None:
    try:
        names = os.listxattr(path, follow_symlinks=False)
    except OSError:
        return  # a file system without xattrs
    for name in names:
        seen[name] = seen.get(name, 0) + 1


# --- metadata blocks -----------------------------------------------------------------------------------

def compress_meta(codec: Codec, raw: bytes) -> bytes:
    packed = codec.pack(raw)
    if len(packed) < len(raw):
        return struct.pack("<H", len(packed)) + packed
    return struct.pack("<H", len(raw) | UNCOMPRESSED_META) + raw


class MetaWriter:
    """A stream of metadata cut into 8 KiB blocks, each compressed with its 2-byte header."""

    def __init__(self, codec: Codec) -> None:
        self.codec = codec
        self.out = bytearray()
        self.pending = bytearray()
        self.starts: list[int] = []  # compressed start of each flushed block

    def position(self) -> tuple[int, int]:
        """(the start of the block the next byte goes in, relative to the table; its offset there)."""
        return len(self.out), len(self.pending)

    def ref(self) -> int:
        block, offset = self.position()
        return block << 16 | offset

    def write(self, data: bytes) -> None:
        self.pending += data
        while len(self.pending) >= METADATA_SIZE:
            self.starts.append(len(self.out))
            self.out += compress_meta(self.codec, bytes(self.pending[:METADATA_SIZE]))
            del self.pending[:METADATA_SIZE]

    def block_start(self, index: int) -> int:
        """The compressed start of uncompressed block INDEX (the one being filled: where it will go)."""
        return self.starts[index] if index < len(self.starts) else len(self.out)

    def finish(self) -> bytes:
        if self.pending:
            self.starts.append(len(self.out))
            self.out += compress_meta(self.codec, bytes(self.pending))
            self.pending.clear()
        return bytes(self.out)


# --- data blocks ---------------------------------------------------------------------------------------

def compress_block(codec: Codec, raw: bytes) -> tuple[bytes, int]:
    """(the bytes stored, the block's size word): nothing and size 0 for a block of zeros (a sparse block,
    which the kernel reads as zeros; mksquashfs does the same), else compressed, or raw with bit 24 where
    compression does not make it smaller."""
    if raw.count(0) == len(raw):
        return b"", 0
    packed = codec.pack(raw)
    if len(packed) < len(raw):
        return packed, len(packed)
    return raw, len(raw) | UNCOMPRESSED_BLOCK


def read_block(path: bytes, offset: int, size: int) -> bytes:
    with open(path, "rb", buffering=0) as fh:
        fh.seek(offset)
        data = fh.read(size)
    if len(data) != size:
        raise WriterError(f"{os.fsdecode(path)}: {len(data)} bytes at {offset}, {size} expected: the file "
                          "changed while the image was written")
    return data


def _compress_at(codec: Codec, path: bytes, offset: int, size: int) -> tuple[bytes, int]:
    return compress_block(codec, read_block(path, offset, size))


def _hash_all(files: list[Node], pool: ThreadPoolExecutor, say: Callable[[str], None]) -> None:
    """Every file's content sha256 (what the store is asked by), on the pool, saying progress every TICK_S."""
    started = last = time.monotonic()
    futures = [pool.submit(sha256_file, node.path) for node in files]
    for done, (node, future) in enumerate(zip(files, futures)):
        while True:
            try:
                node.sha256 = future.result(timeout=TICK_S)
                break
            except FutureTimeout:
                pass
            finally:
                now = time.monotonic()
                if now - last >= TICK_S:
                    last = now
                    say(f"squashfs: hashing the files' content ({done}/{len(files)}, {now - started:.0f}s)")


class DataWriter:
    """Every regular file's blocks, in inode order, each distinct content once: from the store where it
    has them, else compressed on the pool, written in order with a bounded number of blocks in flight."""

    def __init__(self, out: BinaryIO, pool: ThreadPoolExecutor, workers: int, codec: Codec,
                 store: Optional[BlockSource], say: Callable[[str], None]):
        self.out, self.pool, self.workers, self.codec, self.store, self.say = out, pool, workers, codec, store, say
        self.files: dict[str, Stored] = {}
        self.hashers: dict[str, "hashlib._Hash"] = {}
        self.counts = {"blocks_compressed": 0, "blocks_reused": 0, "files_compressed": 0, "files_reused": 0}
        self.done_blocks = self.total_blocks = 0
        self.started = self.last_said = time.monotonic()

    def write_all(self, files: list[Node]) -> None:
        unique = []
        for node in files:
            if node.st.st_size and node.sha256 not in self.files:
                self.files[node.sha256] = Stored(0, [])
                unique.append(node)
        self.total_blocks = sum(-(-n.st.st_size // BLOCK_SIZE) for n in unique)
        pending: deque = deque()
        for job in self._jobs(unique):
            pending.append(job)
            if len(pending) > self.workers * AHEAD:
                self._consume(pending.popleft())
        while pending:
            self._consume(pending.popleft())

    def _jobs(self, unique: list[Node]) -> Iterator[tuple[Node, int, Future]]:
        """(node, block index, or -1 for a whole file asked of the store, its future) in write order."""
        for node in unique:
            if self.store is not None and self.store.has(node.sha256, node.st.st_size):
                yield node, -1, self.pool.submit(self.store.fetch, node.sha256, node.st.st_size)
            else:
                yield from self._compress_jobs(node)

    def _compress_jobs(self, node: Node) -> Iterator[tuple[Node, int, Future]]:
        size = node.st.st_size
        for i in range(-(-size // BLOCK_SIZE)):
            offset = i * BLOCK_SIZE
            yield node, i, self.pool.submit(_compress_at, self.codec, node.path, offset, min(BLOCK_SIZE, size - offset))

    def _consume(self, job: tuple[Node, int, Future]) -> None:
        node, index, future = job
        got = self._wait(future)
        if index >= 0:
            self._write_block(node, index, *got)
        elif got is not None:
            self._write_reused(node, *got)
        else:  # not kept, or its pack failed the check (the store said which): compressed now, in order
            for _node, i, fut in list(self._compress_jobs(node)):
                self._write_block(node, i, *self._wait(fut))

    def _wait(self, future: Future):
        while True:
            try:
                return future.result(timeout=TICK_S)
            except FutureTimeout:
                self._progress(force=True)

    def _write_reused(self, node: Node, data: bytes, words: list[int], digest: str) -> None:
        # DIGEST: the store checked DATA against it as it read them; not hashed again here.
        self.files[node.sha256] = Stored(self.out.tell(), list(words), digest)
        self.out.write(data)
        self.counts["blocks_reused"] += len(words)
        self.counts["files_reused"] += 1
        self.done_blocks += len(words)
        self._progress()

    def _write_block(self, node: Node, index: int, data: bytes, word: int) -> None:
        stored = self.files[node.sha256]
        if index == 0:
            stored.start, stored.words = self.out.tell(), []
            self.hashers[node.sha256] = hashlib.sha256()
            self.counts["files_compressed"] += 1
        stored.words.append(word)
        hasher = self.hashers[node.sha256]
        hasher.update(data)
        self.out.write(data)
        if len(stored.words) * BLOCK_SIZE >= node.st.st_size:
            stored.digest = self.hashers.pop(node.sha256).hexdigest()
        self.counts["blocks_compressed"] += 1
        self.done_blocks += 1
        self._progress()

    def _progress(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self.last_said >= TICK_S:
            self.last_said = now
            percent = 100 * self.done_blocks // max(self.total_blocks, 1)
            self.say(f"squashfs: {percent}% ({self.done_blocks}/{self.total_blocks} blocks, "
                     f"{self.counts['blocks_reused']} reused, {now - self.started:.0f}s)")


# --- inodes and directories ----------------------------------------------------------------------------

class Tables:
    """The inode and directory tables and the id table, written in inode order."""

    def __init__(self, mtime: Optional[int], codec: Codec):
        self.mtime = mtime
        self.codec = codec
        self.inodes = MetaWriter(codec)
        self.dirs = MetaWriter(codec)
        self.ids: dict[int, int] = {}

    def id_index(self, value: int) -> int:
        if value not in self.ids:
            if len(self.ids) >= 1 << 16:
                raise WriterError("more than 65536 distinct uids and gids: squashfs cannot index them")
            self.ids[value] = len(self.ids)
        return self.ids[value]

    def header(self, node: Node, itype: int) -> bytes:
        st = node.st
        when = self.mtime if self.mtime is not None else min(max(int(st.st_mtime), 0), 0xFFFFFFFF)
        return struct.pack("<HHHHII", itype, stat.S_IMODE(st.st_mode), self.id_index(st.st_uid),
                           self.id_index(st.st_gid), when, node.number)

    def add(self, node: Node, files: dict[str, Stored], parent: int) -> None:
        node.ref = self.inodes.ref()
        if node.kind == DIR:
            self.inodes.write(self._directory(node, parent))
        elif node.kind == FILE:
            self.inodes.write(self._file(node, files))
        elif node.kind == SYMLINK:
            target = os.readlink(node.path)
            self.inodes.write(self.header(node, SYMLINK) + struct.pack("<II", node.nlink, len(target)) + target)
        elif node.kind in (BLKDEV, CHRDEV):
            rdev = node.st.st_rdev
            major, minor = os.major(rdev), os.minor(rdev)
            encoded = (major << 8) | (minor & 0xFF) | ((minor & ~0xFF) << 12)
            self.inodes.write(self.header(node, node.kind) + struct.pack("<II", node.nlink, encoded))
        else:
            self.inodes.write(self.header(node, node.kind) + struct.pack("<I", node.nlink))

    def _file(self, node: Node, files: dict[str, Stored]) -> bytes:
        size = node.st.st_size
        stored = files.get(node.sha256) if size else None
        start, words = (stored.start, stored.words) if stored else (0, [])
        sizes = struct.pack(f"<{len(words)}I", *words)
        if size < 1 << 32 and start < 1 << 32 and node.nlink == 1:
            return self.header(node, FILE) + struct.pack("<IIII", start, NO_FRAG, 0, size) + sizes
        return (self.header(node, FILE + EXTENDED) +
                struct.pack("<QQQIIII", start, size, 0, node.nlink, NO_FRAG, 0, NO_XATTR) + sizes)

    def _directory(self, node: Node, parent: int) -> bytes:
        block, offset = self.dirs.position()
        listing, index = directory_listing(node.children)
        first = len(self.dirs.starts) * METADATA_SIZE + offset  # the listing's uncompressed position
        self.dirs.write(listing)
        nlink = 2 + sum(1 for c in node.children if c.kind == DIR)
        size = len(listing) + 3
        # mksquashfs 4.5 writes an extended inode for a listing with an index or over 256 entries (found
        # by probing it: 256 entries basic, 257 extended); the same choice keeps the bytes equal to its.
        if size <= 0xFFFF and not index and len(node.children) <= MAX_RUN:
            return self.header(node, DIR) + struct.pack("<IIHHI", block, nlink, size, offset, parent)
        entries = b"".join(struct.pack("<III", at, self.dirs.block_start((first + at) // METADATA_SIZE),
                                       len(name) - 1) + name for at, name in index)
        return (self.header(node, DIR + EXTENDED) +
                struct.pack("<IIIIHHI", nlink, size, block, parent, len(index), offset, NO_XATTR) + entries)


def directory_listing(children: list[Node]) -> tuple[bytes, list[tuple[int, bytes]]]:
    """(the listing: runs of a header and its entries, the index: (offset of a run, its first name) of
    each run that starts because the listing crossed 8 KiB since the last such run)."""
    out = bytearray()
    index: list[tuple[int, bytes]] = []
    run_at, run_count, run_block, run_base = -1, 0, -1, 0
    since = 0
    for child in children:
        inode = child.first or child
        block, number = inode.ref >> 16, inode.number
        entry_size = 8 + len(child.name)
        crosses = run_at >= 0 and len(out) + entry_size - since > METADATA_SIZE
        if (run_at < 0 or run_count == MAX_RUN or block != run_block or crosses
                or not -32768 <= number - run_base <= 32767):
            if run_at >= 0:
                struct.pack_into("<I", out, run_at, run_count - 1)
            if crosses:
                index.append((len(out), child.name))
                since = len(out)
            run_at, run_count, run_block, run_base = len(out), 0, block, number
            out += struct.pack("<IIi", 0, block, number)
        out += struct.pack("<HhHH", inode.ref & 0xFFFF, number - run_base, inode.kind, len(child.name) - 1)
        out += child.name
        run_count += 1
    if run_at >= 0:
        struct.pack_into("<I", out, run_at, run_count - 1)
    return bytes(out), index


def _number(node: Node, next_number: int) -> int:
    """Number NODE's entries from NEXT_NUMBER as mksquashfs does: each entry in name order, a directory's
    own subtree right after it; a hard link takes its first link's number.  The next free number."""
    for child in node.children:
        if child.first is not None:
            continue
        child.number = next_number
        next_number += 1
        if child.kind == DIR:
            next_number = _number(child, next_number)
    return next_number


def _write_inodes(node: Node, tables: Tables, files: dict[str, Stored], parent: int) -> None:
    """Post-order: a directory's entries (their inodes and listings) before the directory's own inode."""
    for child in node.children:
        if child.kind == DIR:
            _write_inodes(child, tables, files, node.number)
        elif child.first is None:
            tables.add(child, files, node.number)
    tables.add(node, files, parent)


def _lookup_table(codec: Codec, start: int, entries: bytes) -> tuple[bytes, int]:
    """(metadata blocks of ENTRIES then the u64 list of their positions, the list's position) at START."""
    meta = MetaWriter(codec)
    meta.write(entries)
    blocks = meta.finish()
    positions = b"".join(struct.pack("<Q", start + s) for s in meta.starts)
    return blocks + positions, start + len(blocks)


# --- the image -----------------------------------------------------------------------------------------

def write_image(root: Path, out_path: Path, *, compressor: str = GZIP, level: Optional[int] = None,
                mtime: Optional[int] = None, mkfs_time: int = 0, store: Optional[BlockSource] = None,
                workers: Optional[int] = None, say: Callable[[str], None] = lambda _line: None) -> WriteResult:
    """Write ROOT as a squashfs image to OUT_PATH (replaced), compressed with COMPRESSOR at LEVEL (None:
    mksquashfs' default).  MTIME: every inode's time (mksquashfs' -all-time), else each entry's own;
    MKFS_TIME: the superblock's.  STORE: blocks of earlier images, made with these params."""
    comp = codec(compressor, level)
    if store is not None and store.params != comp.params():
        # a block made with other params would decompress wrong or differ from a fresh write: never mixed
        raise WriterError(f"a block store of {store.params} given to a write with {comp.params()}")
    rootnode, order, xattrs = scan(root)
    rootnode.number = _number(rootnode, 1)
    files = [n for n in order if n.kind == FILE]
    workers = workers or os.cpu_count() or 1
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="squashfs") as pool:
        t = time.monotonic()
        _hash_all(files, pool, say)
        say(f"squashfs: {len(order)} inodes, {len(files)} files hashed ({time.monotonic() - t:.0f}s)")
        with open(out_path, "wb") as out:
            out.write(bytes(SUPERBLOCK.size))
            if comp.options:  # mksquashfs' place for them: an uncompressed metadata block after the superblock
                out.write(struct.pack("<H", len(comp.options) | UNCOMPRESSED_META) + comp.options)
            data = DataWriter(out, pool, workers, comp, store, say)
            data.write_all(files)
            data_end = out.tell()
            tables = Tables(mtime, comp)
            _write_inodes(rootnode, tables, data.files, len(order) + 1)
            size = _write_tables(out, tables, rootnode, len(order), mkfs_time, data_end)
    data._progress(force=True)
    return WriteResult(size=size, data_end=data_end, files=data.files, params=comp.params(),
                       xattrs_dropped=dict(sorted(xattrs.items())), **data.counts)


def _write_tables(out: BinaryIO, tables: Tables, rootnode: Node, inodes: int, mkfs_time: int,
                  data_end: int) -> int:
    inode_table = tables.inodes.finish()
    dir_table = tables.dirs.finish()
    inode_start = data_end
    dir_start = inode_start + len(inode_table)
    frag_start = dir_start + len(dir_table)  # no fragments: where their (empty) table would be
    ids = b"".join(struct.pack("<I", value) for value in tables.ids)
    id_blob, id_start = _lookup_table(tables.codec, frag_start, ids)
    bytes_used = frag_start + len(id_blob)
    out.write(inode_table)
    out.write(dir_table)
    out.write(id_blob)
    out.write(bytes(-bytes_used % PAD))
    flags = FLAG_NO_FRAGMENTS | FLAG_DUPLICATES | FLAG_NO_XATTRS | (FLAG_COMP_OPT if tables.codec.options else 0)
    out.seek(0)
    out.write(SUPERBLOCK.pack(0x73717368, inodes, mkfs_time, BLOCK_SIZE, 0, tables.codec.ident, BLOCK_LOG, flags,
                              len(tables.ids), 4, 0, rootnode.ref, bytes_used, id_start, INVALID, inode_start,
                              dir_start, frag_start, INVALID))
    return bytes_used + (-bytes_used % PAD)

"""Compressed squashfs blocks of earlier images, found by the content of the file they hold, so the
writer (sif/squashfs_writer.py) compresses only the files that changed since an earlier build.

Shape, chosen for a rebuild after an edit: the image just written IS the store of its blocks.  A pack
is a directory of two files: `pack`, the image's data region copied as written (every file's blocks
back to back: nothing is recompressed or re-laid to make it), and `index.json`, {"params": what a
block depends on besides the data (compressor, level, block size, the compression library's version:
zlib's for gzip, zstandard's and its libzstd's for zstd: squashfs_writer.Codec.params), "files": {sha256 of a file's content: [offset in the pack, [its blocks' size words], sha256 of
those compressed bytes]}}.  No fragments in these images, so a file's blocks are its own and move to
the next image unchanged.  One pack per env name (the caller's key), replaced by each build: the
store holds what the last build of each env wrote, never a growing history, and a file shared by
several envs (the torch wheel's libraries) is found in any of their packs.  A store reads only the
packs whose params equal the build's: a gzip pack is never offered to a zstd build, nor one of
another libzstd (whose frames differ), and the writer refuses a store of other params outright.

Trust: a pack is read-only input from a cache a kill or a full disk may have damaged.  Every reused
file's compressed bytes are checked against the index's hash before they go into an image; a pack
that fails is named, not read again by this build, and reported (`bad`) for its owner to remove; the
file is compressed afresh, so a damaged pack costs time, never a wrong image.  Where packs live,
their size cap, eviction and the atomic publish are the phase cache's (builders/apptainer/
phase_cache.py): this module only reads and writes one pack's files.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from envport.sif import squashfs_writer as writer

PACK = "pack"
INDEX = "index.json"
FORMAT = 1


@dataclass(frozen=True)
class Hit:
    pack: int  # index into BlockStore.packs
    offset: int
    words: tuple[int, ...]
    digest: str


class BlockStore:
    """Read side: the packs under PACK_DIRS made with PARAMS (squashfs_writer.Codec.params, the build's), as
    one index by content."""

    def __init__(self, pack_dirs: Iterable[Path], params: dict, say: Callable[[str], None] = lambda _line: None):
        self.params = params
        self.say = say
        self.packs: list[Path] = []
        self.fds: list[int] = []
        self.index: dict[str, Hit] = {}
        self.bad: dict[Path, str] = {}  # pack directory -> why it is not used
        self._lock = threading.Lock()
        for folder in pack_dirs:
            self._load(Path(folder))

    def _load(self, folder: Path) -> None:
        try:
            doc = json.loads((folder / INDEX).read_text(encoding="utf-8"))
            fd = os.open(folder / PACK, os.O_RDONLY)
        except (OSError, ValueError) as exc:
            self._mark_bad(folder, f"unreadable ({exc})")
            return
        if doc.get("format") != FORMAT or doc.get("params") != self.params:
            os.close(fd)
            return  # blocks of another compressor, level, block size or library version: not these bytes
        n = len(self.packs)
        self.packs.append(folder)
        self.fds.append(fd)
        for sha, (offset, words, digest) in doc.get("files", {}).items():
            self.index.setdefault(sha, Hit(n, int(offset), tuple(int(w) for w in words), str(digest)))

    def _mark_bad(self, folder: Path, why: str) -> None:
        with self._lock:
            if folder in self.bad:
                return
            self.bad[folder] = why
        self.say(f"squash blocks: pack {folder} is not used: {why}; its files are compressed afresh")

    def has(self, sha256: str, size: int) -> bool:
        hit = self.index.get(sha256)
        return hit is not None and len(hit.words) == -(-size // writer.BLOCK_SIZE) and \
            self.packs[hit.pack] not in self.bad

    def fetch(self, sha256: str, size: int) -> Optional[tuple[bytes, list[int]]]:
        """The checked compressed blocks of content SHA256, or None (not kept, or its pack is damaged:
        named once, then never read again by this store)."""
        if not self.has(sha256, size):
            return None
        hit = self.index[sha256]
        length = sum(w & ~writer.UNCOMPRESSED_BLOCK for w in hit.words)
        try:
            data = os.pread(self.fds[hit.pack], length, hit.offset)
        except OSError as exc:
            self._mark_bad(self.packs[hit.pack], f"cannot be read ({exc})")
            return None
        if len(data) != length or hashlib.sha256(data).hexdigest() != hit.digest:
            self._mark_bad(self.packs[hit.pack], f"the blocks of content {sha256[:12]} at byte {hit.offset} "
                                                 "do not match the hash its index.json records (damaged)")
            return None
        return data, list(hit.words), hit.digest

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []


def write_pack(folder: Path, image: Path, result: writer.WriteResult) -> None:
    """Keep IMAGE's data region and its index in FOLDER (a fresh directory the caller publishes whole)."""
    with open(image, "rb") as src, open(folder / PACK, "wb") as dst:
        remaining = result.data_end
        while remaining:
            chunk = src.read(min(remaining, 8 << 20))
            if not chunk:
                raise OSError(f"{image}: ended before its data region's {result.data_end} bytes")
            dst.write(chunk)
            remaining -= len(chunk)
    files = {sha: [s.start, s.words, s.digest] for sha, s in sorted(result.files.items())}
    doc = {"format": FORMAT, "params": result.params, "files": files}
    (folder / INDEX).write_text(json.dumps(doc, separators=(",", ":")), encoding="utf-8")


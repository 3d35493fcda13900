"""A downloaded blob written to disk as it arrives: the caller's thread reads the network, one thread
hashes (sha256), one thread writes; the file is on disk when `close()` returns its digest.

Why three threads: pulling over TLS on two cores, the sha256 (~1.5 GB/s) is the slowest stage, and the
hash, the write and TLS's decryption all release the GIL. Why O_DIRECT: page-aligned blocks written at
aligned offsets go straight to the disk while the next ones arrive, so the closing fsync has only the
metadata left; buffered writes leave the whole file to that fsync. A 281 MB SIF from the test registry,
median of 6 on a 2-core host: 0.58 s buffered + fsync, 0.46 s O_DIRECT; the serial loop (read, hash,
write, fsync on one thread) 0.67 s. O_DIRECT leaves the file out of the page cache, so the signature
check that reads it next reads the disk: still ahead, pull + check of a signed 281 MB SIF 0.70 s
against 0.85 s buffered (median of 5). Buffers are never refilled while a write of them is in flight
(both threads hand a buffer back before it is reused), which O_DIRECT on checksumming file systems needs.
O_DIRECT is used on local block-device file systems only (LOCAL_FS, from /proc/self/mountinfo): on
network ones (NFS, Lustre, GPFS) it makes each write a synchronous round trip and it was not measured
there. A file system that refuses O_DIRECT anyway (EINVAL at open or at a write) gets buffered writes
and the same fsync, not an error.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import mmap
import os
import queue
import threading

from envport.core.files import fs_type

BLOCK = 4 << 20  # a multiple of every logical block size O_DIRECT asks alignment to
BUFFERS = 8
O_DIRECT = getattr(os, "O_DIRECT", 0)


LOCAL_FS = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "f2fs"})


def open_new(path: os.PathLike) -> int:
    """PATH created (it must not exist), write-only, mode 0600; O_DIRECT on a local block-device file
    system that takes it."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    if O_DIRECT and fs_type(os.path.dirname(os.path.abspath(path))) in LOCAL_FS:
        try:
            return os.open(path, flags | O_DIRECT, 0o600)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
    return os.open(path, flags, 0o600)


class BlobWriter:
    """Bytes given to `write` in order, in blocks: each block is hashed and written by its own thread while
    the caller fills the next one. Failures of either thread are raised by the next `write` or by `close`."""

    def __init__(self, fd: int, block: int = BLOCK, buffers: int = BUFFERS):
        self.fd, self.block = fd, block
        self.direct = bool(O_DIRECT and fcntl.fcntl(fd, fcntl.F_GETFL) & O_DIRECT)
        self._sha = hashlib.sha256()
        self._buffers = [mmap.mmap(-1, block) for _ in range(buffers)]  # page-aligned, as O_DIRECT needs
        self._free: queue.Queue = queue.Queue()
        for index in range(buffers):
            self._free.put(index)
        self._to_hash: queue.Queue = queue.Queue()
        self._to_write: queue.Queue = queue.Queue()
        self._users = [0] * buffers  # how many of the two threads still read buffer i
        self._lock = threading.Lock()
        self._failed: list[BaseException] = []
        self._aborted = False
        self._current, self._filled, self._offset = None, 0, 0  # the buffer being filled; where it lands
        self.bytes = 0
        self._threads = [threading.Thread(target=self._hash_loop, daemon=True),
                         threading.Thread(target=self._write_loop, daemon=True)]
        for thread in self._threads:
            thread.start()

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            if self._failed:
                raise self._failed[0]
            if self._current is None:
                self._current, self._filled = self._free.get(), 0
            take = min(len(view), self.block - self._filled)
            self._buffers[self._current][self._filled:self._filled + take] = view[:take]
            self._filled += take
            view = view[take:]
            if self._filled == self.block:
                self._queue()
        self.bytes += len(data)

    def close(self) -> str:
        """Queue the last part-block, wait for both threads, fsync; the sha256 hex of every byte written."""
        if self._current is not None and self._filled:
            self._queue()
        self._stop()
        if self._failed:
            raise self._failed[0]
        os.fsync(self.fd)  # the bytes are on disk before a rename makes them the final file
        return self._sha.hexdigest()

    def abort(self) -> None:
        """Stop both threads, skipping what is queued, without the fsync (the caller removes the file)."""
        self._aborted = True
        self._stop()

    def __enter__(self) -> "BlobWriter":
        return self

    def __exit__(self, kind, *_exc) -> None:
        if kind is not None:
            self.abort()

    # --- the two threads --------------------------------------------------------------------

    def _queue(self) -> None:
        index, n, offset = self._current, self._filled, self._offset
        self._users[index] = 2
        self._to_hash.put((index, n))
        self._to_write.put((index, n, offset))
        self._offset += n
        self._current, self._filled = None, 0

    def _stop(self) -> None:
        if self._threads:
            self._to_hash.put(None)
            self._to_write.put(None)
            for thread in self._threads:
                thread.join()
            self._threads = []

    def _done_with(self, index: int) -> None:
        with self._lock:
            self._users[index] -= 1
            if not self._users[index]:
                self._free.put(index)

    def _hash_loop(self) -> None:
        while (item := self._to_hash.get()) is not None:
            index, n = item
            try:
                if not (self._failed or self._aborted):
                    with memoryview(self._buffers[index])[:n] as view:
                        self._sha.update(view)
            except BaseException as exc:  # raised in the caller's thread by its next write or close
                self._failed.append(exc)
            finally:
                self._done_with(index)

    def _write_loop(self) -> None:
        while (item := self._to_write.get()) is not None:
            index, n, offset = item
            try:
                if not (self._failed or self._aborted):
                    with memoryview(self._buffers[index])[:n] as view:
                        self._write_at(view, offset)
            except BaseException as exc:
                self._failed.append(exc)
            finally:
                self._done_with(index)

    def _write_at(self, view: memoryview, offset: int) -> None:
        if self.direct and len(view) % self.block:
            self._buffered()  # the last part-block: O_DIRECT takes whole aligned blocks only
        while view:
            try:
                n = os.pwrite(self.fd, view, offset)
            except OSError as exc:
                if not (self.direct and exc.errno == errno.EINVAL):
                    raise
                self._buffered()  # a file system that opens O_DIRECT files but refuses their writes
                continue
            view, offset = view[n:], offset + n

    def _buffered(self) -> None:
        fcntl.fcntl(self.fd, fcntl.F_SETFL, fcntl.fcntl(self.fd, fcntl.F_GETFL) & ~O_DIRECT)
        self.direct = False

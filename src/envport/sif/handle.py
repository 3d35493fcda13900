"""One open SIF: the file descriptor that every read, digest, extraction and mount of it goes through.

A SIF judged by path and mounted by path can be swapped between the two (the owner of its folder renames
another file over it; a Slurm task mounts minutes later).  apptainer opens the image once and hands that
descriptor to its starter; envport does the same: `SifFile.open` resolves the path once, opens it with
O_NOFOLLOW (a link swapped in after the resolution is refused, not followed), and from then on nothing
reopens the name:

- reads are `pread` on the descriptor (`read`, `chunks`, `digest`);
- a child that must read the file (unsquashfs, squashfuse, mount) gets the descriptor itself and the
  path `/proc/self/fd/N` (`child_path`, `pass_fds`): the kernel resolves that to the open file, whatever
  the name now points at (measured: a renamed-over file still mounts the bytes that were opened);
- a task on another node cannot share the descriptor: it reopens the path and mounts only when the file it
  opened is the same inode, unchanged since the check (`identity`: inode, size and ctime, which no user
  can set back; witness/launchers/sif.py TASK).

What a descriptor cannot stop is the file's OWNER rewriting its bytes in place after the check; and a
folder another user can write lets that user swap the name for the tasks that reopen it.  `unsafe`
names both (a file or any folder above it that a user other than this one or root can write), and the
trust gate (sif/gate.py) refuses such a SIF (`sif_unsafe`).
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from pathlib import Path
from typing import Iterator

from envport.core.errors import ReasonError
from envport.core.private import not_private

CHUNK = 8 << 20


class SifError(ReasonError):
    """A file that is not a usable SIF; `reason` is a stable one-word token."""


def _open_error(path: Path, exc: OSError) -> SifError:
    if exc.errno == errno.ENOENT:
        return SifError("not_found", f"{path}: no such file")
    if exc.errno == errno.ELOOP:
        return SifError("not_a_file", f"{path}: became a symbolic link while it was being opened; "
                                      "nothing was read (open the file itself)")
    return SifError("unreadable", f"{path}: cannot open ({exc.strerror})")


class SifFile:
    """An open, regular SIF file; `path` is the name it was opened by (for messages only)."""

    def __init__(self, path: Path, real: Path, fd: int, st: os.stat_result):
        self.path = path
        self.real = real  # the name resolved once, before the open
        self.fd = fd
        self.size = st.st_size
        self.st = st
        self._digests: dict[tuple[int, int, str], str] = {}

    @classmethod
    def open(cls, path: str | os.PathLike) -> "SifFile":
        """PATH resolved once and opened read-only, without following a link; SifError when it is not a
        readable regular file.  O_NONBLOCK: a FIFO planted under the name does not hang the open."""
        shown = Path(path)
        try:
            real = Path(os.path.realpath(shown))
        except OSError as exc:
            raise _open_error(shown, exc) from None
        try:
            fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError as exc:
            raise _open_error(shown, exc) from None
        try:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                raise SifError("not_a_file", f"{shown}: is a directory (a sandbox?), not a SIF file; "
                                             "pass the .sif file itself")
            if not stat.S_ISREG(st.st_mode):
                raise SifError("not_a_file", f"{shown}: not a regular file")
            os.set_blocking(fd, True)
        except BaseException:
            os.close(fd)
            raise
        return cls(shown, real, fd, st)

    # --- reading ---------------------------------------------------------------------------------------

    def read(self, offset: int, size: int) -> bytes:
        """SIZE bytes at OFFSET (fewer at the end of the file)."""
        out = bytearray()
        while len(out) < size:
            try:
                chunk = os.pread(self.fd, min(size - len(out), CHUNK), offset + len(out))
            except OSError as exc:
                raise SifError("unreadable", f"{self.path}: read failed ({exc.strerror})") from None
            if not chunk:
                break
            out += chunk
        return bytes(out)

    def chunks(self, offset: int, size: int) -> Iterator[bytes]:
        """The bytes [OFFSET, OFFSET+SIZE) in CHUNK pieces; stops early at the end of the file."""
        done = 0
        while done < size:
            chunk = self.read(offset + done, min(size - done, CHUNK))
            if not chunk:
                return
            yield chunk
            done += len(chunk)

    def digest(self, offset: int, size: int, hash_name: str = "sha256") -> str:
        """The hex digest of [OFFSET, OFFSET+SIZE), computed once per open file (a signature check and the
        content check both need the partition's; hashing a GB twice costs seconds)."""
        key = (offset, size, hash_name)
        if key not in self._digests:
            h = hashlib.new(hash_name)
            for chunk in self.chunks(offset, size):
                h.update(chunk)
            self._digests[key] = h.hexdigest()
        return self._digests[key]

    # --- handing the file to children -------------------------------------------------------------------

    @property
    def child_path(self) -> str:
        """The path a child given `pass_fds` opens to reach this very file (the same number in the child)."""
        return f"/proc/self/fd/{self.fd}"

    @property
    def pass_fds(self) -> tuple[int, ...]:
        return (self.fd,)

    @property
    def identity(self) -> str:
        """inode:size:ctime (seconds.nanoseconds, as GNU `stat -c %i:%s:%.9Z` prints it): what a task that
        reopens the path compares before it mounts.  ctime moves on every write and cannot be set back."""
        ns = self.st.st_ctime_ns
        return f"{self.st.st_ino}:{self.st.st_size}:{ns // 10**9}.{ns % 10**9:09d}"

    def unchanged(self) -> bool:
        """Nobody wrote, truncated or chmod-ed the open file since it was opened."""
        st = os.fstat(self.fd)
        return (st.st_size, st.st_ctime_ns, st.st_mtime_ns) == (self.st.st_size, self.st.st_ctime_ns,
                                                               self.st.st_mtime_ns)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __del__(self):
        try:
            self.close()
        except OSError:
            pass

    def __enter__(self) -> "SifFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def unsafe(sif: SifFile) -> str:
    """Why another user could change SIF's bytes or swap its name after the check, or '' when nobody can:
    the file is this user's or root's and only they can write it; every folder from / down to it is owned by
    this user or root and writable by others only with the sticky bit (/tmp: there only an entry's owner may
    rename or remove it): the rule envport applies to every folder it trusts (core/private.py)."""
    me = os.geteuid()
    if sif.st.st_uid not in (me, 0):
        return f"{sif.path} is owned by uid {sif.st.st_uid}: its owner can rewrite it after the check"
    if sif.st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{sif.path} is writable by others ({stat.filemode(sif.st.st_mode)}): they can rewrite it after the check"
    folder = sif.real.parent
    for d in [folder, *folder.parents]:
        why = not_private(str(d), "parent")
        if why:
            return f"the folder {d} {why}: another user can put another file under the SIF's name"
    return ""

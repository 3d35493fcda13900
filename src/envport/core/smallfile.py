"""A small file a person names (a key, a keyring): a regular file under a size cap, read without blocking.

`--key /dev/zero` read whole eats the machine's memory; a FIFO's open and read wait for a writer that
never comes; a directory is a slip. So the name is checked with stat (which never blocks), opened
O_NONBLOCK, checked again on the descriptor (the name may have been swapped since), and at most the cap
plus one byte is read. spec/yamlfile.py reads specs and site profiles the same way.
"""

from __future__ import annotations

import os
import stat

MIB = 1 << 20
# A key file (PEM, or a PGP keyring): an RSA-16384 key in PEM is ~13 KB, a keyring of many PGP keys some
# hundred KB; nothing larger is a key. sif/keys.py reads keys under it, plan/site.py checks trust.keys with it.
MAX_KEY_BYTES = MIB


class NotASmallFile(ValueError):
    """What the file is instead ("a FIFO (named pipe)", "larger than 1 MiB (N bytes)"), without its name."""


def _size(n: int) -> str:
    return f"{n // MIB} MiB" if n % MIB == 0 else f"{n} bytes"


def problem(st: os.stat_result, cap: int) -> str | None:
    """Why a file of this stat is not a regular file of at most CAP bytes, or None."""
    mode = st.st_mode
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if not stat.S_ISREG(mode):
        return "not a regular file"
    if st.st_size > cap:
        return f"larger than {_size(cap)} ({st.st_size} bytes)"
    return None


def read_small(path: str | os.PathLike, cap: int) -> bytes:
    """The bytes of the regular file PATH, at most CAP of them; NotASmallFile (what it is instead) or OSError
    (it cannot be opened). Never blocks, never reads more than CAP + 1 bytes."""
    why = problem(os.stat(path), cap)
    if why:
        raise NotASmallFile(why)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        why = problem(os.fstat(fd), cap)
        if why:
            raise NotASmallFile(why)
        chunks, size = [], 0
        while size <= cap:
            chunk = os.read(fd, min(65536, cap + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > cap:
        raise NotASmallFile(f"larger than {_size(cap)} (it grew while being read)")
    return b"".join(chunks)

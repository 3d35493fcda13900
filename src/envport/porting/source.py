"""Read a recipe to import: bounded, never blocking, never a traceback.

A recipe is small text a person wrote; anything else (a 5 MB file, a binary,
a FIFO, bytes that are not UTF-8) ends in one `ImportRefused` naming the file
and what was expected, before any parser spends time on it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from envport.core.errors import EnvportError

# Far above real recipes (the largest Dockerfiles in big ML repos are ~20 KB);
# a bound that keeps every parser's work small, not a style rule.
MAX_BYTES = 1024 * 1024


class ImportRefused(EnvportError):
    """An input envport will not read; exit 2 (usage), message says why and what to do."""


def read_text(path: Path, label: str, limit: int = MAX_BYTES) -> str:
    try:
        st = os.stat(path)
    except OSError as exc:
        raise ImportRefused(f"{label}: cannot read it ({exc.strerror.lower() if exc.strerror else exc})") from None
    if stat.S_ISDIR(st.st_mode):
        raise ImportRefused(f"{label}: is a directory; name the recipe file inside it (e.g. {label}/Dockerfile)")
    if not stat.S_ISREG(st.st_mode):
        raise ImportRefused(f"{label}: not a regular file (a FIFO, socket or device); import a recipe file")
    if st.st_size > limit:
        raise ImportRefused(f"{label}: {st.st_size / 1e6:.1f} MB is more than a recipe ({limit // 1024} KiB at most); "
                            "import the recipe itself, not a log, archive or generated file")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as fh:
            data = fh.read(limit + 1)
    except OSError as exc:
        raise ImportRefused(f"{label}: cannot read it ({exc.strerror or exc})") from None
    if len(data) > limit:
        raise ImportRefused(f"{label}: grew past {limit // 1024} KiB while being read; import a file that is not "
                            "being written")
    return decode(data, label)


def decode(data: bytes, label: str) -> str:
    if b"\0" in data[:8192] or b"\0" in data:
        raise ImportRefused(f"{label}: a binary file (it holds NUL bytes); import a text recipe (Dockerfile, .def, "
                            "environment.yml, requirements file or shell script)")
    try:
        # A leading UTF-8 byte order mark is dropped, as docker (BuildKit) and pip drop it: kept, it
        # would be part of the first instruction or requirement (`\ufeffFROM`, `\ufeffnumpy`).
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ImportRefused(f"{label}:{line}: byte 0x{data[exc.start]:02x} is not UTF-8; save the file as UTF-8 "
                            "(e.g. `iconv -f latin1 -t utf-8`)") from None

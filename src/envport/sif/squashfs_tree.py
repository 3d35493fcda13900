"""What a squashfs partition inside a SIF holds, read with squashfs-tools' `unsquashfs`, never mounted.

Chosen by measurement (tiny-sif, 12,862 entries): `unsquashfs -o OFFSET -lln` lists every entry in
0.04 s; `-pf` (a pseudo file) writes every file's data too (213 MB for that image); PySquashfsImage 0.9.0
cannot read lz4 partitions (it calls lz4's frame decoder on block data).  squashfs-tools is already what
the builder needs (mksquashfs), and `unsquashfs` reads the image without the kernel, as any user.

`-lln` prints one line per entry: `MODE UID/GID SIZE DATE TIME squashfs-root/PATH[ -> TARGET]`.  A file
name may hold any byte but `/` and NUL, so the parser is strict: the path must start `squashfs-root`, a
symlink's target is exactly SIZE characters at the end (names holding ` -> ` parse right), and a name
with a newline leaves a line that does not parse, which is reported, never skipped silently (its
first part could pose as a `*.dist-info` directory).
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass

from envport.core.proc import run
from envport.sif.handle import SifError, SifFile

LIST_TIMEOUT = 300
CAT_LIMIT = 1 << 20
_LINE = re.compile(rb"(?P<mode>[-dlcbps][-rwxsStT]{9}) (?P<uid>\d+)/(?P<gid>\d+) +"
                   rb"(?P<size>\d+|\d+, *\d+) \d{4}-\d\d-\d\d \d\d:\d\d (?P<rest>squashfs-root(?:/.*)?)\Z",
                   re.DOTALL)
ROOT = b"squashfs-root"


@dataclass(frozen=True)
class Entry:
    path: str  # absolute inside the image: "/usr/bin/su"
    kind: str  # ls's type letter: - d l c b p s
    mode: str  # ls's ten characters: "-rwsr-xr-x"
    uid: int
    gid: int
    size: int  # bytes (0 for a device)
    target: str = ""  # a symlink's target
    device: str = ""  # "major,minor" of a device node

    @property
    def setid(self) -> str:
        """"setuid", "setgid", "setuid+setgid" or ""."""
        bits = [n for n, ch in (("setuid", self.mode[3]), ("setgid", self.mode[6])) if ch in "sS"]
        return "+".join(bits)

    @property
    def world_writable(self) -> bool:
        return self.mode[8] == "w"

    @property
    def sticky(self) -> bool:
        return self.mode[9] in "tT"


def _unsquashfs() -> str:
    tool = shutil.which("unsquashfs")
    if tool is None:
        raise SifError("missing_tool", "unsquashfs not found: reading the image's own files needs it "
                                       "(apt-get install squashfs-tools)")
    return tool


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def parse_listing(out: bytes) -> tuple[list[Entry], list[str]]:
    """(entries, lines that did not parse) of `unsquashfs -lln` output; a symlink's SIZE counts bytes."""
    entries, odd = [], []
    for line in out.split(b"\n"):
        if not line:
            continue
        m = _LINE.match(line)
        if m is None:
            odd.append(_text(line))
            continue
        mode, rest = _text(m["mode"]), m["rest"]
        size, target, device = m["size"], b"", ""
        if b"," in size:
            device, size = _text(size.replace(b" ", b"")), b"0"
        elif mode[0] == "l":
            n = int(size)
            if n == 0 or len(rest) < n + 4 or rest[-n - 4:-n] != b" -> ":
                odd.append(_text(line))
                continue
            rest, target = rest[:-n - 4], rest[-n:]
        path = "/" + _text(rest[len(ROOT) + 1:]) if rest != ROOT else "/"
        entries.append(Entry(path, mode[0], mode, int(m["uid"]), int(m["gid"]), int(size), _text(target), device))
    return entries, odd


def listing(sif: SifFile, offset: int) -> tuple[list[Entry], list[str]]:
    """Every entry of the squashfs at OFFSET in SIF, and the listing lines that did not parse.  unsquashfs
    reads the open file (its descriptor, inherited), never the name."""
    proc = run([_unsquashfs(), "-o", str(offset), "-lln", sif.child_path], binary=True, timeout=LIST_TIMEOUT,
               pass_fds=sif.pass_fds)
    if not proc.ok:
        err = (proc.stderr or proc.why).strip().splitlines()
        raise SifError("bad_squashfs", f"{sif.path}: unsquashfs cannot list the partition at byte {offset} "
                                       f"({err[-1] if err else f'exit {proc.returncode}'}): the image is "
                                       "damaged or not squashfs")
    return parse_listing(proc.stdout)


def read_file(sif: SifFile, offset: int, path: str, limit: int = CAT_LIMIT) -> bytes | None:
    """The bytes of the regular file PATH in the image (the caller checked the listing says so), or None
    when unsquashfs cannot give them.  -no-wildcards: a name from the image is a name, not a pattern."""
    proc = run([_unsquashfs(), "-o", str(offset), "-no-wildcards", "-cat", sif.child_path, path.lstrip("/")],
               binary=True, timeout=LIST_TIMEOUT, pass_fds=sif.pass_fds)
    if not proc.ok or len(proc.stdout) > limit:
        return None
    return proc.stdout

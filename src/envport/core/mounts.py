"""This process's mount table, as the kernel writes it in /proc/self/mountinfo."""

from __future__ import annotations

import re
from typing import NamedTuple

MOUNTINFO = "/proc/self/mountinfo"
_OCTAL = re.compile(r"\\([0-7]{3})")


class Mount(NamedTuple):
    point: str  # the mount point, its octal escapes decoded
    fs_type: str


def unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes (\\040 for a space)."""
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field)


def mounts(mountinfo: str = MOUNTINFO) -> list[Mount]:
    """Every mount of the table, in its order; OSError when it cannot be read."""
    found = []
    with open(mountinfo, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            fields, _, rest = line.partition(" - ")
            parts = fields.split()
            if len(parts) >= 5:
                found.append(Mount(unescape(parts[4]), (rest.split() or [""])[0]))
    return found


def inside(path: str, point: str) -> bool:
    """PATH is POINT or below it."""
    return path == point or path.startswith(point.rstrip("/") + "/")

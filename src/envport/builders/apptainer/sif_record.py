"""What this machine's own build wrote as a SIF: recorded in the user's state dir, read back with `os` alone.

A SIF's labels are claims anyone can write: a file dropped into a shared `sif_dir` under the env's name,
carrying its `envport.hash`, was reported `present` and then run.  So when envport writes a SIF it records,
under `$ENVPORT_STATE_DIR` (else `$XDG_STATE_HOME/envport`, else `~/.local/state/envport`) in `sifs/`, the
file's size, mtime, ctime and inode, the env's hash, the partition's sha256 and the SIF's object layout.
`present` (the no-op build, commands/fast.py, and builder.present) takes a file only while its stat
still equals that record: no edit, copy or rename-over leaves ctime and the inode alone, and comparing
them costs one stat.  `inspect` compares the partition's sha256 with it (corruption, not only forgery).

Not the site's `ledger_dir`: that may be shared between users, and this record is what one user trusts.
The no-op path reads it without json, pathlib or hashlib (the built-in blake2b names the file).
"""

from __future__ import annotations

import os

RECORD_HEADER = "envport-sif 1"
SUBDIR = "sifs"


def state_dir() -> str:
    explicit = os.environ.get("ENVPORT_STATE_DIR")
    if explicit:
        return os.path.expanduser(explicit)
    xdg = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(xdg, "envport")


def record_path(sif: str) -> str:
    try:
        from _blake2 import blake2b
    except ImportError:  # an interpreter built without it
        from hashlib import blake2b
    key = blake2b(os.path.realpath(sif).encode("utf-8", "surrogateescape"), digest_size=16).hexdigest()
    return os.path.join(state_dir(), SUBDIR, key)


def stamp(st: os.stat_result) -> str:
    return f"{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}:{st.st_dev}"


def write(sif: str, hash_: str, partition_sha256: str, layout: str) -> None:
    """After envport wrote SIF: its stamp, HASH_, the partition's sha256 and LAYOUT (one line)."""
    from envport.core.files import write_atomic

    real = os.path.realpath(sif)
    if any(c in real + layout for c in "\n\r"):
        return  # a path no line can hold is never recorded: present then checks the content
    write_atomic(record_path(sif), f"{RECORD_HEADER}\n{real}\n{hash_}\n{stamp(os.stat(sif))}\n"
                 f"{partition_sha256}\n{layout}\n", mode=0o600)


def read(sif: str) -> dict | None:
    """{path, hash, stamp, partition_sha256, layout} recorded for SIF's real path, or None."""
    try:
        with open(record_path(sif), encoding="utf-8") as fh:
            lines = fh.read().split("\n")
    except (OSError, ValueError):
        return None
    if len(lines) != 7 or lines[0] != RECORD_HEADER or lines[6] or lines[1] != os.path.realpath(sif):
        return None
    return {"path": lines[1], "hash": lines[2], "stamp": lines[3], "partition_sha256": lines[4], "layout": lines[5]}


def unchanged(sif: str, hash_: str) -> bool:
    """SIF is the very file this machine's build of HASH_ wrote, untouched since (one stat)."""
    rec = read(sif)
    if rec is None or rec["hash"] != hash_:
        return False
    try:
        return stamp(os.stat(sif)) == rec["stamp"]
    except OSError:
        return False


def forget(sif: str) -> None:
    """SIF was removed (`envport gc`): its record goes too, so no later file at that path inherits it."""
    try:
        os.unlink(record_path(sif))
    except FileNotFoundError:
        pass

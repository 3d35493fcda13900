"""What this machine's own build wrote as a SIF: recorded in the user's state dir, read back with `os` alone.

A SIF's labels are claims anyone can write: a file dropped into a shared `sif_dir` under the env's name,
carrying its `envport.hash`, was reported `present` and then run.  So when envport writes a SIF it records,
under `$ENVPORT_STATE_DIR` (else `$XDG_STATE_HOME/envport`, else `~/.local/state/envport`) in `sifs/`, the
file's size, mtime, ctime and inode, the env's hash, the partition's sha256 and the SIF's object layout.
`present` (the no-op build, commands/fast.py, and builder.present) takes a file only while its stat
still equals that record: no edit, copy or rename-over leaves ctime and the inode alone, and comparing
them costs one stat.  `inspect` compares the partition's sha256 with it (corruption, not only forgery).

Not the site's `ledger_dir`: that may be shared between users, and this record is what one user trusts.
So the state dir is held to the envs dir's rule (core/private.py): this user's alone, its parents owned by
this user or root and writable by others only with the sticky bit. One another user owns or can write
(`ENVPORT_STATE_DIR=/var/tmp/shared`) is refused, `state_dir_unsafe` (exit 3, naming the folder, its owner
and mode, and the fix): no record is read from it (a forged one would vouch for any file), none written.
The no-op build path (`unchanged`) does not refuse: it only answers "not known", and the full path refuses.
The no-op path reads it without json, pathlib or hashlib (the built-in blake2b names the file).
"""

from __future__ import annotations

import os

from envport.core.private import first_unsafe, make_private, not_private, owner_and_mode

RECORD_HEADER = "envport-sif 1"
SUBDIR = "sifs"


def state_dir() -> str:
    explicit = os.environ.get("ENVPORT_STATE_DIR")
    if explicit:
        return os.path.expanduser(explicit)
    xdg = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(xdg, "envport")


def unsafe() -> str | None:
    """Why the state dir (or its `sifs/`, or a parent) is not this user's alone, for people; None when it
    is, or does not exist yet (nothing to read; `write` makes it 0700 first)."""
    state = os.path.abspath(state_dir())
    if not os.path.isdir(state):
        return None
    found = first_unsafe(state)
    sifs = os.path.join(state, SUBDIR)
    if found is None and os.path.lexists(sifs):
        why = not_private(sifs, "dir")
        found = (sifs, why, False) if why else None
    if found is None:
        return None
    path, why, is_parent = found
    facts = owner_and_mode(path)
    if is_parent:
        return (f"{path} (a parent of the state dir {state}; {facts}) {why}: its owner can rename the state dir "
                "away and put forged build records (which vouch for any SIF) in its place; fix: put the state "
                "dir under a folder of your own (ENVPORT_STATE_DIR=DIR)")
    what = "the state dir" + (", $ENVPORT_STATE_DIR" if os.environ.get("ENVPORT_STATE_DIR") else "")
    what = f"{what}'s {SUBDIR}/" if path == sifs else what
    return (f"{path} ({what}; {facts}) {why}: another user could forge the build records envport trusts there "
            "(a forged one vouches for any SIF); fix: use a folder of your own (envport creates it 0700: "
            f"ENVPORT_STATE_DIR=DIR), or make this one yours: chown {_user()} '{path}' && chmod go-w '{path}'")


def _user() -> str:
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError):
        return str(os.getuid())


def require_safe() -> None:
    """Refuse (`state_dir_unsafe`, exit 3) a state dir that is not this user's alone (`unsafe`)."""
    why = unsafe()
    if why is not None:
        from envport.core.errors import EnvportError  # here: the no-op path never imports it

        raise EnvportError(f"REFUSED [state_dir_unsafe] {why}", exit_code=3)


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
    make_private(os.path.join(state_dir(), SUBDIR))
    require_safe()
    write_atomic(record_path(sif), f"{RECORD_HEADER}\n{real}\n{hash_}\n{stamp(os.stat(sif))}\n"
                 f"{partition_sha256}\n{layout}\n", mode=0o600)


def read(sif: str) -> dict | None:
    """{path, hash, stamp, partition_sha256, layout} recorded for SIF's real path, or None. Refuses
    (`require_safe`) a state dir another user owns or can write."""
    require_safe()
    return _read(sif)


def _read(sif: str) -> dict | None:
    try:
        with open(record_path(sif), encoding="utf-8") as fh:
            lines = fh.read().split("\n")
    except (OSError, ValueError):
        return None
    if len(lines) != 7 or lines[0] != RECORD_HEADER or lines[6] or lines[1] != os.path.realpath(sif):
        return None
    return {"path": lines[1], "hash": lines[2], "stamp": lines[3], "partition_sha256": lines[4], "layout": lines[5]}


def unchanged(sif: str, hash_: str) -> bool:
    """SIF is the very file this machine's build of HASH_ wrote, untouched since (one stat). False, not a
    refusal, when the state dir is unsafe: the no-op path then leaves it to the full path, which refuses."""
    if unsafe() is not None:
        return False
    rec = _read(sif)
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

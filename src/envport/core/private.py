"""Is a folder this user's alone? The envs-dir rule, for the folders envport trusts from Python.

A folder whose content envport trusts (the state dir's build records, sif/record.py) must be one no other
user can write into, nor rename away: where another user made it first (a shared /var/tmp path) or can
write it, what envport reads back there could be theirs. The rule is the one the setup scripts apply to
the envs dir and the tools dir (renderers/setup.sh.j2 `not_private`, which runs on hosts without envport,
so it stays shell; tests/test_trust_hostile.py runs both on the same folders and holds them equal):

- the folder itself: owned by this user (a symlink to it too), writable by no one else (group or others);
- each parent: owned by this user or root (a symlink and what it names alike), writable by others only
  with the sticky bit (`/tmp`), so no other user can rename the folder away.

os and stat only: `envport build`'s no-op path (commands/fast.py) reads a build record through this.
"""

from __future__ import annotations

import os
import stat


def not_private(path: str, role: str) -> str:
    """Why PATH is not this user's alone, or "": ROLE "dir" (the folder itself) or "parent"."""
    me = os.getuid()
    try:
        link_owner = os.lstat(path).st_uid
        st = os.stat(path)
    except OSError:
        return "cannot be checked (stat failed)"
    owner, mode = st.st_uid, st.st_mode
    shown_mode = stat.filemode(mode)
    if role == "parent":
        if link_owner not in (me, 0) or owner not in (me, 0):
            return f"is owned by uid {link_owner} (what it names: uid {owner})"
        if mode & (stat.S_IWGRP | stat.S_IWOTH) and not mode & stat.S_ISVTX:
            return f"is writable by others ({shown_mode}) without the sticky bit"
        return ""
    if link_owner != me:
        return f"is owned by uid {link_owner}, not by this user (uid {me})"
    if owner != me:
        return f"is a link to a folder owned by uid {owner}, not by this user (uid {me})"
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"is writable by others ({shown_mode})"
    return ""


def first_unsafe(folder: str) -> tuple[str, str, bool] | None:
    """(path, why, is_parent) of the first of FOLDER and its parents (up to /) that is not this user's
    alone (`not_private`), or None. FOLDER must exist."""
    folder = os.path.abspath(folder)
    why = not_private(folder, "dir")
    if why:
        return folder, why, False
    up = folder
    while True:
        parent = os.path.dirname(up)
        if parent == up:
            return None
        up = parent
        why = not_private(up, "parent")
        if why:
            return up, why, True


def owner_and_mode(path: str) -> str:
    """`uid N, drwxrwxrwx` of PATH (what it names), for a message; "" when it cannot be read."""
    try:
        st = os.stat(path)
    except OSError:
        return ""
    return f"uid {st.st_uid}, {stat.filemode(st.st_mode)}"


def make_private(folder: str) -> None:
    """FOLDER and any missing parent made mode 0700 (an existing one is left as it is: `first_unsafe` judges
    it); as the setup scripts' `umask 077 && mkdir -p`."""
    missing = []
    up = os.path.abspath(folder)
    while not os.path.lexists(up):
        missing.append(up)
        up = os.path.dirname(up)
    for path in reversed(missing):
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass

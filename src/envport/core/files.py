"""One atomic write for everything envport records (ledgers, caches, manifests, the schema, SIFs, pulls).

A crash or a second writer never leaves a half-written file under the final
name: the bytes go to a temporary file in the same folder, then one rename
replaces the target. `write_atomic` is for bytes in hand; `replacing` is for a
writer that streams (a SIF assembled piece by piece, a download hashed as it
comes), whose partial is named `.<name>.partial-<pid>` so the next writer can
remove the partials of a process that was killed mid-write: its own user's only.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
import time
from pathlib import Path
from typing import Iterator, Union

from envport.core.mounts import MOUNTINFO, inside, mounts

# File systems only this host writes: there a partial's PID is this host's. On any other (NFS, Lustre, GPFS,
# CIFS, FUSE, or a mount table that cannot be read) the same folder may hold another host's live download.
HOST_LOCAL_FS = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "f2fs", "zfs", "tmpfs", "ramfs", "overlay"})
SHARED_STALE_S = 3600  # there, a partial of a PID gone here is removed only once unwritten for this long


def write_atomic(path: Path, data: Union[str, bytes], mode: int = 0o644) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # A unique name (not the pid's): two threads of one process may record the same file.
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    with _replaced_by(Path(tmp), path, mode):
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode("utf-8") if isinstance(data, str) else data)


@contextlib.contextmanager
def replacing(path: Union[str, os.PathLike], mode: int = 0o644, *, replace: bool = True) -> Iterator[Path]:
    """The partial beside PATH, for the caller to write (it does not exist yet: open it O_EXCL if you like).
    On a normal end it gets MODE and replaces PATH; on any exception it is removed and PATH is untouched.
    REPLACE False: a file or link already at PATH is never replaced; FileExistsError at the end (the partial
    removed) when one is there (a hard link, which fails atomically, where the file system has them)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_partials(path)
    partial = path.parent / f".{path.name}.partial-{os.getpid()}"
    with _replaced_by(partial, path, mode, replace):
        yield partial


def remove_stale_partials(path: Path, mountinfo: str = MOUNTINFO) -> None:
    """Partials of PATH whose writing process was killed: this user's own only (another user's partial in a
    shared folder is that user's download), whose PID is gone from this host. On a file system other hosts
    may share (not HOST_LOCAL_FS) the PID may be another host's, so there the partial must also have gone
    unwritten for SHARED_STALE_S. A partial that cannot be removed is left."""
    path = Path(path)
    host_local = None
    for p in path.parent.glob(f".{path.name}.partial-*"):
        pid = p.name.rsplit("-", 1)[-1]
        if not pid.isdigit() or Path(f"/proc/{pid}").exists():
            continue
        try:
            st = p.lstat()
        except OSError:
            continue
        if st.st_uid != os.geteuid() or not stat.S_ISREG(st.st_mode):
            continue
        if host_local is None:
            host_local = fs_type(path.parent, mountinfo) in HOST_LOCAL_FS
        if not host_local and time.time() - st.st_mtime < SHARED_STALE_S:
            continue
        with contextlib.suppress(OSError):
            p.unlink()


def fs_type(folder: Union[str, os.PathLike], mountinfo: str = MOUNTINFO) -> str:
    """The type of the file system FOLDER is on (the mount with the longest matching mount point); "" when
    the mount table cannot be read."""
    real = os.path.realpath(folder)
    try:
        table = mounts(mountinfo)
    except OSError:
        return ""
    best, kind = "", ""
    for mount in table:
        if inside(real, mount.point) and len(mount.point) >= len(best):
            best, kind = mount.point, mount.fs_type
    return kind


@contextlib.contextmanager
def _replaced_by(tmp: Path, path: Path, mode: int, replace: bool = True) -> Iterator[None]:
    try:
        yield
        os.chmod(tmp, mode)
        if replace:
            os.replace(tmp, path)
        else:
            _link_new(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _link_new(tmp: Path, path: Path) -> None:
    """TMP given the name PATH unless something is there: os.link fails atomically (FileExistsError). A file
    system without hard links (EPERM, EOPNOTSUPP): the check, then the rename."""
    try:
        os.link(tmp, path, follow_symlinks=False)
    except FileExistsError:
        raise
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EMLINK, errno.EXDEV):
            raise
        if os.path.lexists(path):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(path)) from None
        os.replace(tmp, path)
        return
    tmp.unlink()


def swap_dir(partial: Path, final: Path) -> None:
    """The complete folder PARTIAL takes FINAL's name by renames only (a reader sees the old folder or the new
    one, never half of one); a FINAL already there is moved aside first and removed after."""
    if final.exists():
        remove_dir(final, then=lambda: os.replace(partial, final))
    else:
        os.replace(partial, final)


def remove_dir(folder: Path, then=lambda: None) -> None:
    """FOLDER's name gone at once (renamed aside to `.old-PID`), THEN run, then the aside folder removed: no
    reader ever sees a half-removed folder under the name."""
    import shutil

    aside = folder.with_name(f"{folder.name}.old-{os.getpid()}")
    os.replace(folder, aside)
    then()
    shutil.rmtree(aside, ignore_errors=True)


def remove_tree(folder: Path) -> None:
    """FOLDER and everything in it, also read-only folders (an extracted image's 0555 /usr) that rmtree alone
    cannot empty as their unprivileged owner. Never follows a link."""
    import shutil

    if not os.path.lexists(folder):
        return
    # Top-down: each folder is made ours to list and empty before the walk enters it; a link is never chmodded
    # (chmod follows links: it would change what the link names).
    for parent, folders, _ in os.walk(folder):
        for name in folders:
            path = os.path.join(parent, name)
            if not os.path.islink(path):
                with contextlib.suppress(OSError):
                    os.chmod(path, stat.S_IMODE(os.lstat(path).st_mode) | stat.S_IRWXU)
    shutil.rmtree(folder, ignore_errors=True)


def shown_path(path: Path, root: Path) -> str:
    """PATH relative to the project ROOT when it is inside it, else as given: how a line names a file."""
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def tree_bytes(path: str) -> int:
    """The disk blocks removing the tree PATH frees: every file once, one hard-linked from outside not at all,
    never following a symlink."""
    seen: dict[tuple[int, int], list] = {}
    total = 0
    stack = [path]
    while stack:
        top = stack.pop()
        try:
            st = os.lstat(top)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode):
            total += st.st_blocks * 512
            try:
                stack.extend(os.path.join(top, e) for e in os.listdir(top))
            except OSError:
                pass
            continue
        key = (st.st_dev, st.st_ino)
        entry = seen.setdefault(key, [0, st])
        entry[0] += 1
    for links, st in seen.values():
        if links >= st.st_nlink:  # every name of it is inside the tree
            total += st.st_blocks * 512
    return total

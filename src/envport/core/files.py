"""One atomic write for everything envport records (ledgers, caches, manifests, the schema, SIFs, pulls).

A crash or a second writer never leaves a half-written file under the final
name: the bytes go to a temporary file in the same folder, then one rename
replaces the target. `write_atomic` is for bytes in hand; `replacing` is for a
writer that streams (a SIF assembled piece by piece, a download hashed as it
comes), whose partial is named `.<name>.partial-<pid>` so the next writer can
remove the partials of a process that was killed mid-write.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Iterator, Union


def write_atomic(path: Path, data: Union[str, bytes], mode: int = 0o644) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # A unique name (not the pid's): two threads of one process may record the same file.
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    with _replaced_by(Path(tmp), path, mode):
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode("utf-8") if isinstance(data, str) else data)


@contextlib.contextmanager
def replacing(path: Union[str, os.PathLike], mode: int = 0o644) -> Iterator[Path]:
    """The partial beside PATH, for the caller to write (it does not exist yet: open it O_EXCL if you like).
    On a normal end it gets MODE and replaces PATH; on any exception it is removed and PATH is untouched."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_partials(path)
    partial = path.parent / f".{path.name}.partial-{os.getpid()}"
    with _replaced_by(partial, path, mode):
        yield partial


def remove_stale_partials(path: Path) -> None:
    """Partials of PATH whose writing process is gone (killed mid-write)."""
    for p in path.parent.glob(f".{path.name}.partial-*"):
        pid = p.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            p.unlink(missing_ok=True)


@contextlib.contextmanager
def _replaced_by(tmp: Path, path: Path, mode: int) -> Iterator[None]:
    try:
        yield
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def shown_path(path: Path, root: Path) -> str:
    """PATH relative to the project ROOT when it is inside it, else as given: how a line names a file."""
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)

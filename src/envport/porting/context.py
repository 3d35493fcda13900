"""The build context: where a recipe's COPY / %files / `-r FILE` find their files on this machine.

A container path the recipe copied a context file (or directory) to maps
back to that file, so `COPY requirements.txt /app/` then
`pip install -r /app/requirements.txt` reads the context's file.  Every read
is bounded by source.read_text and stays inside the context directory.
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from envport.porting.source import ImportRefused, read_text


@dataclass
class BuildContext:
    root: Path
    label_root: str = ""  # how notes name files in it (relative to the recipe's folder)
    copies: dict[str, Path] = field(default_factory=dict)  # container path -> host file or dir

    def host(self, src: str) -> Optional[Path]:
        """A context-relative source (or a host path) as a host path inside the context, or None when it
        escapes it.  Resolved first, links and `..` included: `-r ../../x` or a link to /etc/shadow is
        outside, whatever its text says."""
        path = Path(os.path.realpath(self.root / src))  # an absolute SRC stays itself (pathlib)
        try:
            path.relative_to(os.path.realpath(self.root))
        except ValueError:
            return None
        return path

    def label(self, path: Path) -> str:
        try:
            rel = path.resolve().relative_to(self.root.resolve())
        except ValueError:
            return str(path)
        return posixpath.join(self.label_root, str(rel)) if self.label_root else str(rel)

    def opener(self, cwd: str = "/"):
        """open_file for PipContext: a path as written in a command run from CWD."""
        def open_file(written: str) -> Optional[tuple[str, str]]:
            cpath = posixpath.normpath(posixpath.join(cwd, written))
            candidates = []
            if cpath in self.copies:
                candidates.append(self.copies[cpath])
            for dest, src in self.copies.items():
                if src.is_dir() and cpath.startswith(dest.rstrip("/") + "/"):
                    candidates.append(src / cpath[len(dest.rstrip("/")) + 1:])
            if not written.startswith("/"):
                candidates.append(self.root / written)
            for cand in candidates:
                host = self.host(str(cand))
                if host is not None and host.is_file():
                    try:
                        return read_text(host, self.label(host)), self.label(host)
                    except ImportRefused:
                        return None
            return None
        return open_file

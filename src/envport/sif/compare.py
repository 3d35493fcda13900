"""Where two SIFs differ: header fields, each object by (type, name), and inside the primary partitions
file by file.  What `envport rebuild-check` reports and what the reproducibility tests assert.

A tree is compared by its manifest: one tab-separated line per entry (the path as ascii(), mode, uid/gid, mtime, size and the
sha256 of a file's bytes or a link's target), sorted by path, so two trees are equal exactly when their
manifests are; the phase cache (builders/apptainer/phase_cache.py) checks its entries with the same
manifest.
"""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from envport.core.proc import run
from envport.plan.lock import sha256_file
from envport.sif.format import SifInfo, primary_partition, read_sif
from envport.sif.handle import SifError, SifFile

HEADER_FIELDS = ("arch", "uuid", "created", "modified", "data_size", "descriptors_free")
UNSQUASH_TIMEOUT = 1800


@dataclass(frozen=True)
class SifDiff:
    """What differs between two SIFs: header fields, object labels, and partition paths (when unpacked)."""

    header: tuple[str, ...]
    objects: tuple[str, ...]
    paths: tuple[str, ...]

    @property
    def same(self) -> bool:
        return not (self.header or self.objects or self.paths)


def _entry_line(root: str, path: str) -> str:
    st = os.lstat(path)
    rel = "/" + os.path.relpath(path, root) if path != root else "/"
    kind = stat.S_IFMT(st.st_mode)
    if stat.S_ISREG(kind):
        what = sha256_file(path)
    elif stat.S_ISLNK(kind):
        what = "-> " + os.readlink(path)
    else:
        what = ""
    size = st.st_size if stat.S_ISREG(kind) else 0
    return f"{rel!a}\t{st.st_mode:o}\t{st.st_uid}/{st.st_gid}\t{int(st.st_mtime)}\t{size}\t{what}"


def tree_manifest(root: str | os.PathLike) -> list[str]:
    """One line per entry under ROOT (ROOT itself included), sorted by path; never follows a link."""
    root = os.fspath(root)
    lines = [_entry_line(root, root)]
    for top, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(dirs + files):
            lines.append(_entry_line(root, os.path.join(top, name)))
    return sorted(lines)


def manifest_digest(lines: list[str]) -> str:
    return hashlib.sha256("\n".join(lines).encode("utf-8", "surrogateescape")).hexdigest()


def _label(info: SifInfo, d) -> str:
    if d.fs_type is not None:
        return f"{d.datatype_name} ({d.partition_name})"
    return f"{d.datatype_name} {d.name}".strip()


def _objects(info: SifInfo) -> dict[str, tuple]:
    """label -> (size, created, modified, sha256) of every object."""
    out = {}
    for d in info.descriptors:
        out[_label(info, d)] = (d.size, d.created, d.modified, info.file.digest(d.offset, d.size))
    return out


def object_diffs(a: SifInfo, b: SifInfo) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(header fields that differ, object labels whose bytes or times differ or that only one has)."""
    header = tuple(f for f in HEADER_FIELDS if getattr(a, f) != getattr(b, f))
    oa, ob = _objects(a), _objects(b)
    objects = []
    for label in sorted(set(oa) | set(ob)):
        if label not in oa or label not in ob:
            objects.append(f"{label} (only in {'the first' if label in oa else 'the second'})")
        elif oa[label] != ob[label]:
            what = "bytes" if oa[label][3] != ob[label][3] else "times"
            objects.append(f"{label} ({what})")
    return header, tuple(objects)


def unpack_partition(sif: str | os.PathLike, dest: Path) -> Path:
    """The primary partition of SIF unpacked into DEST (which must not exist), as root keeps owners."""
    with SifFile.open(sif) as handle:
        part = primary_partition(read_sif(handle))
        proc = run(["unsquashfs", "-no-progress", "-quiet", "-o", str(part.offset), "-d", str(dest),
                    handle.child_path], timeout=UNSQUASH_TIMEOUT, pass_fds=handle.pass_fds)
    if not proc.ok:
        raise SifError("bad_squashfs", f"{sif}: unsquashfs failed: {(proc.stderr or proc.why).strip()[-300:]}")
    return dest


def manifest_diff(a: list[str], b: list[str]) -> list[str]:
    """Paths whose manifest lines differ (or that only one tree has), sorted."""
    def by_path(lines):
        return {line.split("\t", 1)[0]: line for line in lines}

    ma, mb = by_path(a), by_path(b)
    return sorted(p for p in set(ma) | set(mb) if ma.get(p) != mb.get(p))


def compare_sifs(a: str | os.PathLike, b: str | os.PathLike, *, files: bool = True) -> SifDiff:
    """Where SIFs A and B differ; FILES: also unpack both partitions (when they differ) and name the paths."""
    with SifFile.open(a) as ha, SifFile.open(b) as hb:
        header, objects = object_diffs(read_sif(ha), read_sif(hb))
    paths: list[str] = []
    if files and any(o.startswith("FS") for o in objects):
        with tempfile.TemporaryDirectory(prefix="envport-compare-") as tmp:
            ta = tree_manifest(unpack_partition(a, Path(tmp) / "a"))
            tb = tree_manifest(unpack_partition(b, Path(tmp) / "b"))
            paths = manifest_diff(ta, tb)
    return SifDiff(header, objects, tuple(paths))

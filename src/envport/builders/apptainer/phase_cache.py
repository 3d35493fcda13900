"""The SIF builder's phase cache: the rootfs after a %post step, kept under the key of everything it
depends on (phases.py), so an edit to phase N starts from phase N-1's tree.

Layout: `<dir>/<key>/` (default_dir) holds `rootfs/` (a `cp -a` copy: never hard links, which pip
rewriting a file in place in a later build would corrupt) and `entry.json` (the step, the tree's
manifest digest, its size, the %files paths a restore copies afresh).  Settable by environment:
`ENVPORT_SIF_PHASE_CACHE` (another directory, or `off`) and `ENVPORT_SIF_PHASE_CACHE_MAX` (the size cap,
`20G`, `500M`; default 8 GiB); the least recently used entries go past the cap.

The squashfs writer's block packs (sif/squash_blocks.py: the last image's compressed blocks of each env,
found by file content) are entries here too, `kind: squash-blocks`, keyed by the env's name and
replaced by each build: they count against the same cap, are evicted in the same order, `envport gc
--phase-cache` removes them with the rest, and `off` turns them off with the cache.

Safe under kills and concurrent builds: an entry is written under `.tmp-<key>.<pid>` and renamed into
place whole (a half-written one is never read; a later run or `envport gc` deletes it once its pid is
gone); eviction renames before it deletes; the rename and eviction hold `.lock` (flock).  A restore
checks the tree it copied against the entry's manifest (sif/compare.tree_manifest: every path, mode,
owner, mtime and content sha256), so a corrupted or half-evicted entry is named, removed and rebuilt,
never used.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from envport.builders.apptainer.post_runner import RunnerError, remove_rootfs
from envport.core.proc import run
from envport.sif.compare import manifest_digest, tree_manifest
from envport.core.files import tree_bytes

ENV_DIR = "ENVPORT_SIF_PHASE_CACHE"
ENV_MAX = "ENVPORT_SIF_PHASE_CACHE_MAX"
DEFAULT_MAX = 8 << 30
DIR_NAME = ".phase-cache"
BLOCKS_KIND = "squash-blocks"
ENTRY = "entry.json"
_KEY = re.compile(r"[0-9a-f]{64}\Z")
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\Z", re.IGNORECASE)


class CacheSettingError(ValueError):
    pass


def parse_size(text: str) -> int:
    """`16G`, `500M`, `1.5T`, `1048576` -> bytes (powers of 1024)."""
    m = _SIZE.match(text.strip())
    if m is None:
        raise CacheSettingError(f"{ENV_MAX}={text!r}: expected a size such as 16G, 500M or a byte count")
    return int(float(m.group(1)) * (1 << (10 * " KMGT".index(m.group(2).upper() or " "))))


@dataclass(frozen=True)
class Entry:
    key: str
    path: Path
    meta: dict

    @property
    def rootfs(self) -> Path:
        return self.path / "rootfs"


def default_dir(site, root: Path) -> Path:
    """The site's apptainer.build_dir, else <sif_dir>/.phase-cache: on disk, never /dev/shm, whose every
    cached GiB is a GiB of memory the host's jobs lose for as long as the entry lives (a restore copies from
    disk into the build's work directory: measured on tiny-sif's 240 MB tree, cp -a took 4.5 s from disk).
    The place is chosen by settings that do not change from build to build, so builds find each other's."""
    if site.apptainer.build_dir:
        return Path(site.apptainer.build_dir).expanduser() / DIR_NAME
    return site.apptainer.sif_path(root) / DIR_NAME


def pack_key(name: str) -> str:
    """The entry key of env NAME's block pack (one per env, replaced by each of its builds)."""
    return hashlib.sha256(f"{BLOCKS_KIND}:{name}".encode()).hexdigest()


def described(meta: dict) -> str:
    if meta.get("kind") == BLOCKS_KIND:
        return f"squashfs blocks of {meta.get('name')}"
    return f"step {meta.get('step')} {meta.get('marker')} of {meta.get('name')}"


def _pid_gone(name: str) -> bool:
    pid = name.rsplit(".", 1)[-1]
    return pid.isdigit() and not Path(f"/proc/{pid}").exists()


class PhaseCache:
    def __init__(self, directory: Path, cap: int, say: Callable[[str], None] = lambda _l: None):
        self.dir, self.cap, self.say = directory, cap, say

    @classmethod
    def for_site(cls, site, root: Path, say: Callable[[str], None] = lambda _l: None) -> Optional["PhaseCache"]:
        """The cache SITE's builds use (ENV_DIR, else default_dir); None when ENV_DIR is `off`."""
        where = os.environ.get(ENV_DIR, "")
        if where.lower() == "off":
            return None
        cap = parse_size(os.environ[ENV_MAX]) if os.environ.get(ENV_MAX) else DEFAULT_MAX
        return cls(Path(where).expanduser() if where else default_dir(site, root), cap, say)

    # --- reading ------------------------------------------------------------------------------------------

    def entries(self) -> list[Entry]:
        """Every finished entry (a readable entry.json), oldest use first."""
        out = []
        if not self.dir.is_dir():
            return out
        for path in self.dir.iterdir():
            if not _KEY.match(path.name):
                continue
            try:
                meta = json.loads((path / ENTRY).read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            out.append(Entry(path.name, path, meta))
        return sorted(out, key=lambda e: (e.path.stat().st_mtime, e.key))

    def find(self, key: str) -> Optional[Entry]:
        path = self.dir / key
        try:
            meta = json.loads((path / ENTRY).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return Entry(key, path, meta) if meta.get("key") == key else None

    def restore(self, entry: Entry, dest: Path) -> bool:
        """Copy ENTRY's tree to DEST (which must not exist) and check it; False (DEST and the entry removed,
        the reason said) when it does not match its manifest."""
        proc = run(["cp", "-a", "--reflink=auto", "--", str(entry.rootfs), str(dest)], timeout=None)
        why = "" if proc.ok else f"cp failed: {(proc.stderr or proc.why).strip()[-200:]}"
        if not why and manifest_digest(tree_manifest(dest)) != entry.meta.get("manifest"):
            why = "its tree does not match its manifest"
        if why:
            self.say(f"phase cache: entry {entry.key[:12]} (step {entry.meta.get('step')} "
                     f"{entry.meta.get('marker')}) is corrupt ({why}); removed, that step is rebuilt")
            _remove_quietly(dest)
            self.remove(entry.key)
            return False
        os.utime(entry.path)  # last used: eviction goes by it
        return True

    # --- writing ------------------------------------------------------------------------------------------

    @contextmanager
    def _locked(self):
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / ".lock", "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def store(self, key: str, rootfs: Path, meta: dict) -> Optional[Entry]:
        """Keep a copy of ROOTFS under KEY (nothing when an entry is there already); then trim to the cap."""
        if self.find(key) is not None:
            return None
        tmp = self._fresh(key)
        proc = run(["cp", "-a", "--reflink=auto", "--", str(rootfs), str(tmp / "rootfs")], timeout=None)
        if not proc.ok:
            self.say(f"phase cache: not kept ({(proc.stderr or proc.why).strip()[-200:]})")
            _remove_quietly(tmp)
            return None
        return self._publish(key, tmp, {**meta, "manifest": manifest_digest(tree_manifest(tmp / "rootfs"))},
                             replace=False)

    def packs(self) -> list[Path]:
        """The block packs' directories (sif/squash_blocks.py), most recently used last."""
        return [e.path for e in self.entries() if e.meta.get("kind") == BLOCKS_KIND]

    def store_pack(self, name: str, fill: Callable[[Path], None]) -> Optional[Entry]:
        """Env NAME's block pack, written by FILL into a fresh directory, in place of the one before."""
        key = pack_key(name)
        tmp = self._fresh(key)
        try:
            fill(tmp)
        except OSError as exc:
            self.say(f"phase cache: squashfs blocks of {name} not kept ({exc})")
            _remove_quietly(tmp)
            return None
        return self._publish(key, tmp, {"kind": BLOCKS_KIND, "name": name}, replace=True)

    def _fresh(self, key: str) -> Path:
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.dir / f".tmp-{key}.{os.getpid()}"
        _remove_quietly(tmp)
        tmp.mkdir(mode=0o700)
        return tmp

    def _publish(self, key: str, tmp: Path, meta: dict, replace: bool) -> Optional[Entry]:
        """TMP renamed into place as entry KEY (its entry.json written first), under the lock; REPLACE: an
        entry already there goes (renamed away first), else the one there wins.  Then trim to the cap."""
        full = {**meta, "key": key, "bytes": tree_bytes(str(tmp)), "stored": int(time.time())}
        (tmp / ENTRY).write_text(json.dumps(full, sort_keys=True, indent=1), encoding="utf-8")
        with self._locked():
            if replace:
                self.remove(key)
            try:
                os.rename(tmp, self.dir / key)
            except OSError:  # another build kept the same tree first
                _remove_quietly(tmp)
                return None
            self.trim()
        return self.find(key)

    def remove(self, key: str) -> int:
        """Remove entry KEY (renamed out of the way first: a reader mid-copy fails its check); bytes freed."""
        path = self.dir / key
        if not path.exists():
            return 0
        try:
            size = json.loads((path / ENTRY).read_text(encoding="utf-8")).get("bytes", 0)
        except (OSError, ValueError):
            size = 0
        trash = self.dir / f".trash-{key}.{os.getpid()}"
        try:
            os.rename(path, trash)
        except OSError:
            return 0
        _remove_quietly(trash)
        return int(size or 0)

    def trim(self) -> None:
        entries = self.entries()
        total = sum(int(e.meta.get("bytes", 0)) for e in entries)
        for e in entries:
            if total <= self.cap:
                break
            total -= self.remove(e.key)
            self.say(f"phase cache: removed entry {e.key[:12]} ({described(e.meta)}): over the cap ({ENV_MAX})")

    def sweep(self) -> int:
        """Remove what builds that did not finish left (`.tmp-*`, `.trash-*` of a gone pid); bytes freed."""
        freed = 0
        if not self.dir.is_dir():
            return 0
        for path in self.dir.iterdir():
            if path.name.startswith((".tmp-", ".trash-")) and _pid_gone(path.name):
                freed += tree_bytes(str(path))
                _remove_quietly(path)
        return freed

    def clear(self) -> int:
        """Remove every entry and leftover; bytes freed."""
        freed = self.sweep()
        with self._locked():
            for e in self.entries():
                freed += self.remove(e.key)
        return freed

    def size(self) -> tuple[int, int]:
        """(entries, bytes) of the finished entries."""
        entries = self.entries()
        return len(entries), sum(int(e.meta.get("bytes", 0)) for e in entries)


def _remove_quietly(path: Path) -> None:
    try:
        remove_rootfs(path)
    except RunnerError:
        pass  # a mount under it: left for a later sweep, never used (not under an entry's name)

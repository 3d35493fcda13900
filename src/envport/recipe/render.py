"""Render specs into images/<name>/ atomically, or check them for drift.

A spec renders to every target's recipe plus the shim files those recipes
copy (the Docker and Apptainer build contexts are images/<name>/ itself).
Writing goes to a temporary directory that replaces images/<name>/ only
when everything rendered, so a bad spec or a crash never leaves a half-
written recipe behind.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from envport.renderers import TARGETS, render_target

from envport.recipe.identity import portable
from envport.spec.loader import Loaded
from envport.plan.steps import Plan, make_plan

IMAGES_DIR = "images"
# Names inside a build context: the site's CA bundle and the env's wheelhouse.
CA_CONTEXT_NAME = "ca-bundle.crt"
WHEELHOUSE_CONTEXT_NAME = "wheelhouse"
LOCKS_CONTEXT_DIR = "locks"  # each locked phase's requirements, pip-N.txt
# Ledgers envport used to keep in images/<name>/ (they now live in the user's state
# dir, report/ledger.py): an old checkout may still hold them; render neither
# flags nor writes them.
KEPT_FILES = ("ledger.json", "ledger.lock")


@dataclass
class Rendering:
    """What one spec renders to: {path relative to images/<name>/: (bytes, mode)}."""

    name: str
    files: dict[str, tuple[bytes, int]]


def render_spec(loaded: Loaded, targets: tuple[str, ...] = TARGETS) -> Rendering:
    """The portable rendering committed under images/ (no site profile applied)."""
    return render_plan(make_plan(loaded), portable(loaded).hash, targets)


def provenance(text: str, name: str, hash_: str, site: Optional[str]) -> str:
    """Say in the header whose identity this rendering carries: portable (images/) or as a site builds it.

    The stamp is added here, not in the templates: the templates feed the
    renderer version and so every env's hash, and where a rendering is built
    is not what it builds.
    """
    origin = f"as site {site!r} builds it" if site else \
        f"portable: no site profile; `envport show {name} --site S` gives a site's hash"
    head = f"({name}@{hash_[:12]})"
    return text.replace(f"{head}; edit the spec", f"({name}@{hash_[:12]}, {origin}); edit the spec", 1)


def render_plan(plan: Plan, hash_: str, targets: tuple[str, ...] = TARGETS, site: Optional[str] = None) -> Rendering:
    """Recipes plus the context files they copy (shim files, a site's CA bundle)."""
    files: dict[str, tuple[bytes, int]] = {}
    for target in targets:
        for fname, text in render_target(target, plan, hash_).items():
            text = provenance(text, plan.name, hash_, site)
            files[fname] = (text.encode("utf-8"), 0o755 if fname.endswith(".sh") else 0o644)
    if {"docker", "apptainer"} & set(targets):
        for s in plan.steps:
            if s.kind == "files":
                for f in s.files:
                    files[f.source] = (f.data, int(f.mode, 8))
            elif s.kind == "ca":
                files[CA_CONTEXT_NAME] = (s.data, 0o644)
            elif s.kind == "pip" and s.locked:
                # One file per phase: a phase's COPY (its cache key) moves only with its own lock.
                files[f"{LOCKS_CONTEXT_DIR}/{s.marker}.txt"] = (s.requirements_text().encode(), 0o644)
    return Rendering(plan.name, dict(sorted(files.items())))


def out_dir(root: Path, name: str) -> Path:
    return root / IMAGES_DIR / name


def drift(root: Path, rendering: Rendering, all_targets: bool = True) -> list[str]:
    """Paths (relative to root) whose committed content differs from a fresh rendering."""
    base = out_dir(root, rendering.name)
    drifted = []
    for rel, (data, _) in rendering.files.items():
        path = base / rel
        if not path.is_file() or path.read_bytes() != data:
            drifted.append(str(path.relative_to(root)))
    if all_targets and base.is_dir():
        for path in sorted(base.rglob("*")):
            rel = str(path.relative_to(base))
            if path.is_file() and rel not in rendering.files and rel not in KEPT_FILES:
                drifted.append(f"{path.relative_to(root)} (stale: no longer rendered)")
    return drifted


def stale_dirs(root: Path, names: set[str]) -> list[Path]:
    """images/<d>/ with no specs/<d>.yaml: left behind when a spec is deleted or renamed."""
    images = root / IMAGES_DIR
    if not images.is_dir():
        return []
    # Dot-names are render's own temporary and old copies (see `write`).
    return [d for d in sorted(images.iterdir()) if d.is_dir() and not d.name.startswith(".") and d.name not in names]


def remove_stale(root: Path, names: set[str]) -> list[str]:
    """Delete images/<d>/ for specs that no longer exist; `render --all` owns images/."""
    removed = []
    for d in stale_dirs(root, names):
        shutil.rmtree(d)
        removed.append(str(d.relative_to(root)))
    return removed


def write(root: Path, rendering: Rendering, all_targets: bool = True) -> list[str]:
    """Write images/<name>/ atomically; return the paths that changed."""
    changed = drift(root, rendering, all_targets)
    if not changed:
        return []
    base = out_dir(root, rendering.name)
    base.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{rendering.name}.", dir=base.parent))
    try:
        if base.is_dir():
            # Keep what render does not own, and other targets' files on a partial render.
            for path in base.rglob("*"):
                rel = path.relative_to(base)
                if path.is_file() and (not all_targets or str(rel) in KEPT_FILES):
                    (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(path, tmp / rel)
        for rel, (data, mode) in rendering.files.items():
            dest = tmp / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data)
            os.chmod(dest, mode)
        os.chmod(tmp, 0o755)
        if base.exists():
            old = base.with_name(f".{rendering.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.rename(base, old)
            os.rename(tmp, base)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, base)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return changed

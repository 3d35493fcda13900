"""A rendered .def's %post cut into its plan steps, and the cache key of the rootfs after each step.

The renderer marks every plan step in %post with `# step i/n MARKER:` and `echo 'envport: step i/n
TITLE'` (deffile.py reads them).  The builder runs the steps one sandbox each, so it can keep the rootfs
between them (phase_cache.py).  What one step leaves for the next in apptainer's single %post shell is
its `export`s (and `set`/`unset`): each step's script is %post's prologue, the earlier steps' state lines,
then the step itself.  A %post that keeps other shell state between steps (`cd`, a bare `X=1`, a sourced
file) is not split: it runs whole, as apptainer runs it, and nothing is cached (`Phases.why_whole`).

The key of the rootfs after step k chains everything that tree depends on: the phase-cache format, the
envport version, the base image's digest, the .def's header, %post's prologue, then per step its text
(the progress `echo`s and step comments dropped: they print, they build nothing, and the step count in
them would change every key when a phase is added) and the content of the `%files` it owns.  A `%files`
entry is owned by the first step whose text names its destination, else by the first step.  Entries
copied under the renderer's build-inputs directory (the wheelhouse, the CA bundle) are owned by no step
and copied afresh on every restore: the pins in each pip step's text or lock choose what pip takes from
them, and %post deletes the directory before it ends.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

from envport import __version__
from envport.builders.apptainer.deffile import STEP_COMMENT, DefFile, FileCopy, match_step
from envport.renderers.apptainer import BUILD_DIR

FORMAT = "envport-sif-phase-1"  # bump when what a cached tree holds changes meaning
_STATE = re.compile(r"\s*(export|set|unset)\s")
# Shell state other than the environment that a later step could depend on: such a %post runs whole.
_OTHER_STATE = re.compile(r"\s*((cd|pushd|popd|source|\.|alias|umask|trap)(\s|$)|[A-Za-z_][A-Za-z0-9_]*=\S*\s*$)")
# Steps whose tree is worth keeping: the last one before the first pip phase (base + system packages +
# python), and each pip phase.  The steps after (files, weights, labels) are shell one-liners that cost less
# to re-run than their copy would.
PIP_MARKER = re.compile(r"pip-\d+\Z")


@dataclass(frozen=True)
class Step:
    n: int
    marker: str
    title: str
    body: str  # the step's %post lines, from its `# step` comment on
    key_text: str  # BODY without the progress echo and the step comment

    @property
    def state_lines(self) -> str:
        return "".join(line for line in self.body.splitlines(keepends=True) if _STATE.match(line))


@dataclass(frozen=True)
class Phases:
    prologue: str  # %post's lines before the first step
    steps: tuple[Step, ...]
    why_whole: str = ""  # set: %post cannot be split (it runs whole, uncached)

    def script(self, k: int) -> str:
        """The %post script that runs step K (1-based) alone after steps 1..K-1 ran in earlier sandboxes."""
        carried = "".join(s.state_lines for s in self.steps[:k - 1])
        return self.prologue + carried + self.steps[k - 1].body

    def kept(self) -> tuple[int, ...]:
        """The steps whose tree the cache keeps (see PIP_MARKER)."""
        pips = [s.n for s in self.steps if PIP_MARKER.match(s.marker)]
        if not pips:
            return ()
        return tuple(sorted({pips[0] - 1, *pips} - {0, len(self.steps)}))


def _key_text(body: str) -> str:
    keep = []
    for line in body.splitlines(keepends=True):
        if STEP_COMMENT.match(line):
            continue
        words = line.strip()
        if words.startswith("echo ") and match_step(words[5:].strip("'\"")):
            continue
        keep.append(line)
    return "".join(keep)


def split(deffile: DefFile) -> Phases:
    """%post as its plan steps; `why_whole` says why it cannot be split (no markers, other shell state)."""
    body = deffile.script("post")
    lines = body.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if STEP_COMMENT.match(line)]
    if not starts or len(starts) != len(deffile.steps):
        return Phases(body, (), why_whole="%post has no `# step i/n MARKER:` comments for every step")
    prologue = "".join(lines[:starts[0]])
    steps = []
    for j, (start, mark) in enumerate(zip(starts, deffile.steps)):
        chunk = "".join(lines[start:starts[j + 1] if j + 1 < len(starts) else len(lines)])
        steps.append(Step(mark.n, mark.marker, mark.title, chunk, _key_text(chunk)))
    for line in (prologue + "".join(s.body for s in steps)).splitlines():
        if _OTHER_STATE.match(line) and not _STATE.match(line):
            return Phases(body, (), why_whole=f"%post keeps shell state between steps ({line.strip()!r}): "
                                              "it runs whole, as apptainer runs it, and is not cached")
    return Phases(prologue, tuple(steps))


# --- %files ownership and keys -------------------------------------------------------------------------


def build_input(item: FileCopy) -> bool:
    return (item.dst or item.src).rstrip("/").startswith(BUILD_DIR)


def owner(item: FileCopy, phases: Phases) -> int:
    """The step that owns ITEM (0: a build input, owned by none; see the module's docstring)."""
    if build_input(item):
        return 0
    dst = (item.dst or item.src).rstrip("/")
    for step in phases.steps:
        if dst and dst in step.key_text:
            return step.n
    return 1


def later_files(deffile: DefFile, phases: Phases, k: int) -> DefFile:
    """DEFFILE with only the %files a restore of step K's tree must copy afresh (owned later, or by none)."""
    return replace(deffile, files=tuple(f for f in deffile.files if not 0 < owner(f, phases) <= k))


def _content_digest(path: Path) -> str:
    """sha256 over a %files source: a file's bytes, or a directory's sorted relative names and bytes."""
    from envport.plan.lock import sha256_file

    if not path.is_dir():
        return sha256_file(path)
    h = hashlib.sha256()
    for top, dirs, files in os.walk(path, followlinks=True):  # cp -L follows links: so does the key
        dirs.sort()
        for name in sorted(files):
            full = os.path.join(top, name)
            h.update(f"{os.path.relpath(full, path)}\0{sha256_file(full)}\n".encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def _files_of(deffile: DefFile, phases: Phases, n: int, context: Path) -> list[str]:
    out = []
    for item in deffile.files:
        if owner(item, phases) != n:
            continue
        src = Path(item.src) if os.path.isabs(item.src) else context / item.src
        out.append(f"{item.src}\0{item.dst}\0{_content_digest(src)}")
    return out


def keys(deffile: DefFile, phases: Phases, base_id: str, context: Path) -> dict[int, str]:
    """Step n -> the key of the rootfs after it (see the module's docstring)."""
    head = [FORMAT, __version__, base_id, deffile.bootstrap, deffile.base, phases.prologue]
    key = hashlib.sha256("\0".join(head).encode("utf-8", "surrogateescape")).hexdigest()
    out = {}
    for step in phases.steps:
        parts = [key, step.key_text, *_files_of(deffile, phases, step.n, context)]
        key = hashlib.sha256("\0".join(parts).encode("utf-8", "surrogateescape")).hexdigest()
        out[step.n] = key
    return out

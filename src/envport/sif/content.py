"""What a SIF's primary partition itself holds, and whether that is the env its spec and lock describe.

A SIF's descriptor objects (`inspect-metadata.json`, `envport-spec.json`) are unsigned claims anyone can
write over any content.  This reads the squashfs instead (sif/squashfs_tree.py): the labels and
environment apptainer would use (`/.singularity.d/labels.json`, `/.singularity.d/env/*.sh`), the env's
python (its venv's `pyvenv.cfg`) and distributions (`*.dist-info` names and versions in its
site-packages), and the entries that matter to an admin whatever else matches (`risks`): set-id files,
device nodes, world-writable directories without the sticky bit, symlinks that climb out of the image,
names no listing line can hold.  `integrity` checks the bytes: nothing past the last object, the
superblock's `bytes_used` inside the partition's descriptor, and the partition's sha256 against what
its build recorded (in the SIF, and in this machine's state dir when this machine built it).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Optional

from envport.sif import record as sif_record
from envport.sif import squashfs_tree
from envport.sif.format import PARTITION_ALIGN, SifError
from envport.sif.handle import SifFile
from envport.plan.steps import CONTAINER_VENV
from envport.renderers.envcheck import canonical

ENV_DIR = "/.singularity.d/env/"
LABELS = "/.singularity.d/labels.json"
_SITE_PACKAGES = re.compile(re.escape(CONTAINER_VENV) + r"/lib/python[0-9.]+/site-packages/([^/]+)\.dist-info\Z")
_ENV_SCRIPT = re.compile(r"[A-Za-z0-9._-]+\.sh\Z")
RISKS_SHOWN = 200  # a hostile image can hold a million set-id files; the count is always exact


@dataclass
class Content:
    labels: Optional[dict] = None  # None: the image has no readable labels.json
    environment: dict[str, str] = field(default_factory=dict)
    python: Optional[str] = None
    distributions: dict[str, str] = field(default_factory=dict)  # canonical name -> version
    risks: list[dict] = field(default_factory=list)
    risk_count: int = 0
    entries: int = 0

    def to_dict(self) -> dict:
        return {"labels": self.labels, "environment": self.environment, "python": self.python,
                "distributions": dict(sorted(self.distributions.items())), "entries": self.entries,
                "risks": self.risks, "risk_count": self.risk_count}


def _leaves_image(path: str, target: str) -> bool:
    """A relative TARGET of the symlink at PATH climbs above the image's root."""
    if target.startswith("/"):
        return False  # resolved inside the container's root at run time
    depth = path.count("/") - 1  # the link's directory's depth
    for part in target.split("/"):
        if part == "..":
            depth -= 1
            if depth < 0:
                return True
        elif part not in ("", "."):
            depth += 1
    return False


def risks(entries: list, odd_lines: list[str]) -> list[dict]:
    out = []
    for e in entries:
        if e.kind != "d" and e.setid:
            out.append({"kind": e.setid, "path": e.path, "detail": f"{e.mode} owner {e.uid}:{e.gid}"})
        if e.kind in "cb":
            out.append({"kind": "device", "path": e.path,
                        "detail": f"{'char' if e.kind == 'c' else 'block'} device {e.device}, {e.mode}"})
        if e.kind == "d" and e.world_writable and not e.sticky:
            out.append({"kind": "world_writable_dir", "path": e.path, "detail": f"{e.mode} (no sticky bit)"})
        if e.kind == "l" and _leaves_image(e.path, e.target):
            out.append({"kind": "symlink_leaves_image", "path": e.path, "detail": f"-> {e.target}"})
    for line in odd_lines:
        out.append({"kind": "odd_name", "path": line[:200],
                    "detail": "a listing line that does not parse: a file name holding a newline"})
    return out


def read_content(sif: SifFile, offset: int) -> Content:
    """The partition at OFFSET of the open SIF, read with unsquashfs; raises SifError when it cannot be listed."""
    entries, odd = squashfs_tree.listing(sif, offset)
    by_path = {e.path: e for e in entries}
    found = risks(entries, odd)
    content = Content(risks=found[:RISKS_SHOWN], risk_count=len(found), entries=len(entries))
    labels = by_path.get(LABELS)
    if labels is not None and labels.kind == "-":
        raw = squashfs_tree.read_file(sif, offset, LABELS)
        try:
            value = json.loads(raw) if raw is not None else None
        except (ValueError, RecursionError):
            value = None
        if isinstance(value, dict):
            content.labels = {str(k): v if isinstance(v, str) else str(v) for k, v in value.items()}  # as sif_labels
    for e in entries:
        name = e.path[len(ENV_DIR):]
        if e.path.startswith(ENV_DIR) and e.kind == "-" and _ENV_SCRIPT.match(name):
            raw = squashfs_tree.read_file(sif, offset, e.path)
            if raw is not None:
                content.environment[e.path] = raw.decode("utf-8", "replace")
        m = _SITE_PACKAGES.match(e.path)
        if m and e.kind == "d" and "-" in m[1]:
            dist, version = m[1].rsplit("-", 1)
            content.distributions[canonical(dist)] = version
    cfg = by_path.get(f"{CONTAINER_VENV}/pyvenv.cfg")
    if cfg is not None and cfg.kind == "-":
        raw = squashfs_tree.read_file(sif, offset, cfg.path) or b""
        for line in raw.decode("utf-8", "replace").splitlines():
            key, _, value = line.partition("=")
            if key.strip() in ("version", "version_info") and re.fullmatch(r"\d+\.\d+(\.\d+)?", value.strip()):
                content.python = value.strip()
    return content


# --- what the spec and lock say the content must be ---------------------------------------------------------


def expected_distributions(plan) -> dict[str, str]:
    """{canonical name: version} the env must hold: each locked phase's set, a later phase winning; for an
    unlocked plan, the spec's `==` pins (renderers/envcheck.py, what builders/pins.py checks)."""
    want: dict[str, str] = {}
    for step in plan.steps:
        for dist in getattr(step, "locked", ()) or ():
            want[canonical(dist.name)] = dist.version
    if not want:
        from envport.renderers.envcheck import plan_pins

        want = {canonical(name): version for name, version, _ in plan_pins(plan)}
    return want


VENV_SEEDS = ("pip", "setuptools", "wheel")  # what `python -m venv` itself installs, never in a lock


def judge(content: Content, plan, python: str) -> tuple[list[str], str, list[str]]:
    """(what differs from the spec and lock, one line of what the content shows, the distributions a lock
    does not name).  A locked env holds nothing else: an extra distribution is a difference."""
    return judge_against(content, expected_distributions(plan), any(getattr(s, "locked", ()) for s in plan.steps),
                         python)


def judge_against(content: Content, want: dict[str, str], locked: bool, python: str
                  ) -> tuple[list[str], str, list[str]]:
    """`judge` with the distributions WANT ({canonical name: version}) given; LOCKED: they are a whole lock,
    so anything else installed is a difference."""
    at_lock = [n for n, v in want.items() if content.distributions.get(n) == v]
    problems = []
    if content.python is None:
        problems.append(f"no python in the image ({CONTAINER_VENV}/pyvenv.cfg is absent)")
    elif not (content.python == python or content.python.startswith(python + ".")):
        problems.append(f"python {content.python}, the spec says {python}")
    for name in sorted(want):
        have = content.distributions.get(name)
        if have != want[name]:
            problems.append(f"{name} {have or 'absent'}, the {'lock' if locked else 'spec'} says {want[name]}")
    extra = sorted(f"{n} {v}" for n, v in content.distributions.items() if n not in want and n not in VENV_SEEDS)
    if extra and locked:
        problems.append(f"not in the lock: {', '.join(extra[:12])}" + (f" (+{len(extra) - 12})" if len(extra) > 12 else ""))
    if content.labels is None:
        problems.append(f"no {LABELS} in the image")
    py = f"python {content.python}" if content.python else "no python"
    shows = f"{py}, {len(at_lock)}/{len(want)} distributions at the {'lock' if locked else 'spec'}"
    return problems, shows, extra


# --- the bytes ---------------------------------------------------------------------------------------------


def layout(info) -> str:
    """The SIF's object layout as one line: `id:type:offset:size` per object, then the file's size."""
    return ",".join(f"{d.id}:{d.datatype:#x}:{d.offset}:{d.size}" for d in info.descriptors) + f";{info.file_size}"


def partition_sha256(info, part) -> str:
    """The partition's sha256, read from the SIF's open file (which keeps it: a signature check of the same
    open file has usually hashed it already)."""
    return info.file.digest(part.offset, part.size, "sha256")


def check_extent(info, part, bytes_used: int) -> None:
    """FAILED reasons for bytes the layout does not account for: raises SifError."""
    end = max((d.offset + d.size for d in info.descriptors), default=info.data_offset)
    if info.file_size > end:
        raise SifError("trailing_bytes", f"{info.path}: {info.file_size - end} bytes past the last object "
                                         f"(it ends at byte {end}, the file at {info.file_size}): something "
                                         "was appended outside the SIF's layout; get the file again")
    if bytes_used > part.size or part.size - bytes_used >= PARTITION_ALIGN:
        raise SifError("bytes_used_mismatch", f"{info.path}: the squashfs superblock says {bytes_used} bytes, "
                                              f"its descriptor {part.size} (mksquashfs pads to 4096 at most): "
                                              "the partition is damaged; get the file again")


def integrity(info, part, embedded: Optional[dict]) -> tuple[str, list[str], bool]:
    """(the partition's sha256, lines naming each record it disagrees with, whether any record exists).

    The partition only: signing (envport sign) appends objects after the build, legitimately."""
    digest = partition_sha256(info, part)
    bad = []
    claimed = embedded.get("partition") if isinstance(embedded, dict) else None
    claimed = claimed if isinstance(claimed, dict) else {}
    if claimed.get("sha256") and claimed["sha256"] != digest:
        bad.append(f"sha256 {digest[:16]}..., its build recorded {str(claimed['sha256'])[:16]}... in the SIF")
    rec = sif_record.read(info.path)
    if rec is not None and rec["partition_sha256"] != digest:
        bad.append(f"sha256 {digest[:16]}..., this machine's build recorded {rec['partition_sha256'][:16]}...")
    return digest, bad, bool(claimed.get("sha256")) or rec is not None


def content_matches(sif: str, hash_: str, plan, python: str) -> tuple[bool, str]:
    """(True, "") when SIF's bytes and content are the env of HASH_ as PLAN installs it, with no risks;
    else (False, why).  For a SIF this machine's build did not record (a shared sif_dir, a copy)."""
    from envport.sif.format import primary_partition, read_json_object, read_sif, read_squashfs_superblock

    try:
        info = read_sif(sif)
        part = primary_partition(info)
        check_extent(info, part, read_squashfs_superblock(info.file, part.offset).bytes_used)
        _, bad, _ = integrity(info, part, read_json_object(info, "envport-spec.json"))
        if bad:
            return False, "corrupt: " + bad[0]
        content = read_content(info.file, part.offset)
    except SifError as exc:
        return False, f"[{exc.reason}] {exc.message}"
    if (content.labels or {}).get("envport.hash") != hash_:
        return False, "the image's own labels do not carry envport.hash=" + hash_[:12]
    problems, _, _ = judge(content, plan, python)
    if problems:
        return False, "content: " + problems[0]
    if content.risk_count:
        return False, f"{content.risk_count} risky entries (first: {content.risks[0]['kind']} {content.risks[0]['path']})"
    return True, ""

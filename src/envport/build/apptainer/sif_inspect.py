"""What a SIF holds and whether it still matches its spec, read without apptainer.

For an admin who pulled a `.sif` and has neither apptainer nor the build host:
the header and descriptors, the def file, `inspect-metadata.json` (labels,
environment, runscript: what `apptainer inspect` would print), the squashfs
superblock of the primary partition, and, for a SIF envport built, the
resolved spec it embedded (`envport-spec.json`), so a spec that moved on is
named field by field, not guessed.

Verdicts (one StepResult): OK (a SIF whose hash is what specs/NAME.yaml
resolves to now); REFUSED `stale` (it is not: the changed fields are listed),
`not_envport` (no envport.hash label: nothing to compare), `foreign_arch`
(this machine cannot run it); FAILED with the SifError reason for a file that
is not a usable SIF (truncated, not_a_sif, corrupt_*, no_primary_partition,
bad_squashfs, ...).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from envport.build.apptainer.builder import SPEC_OBJECT
from envport.core.verdict import StepResult, Verdict
from envport.engines.sif import (DATA_DEFFILE, SifError, primary_partition, read_json_object,
                                 read_object, read_sif, read_squashfs_superblock)

# Reasons of a SIF that is readable but cannot run here: REFUSED, not FAILED.
REFUSED_REASONS = ("foreign_arch",)


@dataclass
class SifReport:
    path: str
    facts: dict[str, Any] = field(default_factory=dict)

    def add(self, key: str, value: Any) -> None:
        self.facts[key] = value


def read_report(path: Path) -> tuple[SifReport, Optional[SifError]]:
    """Everything readable from PATH; the first SifError that stopped the reading, if any."""
    report = SifReport(str(path))
    try:
        info = read_sif(path)
    except SifError as exc:
        return report, exc
    report.add("header", {"size": info.file_size, "version": info.version, "arch": info.arch, "uuid": info.uuid,
                          "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(info.created)),
                          "launch_script": info.launch_script})
    report.add("objects", [_descriptor(d) for d in info.descriptors])
    try:
        deffile = info.find(datatype=DATA_DEFFILE)
        if deffile is not None:
            report.add("deffile", read_object(info, deffile).decode("utf-8", "replace"))
        meta = read_json_object(info, "inspect-metadata.json")
        attrs = ((meta or {}).get("data") or {}).get("attributes") or {}
        report.add("labels", dict(attrs.get("labels") or {}))
        report.add("environment", dict(attrs.get("environment") or {}))
        report.add("runscript", attrs.get("runscript", ""))
        report.add("embedded", read_json_object(info, SPEC_OBJECT))
        part = primary_partition(info, arch=info.arch if info.arch != "unknown" else None)
        sb = read_squashfs_superblock(path, part.offset)
        report.add("squashfs", {"offset": part.offset, "bytes": sb.bytes_used, "compression": sb.compression,
                                "inodes": sb.inodes, "block_size": sb.block_size, "version": sb.version})
        primary_partition(info)  # this machine's arch: raises foreign_arch
    except SifError as exc:
        return report, exc
    return report, None


def _descriptor(d) -> dict:
    out = {"id": d.id, "type": d.datatype_name, "group": d.group, "offset": d.offset, "size": d.size}
    if d.name:
        out["name"] = d.name
    if d.fs_type is not None:
        out.update(fs=d.fs_name, partition=d.partition_name, arch=d.arch)
    return out


def spec_diff(old: Any, new: Any, path: str = "") -> list[str]:
    """Dotted paths of the fields that differ between two JSON-like spec dumps."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for key in sorted(set(old) | set(new)):
            sub = f"{path}.{key}" if path else str(key)
            if key not in old:
                out.append(f"{sub} (added)")
            elif key not in new:
                out.append(f"{sub} (removed)")
            else:
                out += spec_diff(old[key], new[key], sub)
        return out
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [d for i, (a, b) in enumerate(zip(old, new)) for d in spec_diff(a, b, f"{path}[{i}]")]
    return [] if old == new else [path or "(whole spec)"]


def compare(report: SifReport, loaded, current_hash: str, renderer_version: str) -> StepResult:
    """OK when the SIF's hash is CURRENT_HASH; REFUSED `stale` naming what moved otherwise."""
    labels = report.facts.get("labels") or {}
    built = labels.get("envport.hash", "")
    step = f"inspect {Path(report.path).name}"
    rel = _shown(loaded.path, loaded.root)
    data = {"sif_hash": built, "spec_hash": current_hash, "spec": rel}
    if built == current_hash:
        return StepResult(step, Verdict.OK, f"matches {rel} ({loaded.spec.name}@{built[:12]})", data=data)
    embedded = report.facts.get("embedded") or {}
    changed = spec_diff(embedded.get("spec"), loaded.spec.model_dump(mode="json")) if embedded.get("spec") else []
    if not embedded.get("spec"):
        why = "no embedded spec (built by apptainer, not envport's builder): the fields cannot be named"
    elif changed:
        why = "changed: " + ", ".join(changed[:12]) + (f" (+{len(changed) - 12} more)" if len(changed) > 12 else "")
    else:
        moved = []
        if labels.get("envport.renderer") and labels["envport.renderer"] != renderer_version:
            moved.append(f"renderer {labels['envport.renderer']} -> {renderer_version}")
        why = "spec fields unchanged; the hash moved with " + (", ".join(moved) or
                                                                "shim file bytes, the lock or the site profile")
    data["changed"] = changed
    return StepResult(step, Verdict.REFUSED, f"built from {loaded.spec.name}@{built[:12]}, {rel} is "
                      f"{loaded.spec.name}@{current_hash[:12]} now; {why}", reason="stale",
                      lines=[f"fix: envport build {loaded.spec.name} --target apptainer"], data=data)


def failure(report: SifReport, exc: SifError) -> StepResult:
    step = f"inspect {Path(report.path).name}"
    verdict = Verdict.REFUSED if exc.reason in REFUSED_REASONS else Verdict.FAILED
    return StepResult(step, verdict, exc.message, reason=exc.reason, data={"reason": exc.reason})


def not_envport(report: SifReport) -> StepResult:
    return StepResult(f"inspect {Path(report.path).name}", Verdict.REFUSED,
                      "no envport.hash label: this SIF was not built by envport, so no spec can be compared "
                      "(its contents are listed above)", reason="not_envport")


def _shown(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)

"""What a SIF holds and whether its content is the env its spec describes, read without apptainer.

For an admin who pulled a `.sif` and has neither apptainer nor the build host.  The descriptor objects
(the def file, `inspect-metadata.json`, envport's `envport-spec.json`) are read and shown as what they
are: claims anyone could have written.  The verdict comes from the partition itself (sif_content.py):
its own `/.singularity.d` labels and environment, its python and distributions against the spec and
lock, its risky entries, and its bytes against what its build recorded.

The report is a list of checks (`Check`), each one section of the verdict: `layout` (nothing outside the
SIF's objects, the superblock inside its descriptor), `integrity` (the partition's sha256), `labels`
(the partition's against the descriptor's), `content` (python and distributions: sif_inspect.compare),
`risks`.  Another kind of evidence (a signature) is one more Check.  The first check that is not OK,
FAILED before REFUSED, decides the one StepResult:
OK (every check holds and the content is the env specs/NAME.yaml resolves to now); FAILED with the
SifError reason for a file that is not a usable SIF (truncated, not_a_sif, corrupt_*, trailing_bytes,
bytes_used_mismatch, corrupt, ...); REFUSED `stale` (the spec moved on: the fields are listed),
`content_mismatch`, `labels_disagree`, `risks`, `not_envport` (no envport.hash label), `foreign_arch`.
"""

from __future__ import annotations

import re
import shlex
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

from envport.sif import content as sif_content
from envport.core.files import shown_path
from envport.core.verdict import StepResult, Verdict
from envport.sif.format import (DATA_DEFFILE, SPEC_OBJECT, SifError, SifInfo, json_member, primary_partition,
                                 read_json_object, read_object, read_sif, read_squashfs_superblock, sif_labels)
from envport.sif.gate import Gated, gate
from envport.sif.handle import SifFile, unsafe
from envport.plan.changes import changed_paths

# Reasons of a SIF that is readable but cannot run here, or cannot be judged here: REFUSED, not FAILED.
REFUSED_REASONS = ("foreign_arch", "missing_tool")
METADATA = "inspect-metadata.json"
SITE_NAME = re.compile(r"[a-z0-9][a-z0-9-]*\Z")


@dataclass
class Check:
    """One section of the verdict: what was checked, from where, and what it found."""

    name: str
    verdict: Verdict
    detail: str
    reason: str = ""
    lines: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"name": self.name, "verdict": self.verdict.value, "detail": self.detail, "reason": self.reason,
                "lines": self.lines}


@dataclass
class SifReport:
    path: str
    facts: dict[str, Any] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)
    info: Optional[SifInfo] = None  # what was read, from the one open file: the signature check reads it too

    def add(self, key: str, value: Any) -> None:
        self.facts[key] = value

    def check(self, name: str, verdict: Verdict, detail: str, reason: str = "", lines=()) -> None:
        self.checks.append(Check(name, verdict, detail, reason, list(lines)))

    @property
    def claimed(self) -> dict:
        """The labels the image itself holds (its /.singularity.d), else the descriptor's."""
        content = self.facts.get("content") or {}
        return content.get("labels") if content.get("labels") is not None else (self.facts.get("labels") or {})


def utc(seconds: Any) -> str:
    """A header time as ISO 8601; a value no calendar holds (crafted: 2**62, -2**62) as itself."""
    try:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))
    except (OverflowError, OSError, ValueError, TypeError):
        return f"{seconds} (not a date)"


def read_report(source: "Path | SifFile | Gated") -> tuple[SifReport, Optional[SifError]]:
    """Everything readable from SOURCE (a path, opened once; an open file; or a SIF through the gate, whose
    reading is used as it is), the partition's content and its checks; the first SifError that stopped the
    reading, if any.  Every byte comes from the one open file."""
    report = SifReport(str(source.path if isinstance(source, (SifFile, Gated)) else source))
    try:
        if isinstance(source, Gated):
            info = source.info
        else:
            fh = source if isinstance(source, SifFile) else SifFile.open(source)
            report.path = str(fh.path)
            why = unsafe(fh)
            if why:
                report.check("placement", Verdict.REFUSED, f"{why}: a verdict on it holds only until then",
                             "sif_unsafe", ["fix: copy it into a folder only you (or root) can write, and "
                                            "inspect and run the copy"])
            info = read_sif(fh)
    except SifError as exc:
        return report, exc
    report.info = info
    report.add("header", {"size": info.file_size, "version": info.version, "arch": info.arch, "uuid": info.uuid,
                          "created": utc(info.created), "launch_script": info.launch_script})
    report.add("objects", [_descriptor(d) for d in info.descriptors])
    try:
        deffile = info.find(datatype=DATA_DEFFILE)
        if deffile is not None:
            report.add("deffile", read_object(info, deffile).decode("utf-8", "replace"))
        meta = read_json_object(info, METADATA)
        report.add("labels", sif_labels(info))
        env = json_member(info, METADATA, meta, "data", "attributes", "environment")
        report.add("environment", {str(k): str(v) for k, v in env.items()})
        report.add("runscript", str(json_member(info, METADATA, meta, "data", "attributes", "runscript", kind=str)))
        embedded = read_json_object(info, SPEC_OBJECT)
        report.add("embedded", embedded)
        part = primary_partition(info, arch=info.arch if info.arch != "unknown" else None)
        sb = read_squashfs_superblock(info.file, part.offset)
        report.add("squashfs", {"offset": part.offset, "bytes": sb.bytes_used, "compression": sb.compression,
                                "inodes": sb.inodes, "block_size": sb.block_size, "version": sb.version})
        sif_content.check_extent(info, part, sb.bytes_used)
        report.check("layout", Verdict.OK, f"{len(info.descriptors)} objects end where the file ends; "
                     f"squashfs {sb.bytes_used} bytes in a {part.size}-byte partition")
        _integrity(report, info, part, embedded)
        primary_partition(info)  # this machine's arch: raises foreign_arch
        _content(report, info.file, part.offset)
    except SifError as exc:
        return report, exc
    return report, None


def _integrity(report: SifReport, info, part, embedded) -> None:
    digest, bad, recorded = sif_content.integrity(info, part, embedded)
    report.add("partition_sha256", digest)
    if bad:
        report.check("integrity", Verdict.FAILED, "corrupt: the partition is not what its build recorded",
                     "corrupt", bad)
    elif recorded:
        report.check("integrity", Verdict.OK, f"partition sha256 {digest[:16]}... is what its build recorded "
                     "(a record a forger can rewrite too: only a signature says who built it)")
    else:
        report.check("integrity", Verdict.SKIPPED, f"partition sha256 {digest[:16]}...; no build record to "
                     "compare it with")


def _content(report: SifReport, sif: SifFile, offset: int) -> None:
    try:
        content = sif_content.read_content(sif, offset)
    except SifError as exc:
        if exc.reason != "missing_tool":
            raise
        report.check("content", Verdict.REFUSED, f"the image's own files were not read: {exc.message}",
                     "missing_tool")
        return
    report.add("content", content.to_dict())
    report.add("risks", content.risks)
    described = report.facts.get("labels") or {}
    if content.labels is not None and content.labels != described:
        differ = sorted(k for k in set(content.labels) | set(described) if content.labels.get(k) != described.get(k))
        report.check("labels", Verdict.REFUSED, f"{METADATA} and the image's /.singularity.d/labels.json "
                     f"disagree on {', '.join(differ[:8])}" + (f" (+{len(differ) - 8} more)" if len(differ) > 8 else ""),
                     "labels_disagree", [f"{k}: {described.get(k)!r} in {METADATA}, {content.labels.get(k)!r} "
                                         "in the image" for k in differ[:20]])
    if content.risk_count:
        kinds = sorted({r["kind"] for r in content.risks})
        report.check("risks", Verdict.REFUSED, f"{content.risk_count} risky entr"
                     f"{'y' if content.risk_count == 1 else 'ies'} in the image ({', '.join(kinds)}): "
                     "listed under risks", "risks")
    else:
        report.check("risks", Verdict.OK, f"no set-id files, device nodes, world-writable directories without "
                     f"the sticky bit or symlinks leaving the image among {content.entries} entries")


def admitted(path: Path, *, step: str, fix: str) -> "tuple[Gated, SifReport] | StepResult":
    """The SIF at PATH through the trust gate (sif/gate.py) and then through the content checks `inspect`
    runs (layout, trailing bytes, the superblock, the partition's sha256 against its build record), on the
    same open file: the Gated a command may mount and the report read from it, or the StepResult that refuses it (FAILED for a damaged
    file, REFUSED for the site's policy or a file others can rewrite).  `risks` are listed, not refused:
    every mount is nosuid,nodev (docs/apptainer.md).  Raises TrustRefused (exit 3) like the gate.
    FIX: the command that makes the file, for a SIF that is not there."""
    try:
        gated = gate(path)
    except SifError as exc:
        if exc.reason == "not_found":
            return StepResult(step, Verdict.REFUSED, exc.message, reason="sif_missing", lines=[f"fix: {fix}"])
        verdict = Verdict.FAILED if exc.reason not in ("sif_unsafe", *REFUSED_REASONS) else Verdict.REFUSED
        return StepResult(step, verdict, exc.message, reason=exc.reason,
                          lines=[f"fix: envport inspect {shlex.quote(str(path))}"])
    report, problem = read_report(gated)
    if problem is not None:
        return replace_step(failure(report, problem), step, path)
    for check in report.checks:
        if check.name != "risks" and check.verdict in (Verdict.FAILED, Verdict.REFUSED):
            return StepResult(step, check.verdict, f"not used: {check.detail}", reason=check.reason,
                              lines=[f"fix: envport inspect {shlex.quote(str(path))}", *check.lines])
    return gated, report


def replace_step(result: StepResult, step: str, path) -> StepResult:
    """RESULT under the name STEP, with the inspect command that shows the whole verdict as its last fix."""
    return replace(result, step=step, lines=[*result.lines, f"fix: envport inspect {shlex.quote(str(path))}"])


def verdict(report: SifReport, compared: Optional[StepResult] = None) -> StepResult:
    """The one StepResult: the first FAILED check, else the first REFUSED one in the report's order (the spec
    comparison, COMPARED, stands before `risks`), else COMPARED itself."""
    step = f"inspect {Path(report.path).name}"
    checks = list(report.checks)
    if compared is not None:
        at = next((i for i, c in enumerate(checks) if c.name == "risks"), len(checks))
        checks.insert(at, Check("spec", compared.verdict, compared.detail, compared.reason, compared.lines))
    shown = [c.to_dict() for c in checks]
    extra = dict(compared.data) if compared is not None else {}
    for bad in (Verdict.FAILED, Verdict.REFUSED):
        for c in checks:
            if c.verdict is bad:
                return StepResult(step, c.verdict, c.detail, reason=c.reason, lines=c.lines,
                                  data={**extra, "reason": c.reason, "checks": shown})
    if compared is None:
        return StepResult(step, Verdict.SKIPPED, "nothing to compare with", data={"checks": shown})
    return StepResult(step, compared.verdict, compared.detail, reason=compared.reason, lines=compared.lines,
                      data={**extra, "checks": shown})


def _descriptor(d) -> dict:
    out = {"id": d.id, "type": d.datatype_name, "group": d.group, "offset": d.offset, "size": d.size}
    if d.name:
        out["name"] = d.name
    if d.fs_type is not None:
        out.update(fs=d.fs_name, partition=d.partition_name, arch=d.arch)
    return out


def compare(report: SifReport, loaded, current_hash: str, renderer_version: str, plan, *,
            can_build: bool) -> StepResult:
    """CAN_BUILD: this host can build a SIF (builders/apptainer/builder.py `can_build`): the fix it names.
    OK when the image's own labels carry CURRENT_HASH and its content (python, distributions) is what
    PLAN (the spec and lock as they resolve now) installs; REFUSED `content_mismatch` or `stale` otherwise."""
    labels = report.claimed
    built = str(labels.get("envport.hash", ""))
    step = f"inspect {Path(report.path).name}"
    rel = shown_path(loaded.path, loaded.root)
    data = {"sif_hash": built, "spec_hash": current_hash, "spec": rel}
    claim = f"labels claim {labels.get('envport.name')}@{built[:12]}"
    content = report.facts.get("content")
    if built == current_hash:
        if content is None:
            return StepResult(step, Verdict.REFUSED, f"{claim}; the content was not read", reason="missing_tool",
                              data=data)
        problems, shows, extra = _judged(content, plan, loaded.spec.python)
        data.update(content_problems=problems, extra_distributions=extra)
        if problems:
            return StepResult(step, Verdict.REFUSED, f"{claim}, but content: {shows}: not {rel}",
                              reason="content_mismatch", lines=problems, data=data)
        return StepResult(step, Verdict.OK, f"matches {rel} from the content ({loaded.spec.name}@{built[:12]}): "
                          f"{shows}", data=data)
    changed, why = stale_reason(report.facts.get("embedded"), loaded, labels, renderer_version)
    data["changed"] = changed
    return StepResult(step, Verdict.REFUSED, f"{claim}, {rel} is {loaded.spec.name}@{current_hash[:12]} now; {why}",
                      reason="stale", lines=stale_fixes(loaded.spec.name, report.path, _has_spec(report.facts.get("embedded")), can_build),
                      data=data)


def _has_spec(embedded: Any) -> bool:
    return isinstance(embedded, dict) and isinstance(embedded.get("spec"), dict)


def stale_reason(embedded: Any, loaded, labels: dict, renderer_version: str) -> tuple[list[str], str]:
    """(the spec fields that differ between the SIF's embedded spec and LOADED, why the hash moved as a
    phrase): the fields when the SIF embeds a spec, else what else moves a hash."""
    old = embedded.get("spec") if isinstance(embedded, dict) else None
    try:
        changed = changed_paths(old, loaded.spec.model_dump(mode="json")) if isinstance(old, dict) else []
    except RecursionError:  # an embedded spec nested just under the JSON parser's limit (crafted)
        changed = ["(the embedded spec is nested too deeply to compare)"]
    if not isinstance(old, dict):
        return changed, "no embedded spec (built by apptainer, not envport's builder): the fields cannot be named"
    if changed:
        return changed, "changed: " + ", ".join(changed[:12]) + (f" (+{len(changed) - 12} more)"
                                                                 if len(changed) > 12 else "")
    moved = []
    if labels.get("envport.renderer") and labels["envport.renderer"] != renderer_version:
        moved.append(f"renderer {labels['envport.renderer']} -> {renderer_version}")
    return changed, "spec fields unchanged; the hash moved with " + (
        ", ".join(moved) or "shim file bytes, the lock or the site profile")


def stale_fixes(name: str, sif: str, embeds: bool, can_build: bool) -> list[str]:
    """The fixes of a stale SIF for its reader: the build where this host can build one, else (an admin
    holding only the file) a rebuild by its builder, or a run with the spec the SIF embeds."""
    rebuild = f"envport build {name} --target apptainer"
    embedded = f"envport witness {name} --target apptainer --sif {shlex.quote(sif)} --embedded-spec" if embeds else ""
    if can_build:
        return [f"fix: {rebuild}"] + ([f"or run it as built, with the spec it embeds: {embedded}"] if embeds else [])
    return [f"fix: ask its builder for a rebuild ({rebuild}, where the project is)"
            + (f", or run it with the spec it embeds: {embedded}" if embeds else "")]


def _judged(content: dict, plan, python: str) -> tuple[list[str], str, list[str]]:
    """sif_content.judge of the content as the report holds it (JSON-shaped)."""
    return sif_content.judge(sif_content.Content(labels=content.get("labels"), python=content.get("python"),
                                                 distributions=content.get("distributions") or {}), plan, python)


def failure(report: SifReport, exc: SifError) -> StepResult:
    step = f"inspect {Path(report.path).name}"
    verdict = Verdict.REFUSED if exc.reason in REFUSED_REASONS else Verdict.FAILED
    return StepResult(step, verdict, exc.message, reason=exc.reason,
                      data={"reason": exc.reason, "checks": [c.to_dict() for c in report.checks]})


def not_envport(report: SifReport) -> StepResult:
    return StepResult(f"inspect {Path(report.path).name}", Verdict.REFUSED,
                      "no envport.hash label: this SIF was not built by envport, so no spec can be compared "
                      "(its contents are listed above)", reason="not_envport")


def embedded_site(report: SifReport) -> Optional[str]:
    """The site name the embedded spec object claims, when it is one a site file could have."""
    embedded = report.facts.get("embedded")
    site = embedded.get("site") if isinstance(embedded, dict) else None
    return site if isinstance(site, str) and SITE_NAME.match(site) else None

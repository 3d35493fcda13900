"""Rebuild a SIF from the spec and lock it embeds, from nothing, and say whether the bytes are the same.

The inputs: the embedded spec (`envport-spec.json`), the project's specs/ folder for the shim files' bytes
and the lock (which the SIF embeds only as name, version and sha256: the lock's file names come from the
project), the site the SIF names (sites/NAME.yaml here), the SIF header's created time as
SOURCE_DATE_EPOCH.  They are the SIF's exactly when they hash to the SIF's envport hash: anything else is
refused before any build, naming the difference.  The build is envport's own builder, in a temporary
project (its own sif_dir), with the phase cache off: from nothing.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import yaml

from envport.core.progress import Progress
from envport.core.verdict import StepResult, Verdict
from envport.plan.lock import sha256_file
from envport.sif.compare import SifDiff, compare_sifs
from envport.sif.format import SPEC_OBJECT, SifError, read_json_object, read_sif


@dataclass
class Rebuilt:
    steps: list[StepResult] = field(default_factory=list)
    original: str = ""  # sha256 of the SIF given
    rebuilt: str = ""  # sha256 of the rebuild ("" when none was made)
    diff: Optional[SifDiff] = None


@contextmanager
def _environ(**values: str):
    saved = {k: os.environ.get(k) for k in values}
    for k, v in values.items():
        if v:
            os.environ[k] = v
        else:
            os.environ.pop(k, None)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _refused(step: str, reason: str, detail: str, fix: str = "") -> StepResult:
    return StepResult(step, Verdict.REFUSED, detail, reason=reason, lines=[f"fix: {fix}"] if fix else [])


def _project(tmp: Path, root: Path, doc: dict) -> Path:
    """A project in TMP: the project's specs/ (shim files, lock) with the embedded spec as specs/NAME.yaml,
    and its sites/."""
    name = doc["name"]
    specs = tmp / "specs"
    if (root / "specs").is_dir():
        shutil.copytree(root / "specs", specs, symlinks=False)
    specs.mkdir(exist_ok=True)
    (specs / f"{name}.yaml").write_text(yaml.safe_dump(doc["spec"], sort_keys=False), encoding="utf-8")
    if (root / "sites").is_dir():
        shutil.copytree(root / "sites", tmp / "sites")
    return tmp


def _own_dirs(site, root: Path, tmp: Path):
    """SITE with the rebuild's SIF in TMP (never over the original) and the project's wheelhouse (absolute)."""
    wheels = Path(site.wheelhouse_dir).expanduser()
    wheels = wheels if wheels.is_absolute() else root / wheels
    return site.model_copy(update={"wheelhouse_dir": str(wheels),
                                   "apptainer": site.apptainer.model_copy(update={"sif_dir": str(tmp / "sif")})})


def rebuild_check(sif: Path, root: Path, site_ref: Optional[str], progress: Progress,
                  work: Optional[Path] = None) -> Rebuilt:
    """Rebuild SIF from what it embeds (see the module's docstring) and compare; steps say each stage."""
    from envport.builders.apptainer.builder import SifBuild, builder_missing, sif_path, spec_epoch
    from envport.plan.site import load_site
    from envport.recipe.identity import resolve
    from envport.spec.loader import load_spec

    out = Rebuilt()
    step = f"rebuild-check {sif.name}"
    try:
        info = read_sif(sif)
        doc = read_json_object(info, SPEC_OBJECT)
    except SifError as exc:
        out.steps.append(StepResult(step, Verdict.FAILED, exc.message, reason=exc.reason))
        return out
    if not doc or not isinstance(doc.get("spec"), dict) or not isinstance(doc.get("hash"), str):
        out.steps.append(_refused(step, "no_embedded_spec", f"{sif}: no {SPEC_OBJECT} object with a spec and "
                                  "hash: only a SIF envport's builder made can be rebuilt from itself"))
        return out
    missing = builder_missing()
    if missing:
        out.steps.append(_refused(step, *missing))
        return out
    out.original = sha256_file(sif)
    site = load_site(site_ref or doc.get("site"), root)
    with tempfile.TemporaryDirectory(prefix="envport-rebuild-", dir=work) as tmp_s:
        tmp = _project(Path(tmp_s), root, doc)
        site = _own_dirs(site, root, tmp)
        loaded = load_spec(doc["name"], tmp)
        resolved = resolve(loaded, site, "apptainer")
        if resolved.hash != doc["hash"]:
            out.steps.append(_refused(step, "inputs_differ", f"the embedded spec with this project's lock, shim "
                                      f"files and site {site.name!r} hashes to {resolved.hash[:12]}, the SIF "
                                      f"was built as {doc['hash'][:12]}: these are not its inputs",
                                      f"run it where the SIF's project is (its specs/{doc['name']}.lock and "
                                      f"shim files), with --site naming the site it was built for"))
            return out
        target = sif_path(site, tmp, resolved.identity)
        target.parent.mkdir(parents=True, exist_ok=True)
        # The SIF's own time; left to the default when it is the default, so the label saying where the
        # time came from is the same too.
        given = "" if info.created == spec_epoch(resolved.hash) else str(info.created)
        with _environ(SOURCE_DATE_EPOCH=given, ENVPORT_SIF_PHASE_CACHE="off"):
            out.steps += SifBuild(loaded, site, tmp, resolved, target, progress).run(False)
        if not out.steps or not out.steps[-1].verdict.ok:
            return out
        out.rebuilt = sha256_file(target)
        if out.rebuilt == out.original:
            out.steps.append(StepResult(step, Verdict.OK, f"byte-identical: sha256 {out.original}",
                                        data={"sha256": out.original, "same": True}))
            return out
        out.diff = compare_sifs(sif, target)
        out.steps.append(StepResult(step, Verdict.FAILED, f"differs: {out.original[:16]}... given, "
                                    f"{out.rebuilt[:16]}... rebuilt", reason="not_reproducible",
                                    lines=diff_lines(out.diff),
                                    data={"sha256": out.original, "rebuilt_sha256": out.rebuilt, "same": False,
                                          "header": list(out.diff.header), "objects": list(out.diff.objects),
                                          "paths": list(out.diff.paths)}))
    return out


def diff_lines(diff: SifDiff, limit: int = 20) -> list[str]:
    lines = [f"header: {', '.join(diff.header)}"] if diff.header else []
    lines += [f"object: {o}" for o in diff.objects]
    lines += [f"path: {p}" for p in diff.paths[:limit]]
    if len(diff.paths) > limit:
        lines.append(f"... and {len(diff.paths) - limit} more paths")
    return lines

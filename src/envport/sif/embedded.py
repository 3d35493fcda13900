"""The spec a SIF embeds (`envport-spec.json`), for an admin who holds the SIF and not its project.

`envport witness NAME --target apptainer --sif FILE` and `envport verify` with no specs/ (or with
`--embedded-spec`) run the SIF against the spec its build embedded.  That object is a claim, like every
descriptor; it is used only after the checks that tie it to this image:

- the trust gate first (sif/gate.py, through sif_inspect.admitted): under a site's `trust.require_signed`
  nothing is read from an unverified file as a spec (a signature covers the object: it is in the
  partition's group);
- the SIF read as `envport inspect` reads it, from the same open file (sif_inspect.admitted): a whole SIF,
  its partition the one the embedded record names (sha256), its own `/.singularity.d` labels agreeing
  with the descriptor's;
- the image's own labels naming the embedded spec's name and hash, a hash of 64 hex digits (anything else
  is no hash envport wrote: a path, terminal escapes);
- the spec validated as a spec file is (an unknown field or a name no shell can quote is refused).

Risky entries (set-id files, device nodes) are not a reason to refuse here, as they are not for a SIF run
with its project's spec: every mount is `nosuid,nodev` (docs/apptainer.md, the admin's threat model).
What the embedded spec cannot give: the shim files' bytes (the spec names them, the project holds them),
so verify checks those files are there and says their bytes were not checked.

`difference` is the other direction: a project's spec and a SIF built from another version of it; the
changed fields are named from the embedded spec, as `inspect`'s `stale` verdict names them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

from envport.sif.format import SPEC_OBJECT
from envport.core.verdict import StepResult, Verdict
from envport.recipe.identity import Identity
from envport.spec.loader import Loaded
from envport.spec.model import SHA256_RE


@dataclass(frozen=True)
class Embedded:
    loaded: Loaded  # path: the SIF itself; embedded_in set (no project: no shim bytes, no lock)
    identity: Identity  # the hash the SIF was built under: the embedded spec's, the image's own label
    checked: str  # what tied the spec to the image

    @property
    def note(self) -> str:
        sif = Path(self.loaded.path).name
        return (f"spec: the one {sif} embeds ({SPEC_OBJECT}; no specs/{self.identity.name}.yaml here): "
                f"{self.identity.ref}, {self.checked}")


def embedded(sif: Path, name: str, root: Path, *, checked=None) -> Union[Embedded, StepResult]:
    """The spec SIF embeds as a Loaded rooted at ROOT (where the run records and writes its reports), or
    the StepResult refusing it.  NAME must be the embedded spec's name (an EnvportError, exit 2, if not).
    CHECKED: the (Gated, SifReport) a caller already had from sif_inspect.admitted: not read again."""
    from envport.sif.report import admitted
    from envport.spec.model import Spec
    from envport.spec.yamlfile import RawSpec, validate

    step = f"spec {sif.name}"
    # TrustRefused (exit 3) before anything in the file is read as a spec; then inspect's checks.
    if checked is None:
        checked = admitted(sif, step=step, fix="the file you named with --sif does not exist: check the path")
    if isinstance(checked, StepResult):
        return checked
    _, report = checked
    bound = _tied(report, name, sif, step)
    if isinstance(bound, StepResult):
        return bound
    doc, spec_data, built_hash = bound
    spec = validate(RawSpec(sif, spec_data), spec_data, Spec, f"{sif} ({SPEC_OBJECT})")
    integrity = next((c for c in report.checks if c.name == "integrity"), None)
    tied = "the image's own labels name the same env and hash" + (
        ", its partition is the one it records (sha256)" if integrity and integrity.verdict is Verdict.OK else
        " (it records no partition sha256)")
    site = doc.get("site") if isinstance(doc.get("site"), str) else None
    loaded = Loaded(spec=spec, path=Path(sif), root=root, chain=[Path(sif)], embedded_in=Path(sif))
    return Embedded(loaded, Identity(name, built_hash, site), f"{tied} (claims, like any label: only a "
                    "signature says who built it)")


def _tied(report, name: str, sif: Path, step: str):
    """(the spec object, its spec, the hash) when REPORT's embedded spec object is NAME's and the image's own
    labels name the same env and hash; else the StepResult refusing it (EnvportError when it is another env's)."""
    from envport.core.errors import EnvportError
    from envport.core.untrusted import shown

    doc = report.facts.get("embedded")
    spec_data = doc.get("spec") if isinstance(doc, dict) else None
    if not isinstance(spec_data, dict):
        return _refused(step, "no_embedded_spec", f"{sif} holds no {SPEC_OBJECT} (apptainer built it, not "
                        "envport's builder), so there is no spec to run it with",
                        f"run it in the project that built it (specs/{name}.yaml), or pass -C ROOT")
    built_as, built_hash = spec_data.get("name"), doc.get("hash")
    if built_as != name:
        raise EnvportError(f"{sif} embeds the spec of {shown(str(built_as))}, not {name}: name the env it "
                           f"holds (envport witness {shown(str(built_as))} --target apptainer --sif {sif})")
    own = (report.facts.get("content") or {}).get("labels") or {}
    if doc.get("name") != name or own.get("envport.name") != name or not isinstance(built_hash, str) \
            or not SHA256_RE.fullmatch(built_hash) or own.get("envport.hash") != built_hash:
        return _refused(step, "embedded_spec_mismatch",
                        f"{SPEC_OBJECT} says {shown(str(doc.get('name')))}@{shown(str(built_hash))[:12]}, the "
                        f"image's own labels {shown(str(own.get('envport.name')))}@"
                        f"{shown(str(own.get('envport.hash')))[:12]}: the spec object is not this image's",
                        f"envport inspect {sif}; get the file again from its builder")
    return doc, spec_data, built_hash


def judged(report) -> StepResult:
    """`envport inspect FILE.sif` with no project: the image's content judged against the spec and lock its
    own spec object embeds (after the object is tied to the image's labels): OK, or REFUSED content_mismatch."""
    from envport.core.errors import EnvportError
    from envport.sif import content as sif_content
    from envport.spec.model import Spec
    from envport.spec.yamlfile import RawSpec, validate

    sif = Path(report.path)
    step = f"inspect {sif.name}"
    name = str(report.claimed.get("envport.name", ""))
    try:
        tied = _tied(report, name, sif, step)
        if isinstance(tied, StepResult):
            return tied
        doc, spec_data, built_hash = tied
        spec = validate(RawSpec(sif, spec_data), spec_data, Spec, f"{sif} ({SPEC_OBJECT})")
    except EnvportError as exc:
        return _refused(step, "embedded_spec_invalid", str(exc), f"envport inspect {sif} in the project that built it")
    content = report.facts.get("content")
    if content is None:
        return StepResult(step, Verdict.REFUSED, "the content was not read", reason="missing_tool")
    want, locked = embedded_pins(doc, spec)
    problems, shows, _ = sif_content.judge_against(sif_content.Content(
        labels=content.get("labels"), python=content.get("python"), distributions=content.get("distributions") or {}),
        want, locked, spec.python)
    against = f"the spec {'and lock ' if locked else ''}it embeds ({SPEC_OBJECT}: {name}@{built_hash[:12]}" + (
        "" if locked else "; no lock embedded: the spec's == pins") + ")"
    data = {"sif_hash": built_hash, "spec": "embedded", "lock": "embedded" if locked else None}
    if problems:
        return StepResult(step, Verdict.REFUSED, f"content: {shows}: not {against}", reason="content_mismatch",
                          lines=problems, data={**data, "content_problems": problems})
    return StepResult(step, Verdict.OK, f"matches {against} from the content: {shows}", data=data)


def embedded_pins(doc: dict, spec) -> tuple[dict[str, str], bool]:
    """({canonical name: version} the image must hold, whether that is a whole lock): the embedded lock's
    phases (a later phase winning), else the spec's `==` pins (spec/model.last_pins)."""
    from envport.spec.model import canonical_name, last_pins

    want: dict[str, str] = {}
    lock = doc.get("lock")
    if isinstance(lock, list) and lock:
        for phase in lock:
            for dist in (phase.get("dists") or []) if isinstance(phase, dict) else []:
                if isinstance(dist, list) and len(dist) >= 2 and all(isinstance(x, str) for x in dist[:2]):
                    want[canonical_name(dist[0])] = dist[1]
        return want, True
    return last_pins(spec), False


def difference(sif: Path, loaded: Loaded, spec_hash: str) -> Optional[dict]:
    """How the SIF differs from LOADED as it resolves now (SPEC_HASH): None when its labels carry that hash,
    or the file cannot be read (the run itself then says why); else the hashes, the changed fields and a line."""
    from envport.sif.report import stale_reason
    from envport.core.files import shown_path
    from envport.sif.format import SifError, read_json_object, sif_labels
    from envport.sif.gate import gate
    from envport.renderers import RENDERER_VERSION

    try:
        info = gate(sif).info  # the open file every later step of this run reads (TrustRefused: exit 3)
        labels = sif_labels(info)
        doc = read_json_object(info, SPEC_OBJECT)
    except SifError:
        return None
    built = str(labels.get("envport.hash", ""))
    if not built or built == spec_hash:
        return None
    changed, why = stale_reason(doc, loaded, labels, RENDERER_VERSION)
    rel = shown_path(loaded.path, loaded.root)
    return {"sif_hash": built, "spec_hash": spec_hash, "changed": changed,
            "line": f"{Path(sif).name} was built as {loaded.spec.name}@{built[:12]}, {rel} is "
                    f"{loaded.spec.name}@{spec_hash[:12]} now; {why}"}


def _refused(step: str, reason: str, detail: str, fix: str) -> StepResult:
    return StepResult(step, Verdict.REFUSED, detail, reason=reason, lines=[f"fix: {fix}"])

"""Attach a signed statement to a SIF: the subject is its primary partition's sha256, read from the file."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from envport.sif.provenance.envelope import seal
from envport.sif.provenance.statement import BadStatement, statement, subject, subject_digests, validate
from envport.sif.provenance.store import append_statement


@dataclass(frozen=True)
class Attested:
    sif: str
    object_id: int
    predicate_type: str
    partition_sha256: str
    signers: tuple[str, ...]

    def describe(self) -> str:
        return (f"{self.predicate_type} statement, SIF object {self.object_id}, subject sha256 "
                f"{self.partition_sha256[:16]}... (the primary partition), signed by {', '.join(self.signers)}")


def primary_of(info):
    """The primary system partition of the SIF INFO, whatever architecture it is for (a statement is about
    content, and an image built for another machine is attested where it was built); SifError without one."""
    from envport.sif.format import PART_PRIMSYS, primary_partition

    part = next((d for d in info.descriptors if d.partition_type == PART_PRIMSYS), None)
    return part if part is not None else primary_partition(info)


def partition_subject(info, part) -> tuple[dict, str]:
    """(the in-toto subject naming PART of the SIF INFO by its sha256, that sha256)."""
    from envport.sif.content import partition_sha256

    digest = partition_sha256(info, part)
    return subject(Path(info.path).name, digest, {"sif.object": str(part.id), "sif.role": "primary-partition"}), digest


def attest_sif(path: str | Path, signers: Sequence, predicate_type: str, predicate: dict, *,
               read=None, doc: Optional[dict] = None) -> Attested:
    """Sign a Statement of PREDICATE about the SIF at PATH with SIGNERS (sif/keys.py PrivateKeys) and append
    it. READ: (SifInfo, partition) already read and judged, e.g. by the gate a witness ran through, so the
    subject is the bytes that ran; default: the file read now. DOC: a whole statement given instead (its
    subject must name this partition: BadStatement otherwise)."""
    from envport.sif.format import read_sif

    info, part = read or (None, None)
    if info is None:
        info = read_sif(path)
        part = primary_of(info)
    subj, digest = partition_subject(info, part)
    if doc is None:
        doc = statement([subj], predicate_type, predicate)
    else:
        validate(doc)
    if digest not in subject_digests(doc):
        raise BadStatement(f"the statement's subjects ({', '.join(sorted(subject_digests(doc))) or 'none'}) do not "
                           f"name this SIF's primary partition (sha256 {digest}): it is about other content")
    envelope = seal(doc, signers)
    new_id = append_statement(path, envelope, part.id)
    return Attested(str(path), new_id, str(doc["predicateType"]), digest, tuple(k.public.keyid for k in signers))


class NoEmbeddedSpec(BadStatement):
    """The SIF embeds no spec object (apptainer's own route): there is no build of envport's to attest."""


def provenance_of(info) -> dict:
    """The SLSA provenance v1 predicate of the SIF INFO, from the spec object its builder embedded;
    BadStatement when it embeds none (apptainer's own build) or not envport's."""
    from envport.sif.provenance.slsa import facts_from_embedded, predicate
    from envport.sif.format import SPEC_OBJECT, SifError, read_json_object

    try:
        doc = read_json_object(info, SPEC_OBJECT)
        facts = facts_from_embedded(doc) if doc else None
    except (SifError, KeyError, TypeError, ValueError) as exc:
        raise BadStatement(f"{info.path}: its {SPEC_OBJECT} is not envport's ({exc})") from None
    if facts is None:
        raise NoEmbeddedSpec(f"{info.path} holds no {SPEC_OBJECT}: envport's builder did not build it, so there "
                           "is no build to attest; attest a statement you wrote with --statement FILE.json")
    return predicate(facts)

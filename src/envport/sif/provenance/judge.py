"""Every statement a SIF carries, read and judged: who signed it, what it claims, whether it is about this
SIF's content.

A statement counts (`trusted`) only when one of the given keys verifies its DSSE signature AND one of its
subjects' sha256 is the primary partition's, recomputed from the file: a statement copied from another
image, or about another partition, is `subject_mismatch` and ignored, however well signed. Without keys a
statement is listed `unchecked` and claims nothing. The site's `trust.require_witnessed` asks for a trusted
witness statement in which every listed check passed (`missing_witnesses`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

from envport.sif.provenance.envelope import open_envelope, signed_by
from envport.sif.provenance.statement import WITNESS_PREDICATE, BadStatement, subject_digests
from envport.sif.provenance.store import read_statement_object, statement_objects
from envport.sif.provenance.witness import passed

TRUSTED, UNCHECKED, UNTRUSTED, MISMATCH, DAMAGED = (
    "trusted", "unchecked", "untrusted_signer", "subject_mismatch", "bad_statement")


@dataclass(frozen=True)
class Judged:
    object_id: int
    verdict: str  # trusted | unchecked | untrusted_signer | subject_mismatch | bad_statement
    predicate_type: str = ""
    signers: tuple[str, ...] = ()  # the keyids the envelope names
    by: str = ""  # the given key that verified it: file (keyid)
    detail: str = ""
    statement: Optional[dict] = field(default=None, repr=False, compare=False)

    @property
    def witnessed(self) -> dict[str, bool]:
        """check -> passed, for a witness statement (else {})."""
        if self.predicate_type != WITNESS_PREDICATE or not self.statement:
            return {}
        return passed(self.statement.get("predicate") or {})

    def to_dict(self) -> dict:
        out = {"object": self.object_id, "verdict": self.verdict, "predicate_type": self.predicate_type,
               "signers": list(self.signers), "by": self.by, "detail": self.detail}
        if self.witnessed:
            out["witnessed"] = self.witnessed
        return out


def judge_one(info, d, partition_sha256: str, keys: Sequence) -> Judged:
    try:
        env, doc = open_envelope(read_statement_object(info, d))
    except BadStatement as exc:
        return Judged(d.id, DAMAGED, detail=f"statement object {d.id} is damaged: {exc}")
    except Exception as exc:  # a SifError: the object lies past the file's end or is too large
        return Judged(d.id, DAMAGED, detail=f"statement object {d.id} does not read: {exc}")
    base = dict(object_id=d.id, predicate_type=str(doc["predicateType"]),
                signers=tuple(k or "(no keyid)" for k, _ in env.signatures), statement=doc)
    if partition_sha256 not in subject_digests(doc):
        return Judged(**base, verdict=MISMATCH,
                      detail=f"its subject is sha256 {', '.join(sorted(subject_digests(doc)))[:23]}..., not "
                             f"this SIF's primary partition ({partition_sha256[:16]}...): about other content, "
                             "ignored")
    if not keys:
        return Judged(**base, verdict=UNCHECKED, detail="no public key given (--key PUB.pem or trust.keys)")
    key = signed_by(env, keys)
    if key is None:
        given = ", ".join(f"{k.path} ({k.keyid})" for k in keys)
        return Judged(**base, verdict=UNTRUSTED,
                      detail=f"signed by {', '.join(base['signers']) or 'nobody'}; no given key verifies it "
                             f"(given: {given})")
    return Judged(**base, verdict=TRUSTED, by=f"{key.path} ({key.keyid})", detail="signature verified")


def judge_statements(info, partition, keys: Sequence) -> list[Judged]:
    """Each statement object of the SIF INFO (sif/format.py, read through its open file), judged against
    KEYS (sif/keys.py PublicKeys) and the sha256 of PARTITION (hashed once per open file)."""
    from envport.sif.content import partition_sha256

    objects = statement_objects(info)
    if not objects:
        return []
    digest = partition_sha256(info, partition)
    return [judge_one(info, d, digest, keys) for d in objects]


def missing_witnesses(judged: Sequence[Judged], required: Sequence[str]) -> list[str]:
    """The checks of REQUIRED that no trusted witness statement shows passed ([] when one shows them all:
    the checks must pass in ONE run, the way the site will run it, not be collected from several)."""
    if not required:
        return []
    best: list[str] = list(required)
    for j in judged:
        if j.verdict == TRUSTED and j.predicate_type == WITNESS_PREDICATE:
            shown = j.witnessed
            gap = [c for c in required if not shown.get(c)]
            if len(gap) < len(best):
                best = gap
    return best

"""The in-toto Statement v1 (https://github.com/in-toto/attestation/blob/main/spec/v1/statement.md).

A statement is written here as plain JSON (so numbers stay integers and the bytes are ours to fix) and
validated by the in-toto-attestation library: parsed into its protobuf Statement (unknown or mistyped
fields fail) and checked by its `validate` (type URI, at least one subject, each with a digest, a predicate
type and a predicate).
"""

from __future__ import annotations

import json

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"  # the DSSE payloadType and the ORAS artifactType
SLSA_PROVENANCE = "https://slsa.dev/provenance/v1"
WITNESS_PREDICATE = "https://envport.dev/witness/v1"


class BadStatement(ValueError):
    """Not an in-toto Statement v1: the message says which field."""


def subject(name: str, sha256: str, annotations: dict | None = None) -> dict:
    """A ResourceDescriptor naming NAME by its sha256 (what a verifier recomputes)."""
    out = {"name": name, "digest": {"sha256": sha256}}
    if annotations:
        out["annotations"] = annotations
    return out


def statement(subjects: list[dict], predicate_type: str, predicate: dict) -> dict:
    doc = {"_type": STATEMENT_TYPE, "subject": subjects, "predicateType": predicate_type, "predicate": predicate}
    validate(doc)
    return doc


def validate(doc) -> None:
    """DOC is an in-toto Statement v1, else BadStatement."""
    from google.protobuf import json_format
    from in_toto_attestation.v1 import statement_pb2
    from in_toto_attestation.v1.statement import Statement

    if not isinstance(doc, dict):
        raise BadStatement(f"a statement is a JSON object, not {type(doc).__name__}")
    try:
        Statement.copy_from_pb(json_format.ParseDict(doc, statement_pb2.Statement())).validate()
    except (json_format.ParseError, ValueError, TypeError) as exc:
        raise BadStatement(f"not an in-toto Statement v1: {exc}") from None


def to_bytes(doc: dict) -> bytes:
    """The payload: compact JSON, keys sorted (the same statement gives the same bytes)."""
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()


def subject_digests(doc: dict) -> set[str]:
    return {str(s.get("digest", {}).get("sha256", "")) for s in doc.get("subject", []) if isinstance(s, dict)}

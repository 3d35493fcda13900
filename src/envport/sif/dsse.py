"""DSSE envelopes (secure-systems-lab's spec, as sigstore's dsse package writes them for sif).

The signed message is the PAE, `DSSEv1 <len(type)> <type> <len(payload)> <payload>`,
never the bare payload, so a signature cannot be replayed as one over
another payload type. apptainer writes the envelope as compact JSON with no
trailing newline (sif >= 2.19; older files end in `\\n`, and both read).
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass

PAYLOAD_TYPE = "application/vnd.sylabs.sif-metadata+json"


def pae(payload_type: str, payload: bytes) -> bytes:
    t = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(payload), payload)


def encode(payload: bytes, signatures: list[tuple[str, bytes]]) -> bytes:
    """The envelope for PAYLOAD with (keyid, signature) pairs, in the order given."""
    doc = {"payloadType": PAYLOAD_TYPE, "payload": base64.b64encode(payload).decode(),
           "signatures": [{"keyid": kid, "sig": base64.b64encode(sig).decode()} for kid, sig in signatures]}
    return json.dumps(doc, separators=(",", ":")).encode()


@dataclass(frozen=True)
class Envelope:
    payload_type: str
    payload: bytes
    signatures: tuple[tuple[str, bytes], ...]  # (keyid, signature)


class BadEnvelope(ValueError):
    pass


def _b64(text) -> bytes:
    """Standard base64, or URL-safe as sif's DecodedPayload falls back to."""
    if not isinstance(text, str):
        raise BadEnvelope(f"{text!r} is not a base64 string")
    try:
        return base64.b64decode(text, validate=True)
    except binascii.Error:
        try:
            return base64.urlsafe_b64decode(text)
        except binascii.Error as exc:
            raise BadEnvelope(f"not base64 ({exc})") from None


def is_envelope(data: bytes) -> bool:
    """DATA is a DSSE envelope of SIF metadata (how sif tells DSSE from PGP signatures)."""
    try:
        doc = json.loads(data)
    except ValueError:
        return False
    return isinstance(doc, dict) and doc.get("payloadType") == PAYLOAD_TYPE


def decode(data: bytes) -> Envelope:
    try:
        doc = json.loads(data)
        sigs = tuple((str(s.get("keyid", "")), _b64(s["sig"])) for s in doc["signatures"])
        return Envelope(str(doc["payloadType"]), _b64(doc["payload"]), sigs)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise BadEnvelope(f"not a DSSE envelope ({exc})") from None

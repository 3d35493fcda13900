"""DSSE envelopes (secure-systems-lab's spec, as sigstore's dsse package writes them for sif).

The signed message is the PAE, `DSSEv1 <len(type)> <type> <len(payload)> <payload>`,
never the bare payload, so a signature cannot be replayed as one over
another payload type. apptainer writes the envelope as compact JSON with no
trailing newline (sif >= 2.19; older files end in `\\n`, and both read).

A signature object is whatever the file's author put there: JSON is read only when it is at most
MAX_ENVELOPE_BYTES and nests at most MAX_DEPTH deep (an envelope nests 3, and so does its payload, sif's
image metadata), counted before the parser sees it, so an object of `[[[[...` 100,000 deep is a
damaged signature (`BadEnvelope`), never the parser's RecursionError.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass

PAYLOAD_TYPE = "application/vnd.sylabs.sif-metadata+json"
# A DSSE envelope is a few KB (sif/verify.py reads no signature object larger than this either).
MAX_ENVELOPE_BYTES = 1 << 20
MAX_DEPTH = 16
# What the depth count looks at: brackets, and the quotes and backslashes that say which are in a string.
_JSON_MARKS = re.compile(rb'[\[\]{}"\\]')


def pae(payload_type: str, payload: bytes) -> bytes:
    t = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(payload), payload)


def encode(payload: bytes, signatures: list[tuple[str, bytes]], payload_type: str = PAYLOAD_TYPE) -> bytes:
    """The envelope for PAYLOAD with (keyid, signature) pairs, in the order given (PAYLOAD_TYPE: SIF
    metadata; sif/provenance/envelope.py seals in-toto statements with its own)."""
    doc = {"payloadType": payload_type, "payload": base64.b64encode(payload).decode(),
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


def json_depth(data: bytes, limit: int = MAX_DEPTH) -> int:
    """How deep DATA's JSON arrays and objects nest (brackets inside strings do not count), counted up to
    one past LIMIT, where it stops reading. One pass, whatever DATA holds."""
    depth = deepest = 0
    in_string, escaped_until = False, -1
    for m in _JSON_MARKS.finditer(data):
        at = m.start()
        if at < escaped_until:
            continue  # the character after a backslash in a string
        mark = data[at]
        if in_string:
            if mark == 0x5C:  # backslash
                escaped_until = at + 2
            elif mark == 0x22:  # quote
                in_string = False
        elif mark == 0x22:
            in_string = True
        elif mark in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    break
        elif mark in (0x5D, 0x7D):  # ] }
            depth -= 1
    return deepest


def _bounded_json(data: bytes, what: str):
    """DATA parsed as JSON, or BadEnvelope: too large, nested too deep, or not JSON."""
    if len(data) > MAX_ENVELOPE_BYTES:
        raise BadEnvelope(f"{what} is {len(data)} bytes, over {MAX_ENVELOPE_BYTES}: no signature is that large")
    if json_depth(data) > MAX_DEPTH:
        raise BadEnvelope(f"{what} nests JSON more than {MAX_DEPTH} deep (a DSSE envelope nests 3): crafted, "
                          "not read")
    try:
        return json.loads(data)
    except RecursionError:  # the count above keeps the parser far from its limit; kept in case it moves
        raise BadEnvelope(f"{what} nests JSON too deep to read") from None
    except ValueError as exc:
        raise BadEnvelope(f"{what} is not JSON ({exc})") from None


def is_envelope(data: bytes) -> bool:
    """DATA is a DSSE envelope of SIF metadata (how sif tells DSSE from PGP signatures). One that names the
    SIF metadata type but is too large or too deep to read counts too: `decode` then says what is wrong."""
    try:
        doc = _bounded_json(data, "the envelope")
    except BadEnvelope:
        return data.lstrip().startswith(b"{") and PAYLOAD_TYPE.encode() in data[:MAX_ENVELOPE_BYTES]
    return isinstance(doc, dict) and doc.get("payloadType") == PAYLOAD_TYPE


def decode(data: bytes) -> Envelope:
    """The envelope in DATA, its payload checked to be JSON of bounded depth (the SIF metadata it carries is
    parsed later, whether or not a key verified it); BadEnvelope says why not."""
    doc = _bounded_json(data, "the envelope")
    try:
        sigs = tuple((str(s.get("keyid", "")), _b64(s["sig"])) for s in doc["signatures"])
        envelope = Envelope(str(doc["payloadType"]), _b64(doc["payload"]), sigs)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise BadEnvelope(f"not a DSSE envelope ({exc})") from None
    if json_depth(envelope.payload) > MAX_DEPTH:
        raise BadEnvelope(f"its payload nests JSON more than {MAX_DEPTH} deep (SIF metadata nests 3): crafted, "
                          "not read")
    return envelope

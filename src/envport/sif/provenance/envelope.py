"""Statements in DSSE envelopes, signed with the keys `envport sign` uses (sif/keys.py).

The envelope is DSSE's (sif/dsse.py: the PAE, compact JSON) with payloadType application/vnd.in-toto+json,
which is what cosign, in-toto and GitHub's attestations carry; a SIF signature's envelope names SIF
metadata instead, so one is never mistaken for the other.
"""

from __future__ import annotations

import json
from typing import Optional, Sequence

from envport.sif.provenance.statement import PAYLOAD_TYPE, BadStatement, to_bytes, validate
from envport.sif import dsse
from envport.sif import keys as keymod


def seal(doc: dict, signers: Sequence[keymod.PrivateKey]) -> bytes:
    """DOC (a Statement, validated) signed by every key in SIGNERS, as one DSSE envelope."""
    validate(doc)
    payload = to_bytes(doc)
    message = dsse.pae(PAYLOAD_TYPE, payload)
    return dsse.encode(payload, [(k.public.keyid, keymod.sign(k, message)) for k in signers],
                       payload_type=PAYLOAD_TYPE)


def open_envelope(data: bytes) -> tuple[dsse.Envelope, dict]:
    """(the envelope, its Statement) of DATA; BadStatement when it is not a signed in-toto statement."""
    try:
        env = dsse.decode(data)
    except dsse.BadEnvelope as exc:
        raise BadStatement(str(exc)) from None
    if env.payload_type != PAYLOAD_TYPE:
        raise BadStatement(f"its payloadType is {env.payload_type!r}, not {PAYLOAD_TYPE}")
    try:
        doc = json.loads(env.payload)
    except ValueError as exc:
        raise BadStatement(f"its payload is not JSON ({exc})") from None
    validate(doc)
    return env, doc


def signed_by(env: dsse.Envelope, keys: Sequence[keymod.PublicKey]) -> Optional[keymod.PublicKey]:
    """The first of KEYS one of ENV's signatures verifies with (over the PAE), else None. A signature whose
    keyid names another key is skipped, as sigstore's DSSE verifier skips it."""
    message = dsse.pae(env.payload_type, env.payload)
    for kid, sig in env.signatures:
        for key in keys:
            if (not kid or kid == key.keyid) and keymod.verify(key, sig, message):
                return key
    return None

"""Check a SIF's signatures the way `apptainer verify --key PUB.pem` does (sif `pkg/integrity/verify.go`).

`check_signatures(path, keys, pgp_keyrings)` is the one entry point (envport
verify-sig and inspect call it): it lists every signature object (what it is
linked to, its form, hash, signer ids, the objects it covers) and, given
keys, checks each, then judges the image as apptainer does:

- every used object other than a signature must be in an object group, and
  every group needs at least one signature that is not legacy (`SIFHASH`):
  else `unsigned`;
- every signature linked to a group must verify: one bad or foreign
  signature fails the group, as a group signed by two keys fails with one;
- a DSSE signature verifies when one of its envelope's signatures checks
  with a given key over the PAE (a signature whose keyid names another key is
  skipped, as sigstore's verifier skips it) and the signed metadata equals the
  file now: header, each descriptor, each object, and the SET of objects, so
  an object added to the group after signing fails it.

Reasons, one token each: `bad_signature` (a signed thing changed: the message
names which: the header, object N's descriptor or data, an object added or
removed, the signature object itself), `untrusted_signer` (intact as far as
can be told, but no given key made it), `unsigned`. With no keys the
signatures are listed and the verdict is `unchecked`: nothing is claimed.
"""

from __future__ import annotations

import struct
from dataclasses import asdict, dataclass, field

from envport.sif.format import DATA_SIGNATURE, GROUP_MASK
from envport.sif import dsse, keys as keymod, metadata, pgp
from envport.sif.image import RawDescriptor, RawImage, read_raw

EXTRA_HEAD = struct.Struct("<i256s")
VERIFIED, BAD, UNTRUSTED, UNSIGNED, UNCHECKED, LEGACY = (
    "verified", "bad_signature", "untrusted_signer", "unsigned", "unchecked", "legacy")
# A DSSE envelope is a few KB (RSA-4096, several signers); a "signature" past this is not read into memory.
MAX_SIGNATURE_BYTES = 1 << 20
# When several things are wrong the image's reason is the worst one: a change beats a stranger beats a gap.
SEVERITY = (BAD, UNTRUSTED, UNSIGNED, UNCHECKED)


@dataclass(frozen=True)
class SignatureCheck:
    id: int  # the signature object's ID
    group: int | None  # the object group it is linked to; None when linked to one object
    linked_object: int | None  # the object it is linked to, when not a group
    form: str  # dsse | pgp | legacy | unknown
    hash: str  # from the descriptor's hash type: sha256, ...
    signers: tuple[str, ...]  # DSSE keyids in the envelope, or the PGP fingerprint in the descriptor
    objects: tuple[int, ...]  # IDs of the objects the signed metadata lists
    verdict: str  # verified | bad_signature | untrusted_signer | unchecked | legacy
    by: str = ""  # the given key that verified it: its file and keyid, or the PGP fingerprint
    detail: str = ""  # for people: what changed, who signed, why it was not checked


@dataclass(frozen=True)
class SignatureReport:
    path: str
    signatures: tuple[SignatureCheck, ...]
    groups: tuple[int, ...]  # the image's object groups
    verdict: str  # verified | bad_signature | untrusted_signer | unsigned | unchecked
    problems: tuple[str, ...] = field(default=())  # every reason the verdict is not `verified`, for people
    # The objects, by ID, whose descriptor and bytes a verified signature covers (read_sif refused a table
    # naming one ID twice, so an ID is one descriptor: the gate mounts the partition only if it is here).
    signed_ids: frozenset = field(default=frozenset())

    @property
    def ok(self) -> bool:
        return self.verdict == VERIFIED

    def to_dict(self) -> dict:
        return {"path": self.path, "verdict": self.verdict, "groups": list(self.groups),
                "problems": list(self.problems),
                "signatures": [dict(asdict(s), signers=list(s.signers), objects=list(s.objects))
                               for s in self.signatures]}


def _hash_of(d: RawDescriptor) -> tuple[str, str]:
    """(hash name, problem) from the signature descriptor's Extra."""
    code = EXTRA_HEAD.unpack(d.extra[:EXTRA_HEAD.size])[0]
    if code not in metadata.HASH_NAMES:
        return f"unknown({code})", f"hash type {code} in its descriptor is not one sif knows (1-5)"
    name = metadata.HASH_NAMES[code]
    if name not in keymod.PAE_HASHES:
        return name, f"hash {name}: sif's integrity package does not sign or verify with it"
    return name, ""


def _form(data: bytes) -> str:
    if dsse.is_envelope(data):
        return "dsse"
    text = pgp.plaintext(data)
    if text is None:
        return "unknown"
    return "legacy" if text.startswith(pgp.LEGACY_PREFIX) else "pgp"


def _read(image: RawImage, d: RawDescriptor) -> bytes:
    return image.file.read(d.offset, d.size)


def _covered_ids(payload: bytes | None, objects: list[RawDescriptor]) -> tuple[int, ...]:
    import json

    base = min((o.id for o in objects), default=1)
    try:
        return tuple(sorted(base + int(o["relativeId"]) for o in json.loads(payload)["objects"]))
    except (TypeError, ValueError, KeyError):
        return tuple(o.id for o in objects)


def _judge_payload(image, objects, payload) -> tuple[str, str]:
    try:
        changed = metadata.compare(image, objects, payload)
    except metadata.BadPayload as exc:
        return BAD, str(exc)
    if changed:
        return BAD, "; ".join(m.message for m in changed)
    return VERIFIED, ""


def _check_dsse(image, objects, data, hash_name, given) -> tuple[str, str, str, tuple[str, ...], bytes | None]:
    """(verdict, by, detail, keyids, payload) of one DSSE signature object."""
    try:
        env = dsse.decode(data)
    except dsse.BadEnvelope as exc:
        return BAD, "", f"the signature object is damaged: {exc}", (), None
    kids = tuple(k for k, _ in env.signatures)
    if not given:
        return UNCHECKED, "", "no public key given (--key PUB.pem)", kids, env.payload
    message = dsse.pae(env.payload_type, env.payload)
    tried = []
    for kid, sig in env.signatures:
        for key in given:
            if kid and kid != key.keyid:
                continue  # sigstore's verifier skips a signature that names another key
            tried.append((kid, key))
            if keymod.verify(key, sig, message, hash_name):
                verdict, detail = _judge_payload(image, objects, env.payload)
                return verdict, f"{key.path} ({key.keyid})", detail, kids, env.payload
    named = [f"{key.path} ({key.keyid})" for kid, key in tried if kid]
    if named:
        return (BAD, "", f"its keyid is that of {', '.join(sorted(set(named)))}, but the signature does not "
                "match the signed metadata: the signature object was changed", kids, env.payload)
    signed_by = ", ".join(k or "(no keyid)" for k in kids) or "nobody"
    keys_given = ", ".join(f"{k.path} ({k.keyid})" for k in given)
    return UNTRUSTED, "", f"signed by {signed_by}; no given key made it (given: {keys_given})", kids, env.payload


def _check_pgp(image, objects, data, fingerprint, keyrings, given) -> tuple[str, str, str, bytes | None]:
    payload = pgp.plaintext(data)
    if not keyrings:
        why = ("a PEM key cannot check it (apptainer verify --key: key material not provided)" if given else
               "no PGP public key given (--pgp-keyring FILE)")
        return (UNTRUSTED if given else UNCHECKED), "", f"a PGP signature by {fingerprint}: {why}", payload
    checked = pgp.verify(data, keyrings)
    if not checked.verified:
        reason = BAD if checked.detail.startswith("BADSIG") else UNTRUSTED
        return reason, "", f"PGP signature by {fingerprint}: {checked.detail}", payload
    verdict, detail = _judge_payload(image, objects, payload)
    return verdict, checked.fingerprint, detail, payload


def _check_one(image: RawImage, d: RawDescriptor, given, keyrings) -> SignatureCheck:
    is_group = d.link & GROUP_MASK == GROUP_MASK
    group = d.link & ~GROUP_MASK if is_group else None
    target = image.by_id(d.link) if not is_group else None
    objects = image.in_group(group) if is_group and group else ([target] if target else [])
    objects = [o for o in objects if o.datatype != DATA_SIGNATURE]
    hash_name, hash_problem = _hash_of(d)
    if d.size > MAX_SIGNATURE_BYTES:
        return SignatureCheck(id=d.id, group=group, linked_object=None if is_group else d.link, form="unknown",
                              hash=hash_name, signers=(), objects=(), verdict=BAD,
                              detail=f"the signature object is {d.size} bytes, over {MAX_SIGNATURE_BYTES}: no "
                                     "signature is that large; not read")
    data = _read(image, d)
    form = _form(data)
    entity = EXTRA_HEAD.unpack(d.extra[:EXTRA_HEAD.size])[1]
    base = dict(id=d.id, group=group, linked_object=None if is_group else d.link, form=form, hash=hash_name)
    if not objects:
        what = f"group {group}" if is_group else f"object {d.link}"
        return SignatureCheck(**base, signers=(), objects=(), verdict=BAD,
                              detail=f"it is linked to {what}, which holds no object")
    if form == "legacy":
        return SignatureCheck(**base, signers=(entity[:20].hex().upper(),), objects=tuple(o.id for o in objects),
                              verdict=LEGACY, detail="a legacy SIFHASH signature: apptainer ignores it unless "
                                                     "--legacy-insecure, and so does envport")
    if form == "unknown":
        return SignatureCheck(**base, signers=(), objects=tuple(o.id for o in objects), verdict=BAD,
                              detail="the signature object is neither a DSSE envelope nor a PGP clear-signed "
                                     "message: it was damaged")
    if hash_problem:
        return SignatureCheck(**base, signers=(), objects=tuple(o.id for o in objects), verdict=BAD,
                              detail=hash_problem)
    if form == "dsse":
        verdict, by, detail, signers, payload = _check_dsse(image, objects, data, hash_name, given)
    else:
        signers = (entity[:20].hex().upper(),)
        verdict, by, detail, payload = _check_pgp(image, objects, data, signers[0], keyrings, given)
    return SignatureCheck(**base, signers=signers, objects=_covered_ids(payload, objects), verdict=verdict,
                          by=by, detail=detail)


def check_signatures(source, keys: list[keymod.PublicKey] = (),
                     pgp_keyrings: list[str] = ()) -> SignatureReport:
    """Every signature of the SIF SOURCE (a path, an open SifFile or a SifInfo already read: then the table it
    judged is the table checked), each checked against KEYS (sif/keys.py `load_public_key`) and the
    PGP public key files PGP_KEYRINGS, and the image's verdict (module docstring). Raises SifError
    (sif/format.py) when SOURCE is not a readable SIF; PgpError when a PGP check needs gpg and it is absent."""
    from envport.sif.provenance.store import is_statement

    image = read_raw(source)
    # In-toto statements are signature objects linked to one object, not to a group: apptainer's group
    # verification never reads them, and neither does this verdict (sif/provenance/judge.py judges them).
    checks = tuple(_check_one(image, d, list(keys), list(pgp_keyrings))
                   for d in image.descriptors if d.datatype == DATA_SIGNATURE and not is_statement(d))
    groups = tuple(sorted({d.group for d in image.descriptors if d.group and d.datatype != DATA_SIGNATURE}))
    problems: list[tuple[str, str]] = []
    for d in image.descriptors:
        if d.datatype != DATA_SIGNATURE and not d.group:
            problems.append((UNSIGNED, f"object {d.id} ({d.kind}) is in no object group, so no signature "
                                       "covers it"))
    for group in groups:
        linked = [c for c in checks if c.group == group]
        if not [c for c in linked if c.verdict != LEGACY]:
            problems.append((UNSIGNED, f"object group {group} has no signature"
                                       + (" (only legacy SIFHASH ones)" if linked else "")))
    for c in checks:
        if c.verdict not in (VERIFIED, LEGACY):
            where = f"group {c.group}" if c.group is not None else f"object {c.linked_object}"
            problems.append((c.verdict, f"signature {c.id} ({c.form}, {where}): {c.verdict}: {c.detail}"))
    if not checks and not problems:
        problems.append((UNSIGNED, "the SIF holds no object and no signature"))
    verdict = min((r for r, _ in problems), key=SEVERITY.index, default=VERIFIED)
    signed = frozenset(i for c in checks if c.verdict == VERIFIED for i in c.objects)
    return SignatureReport(image.path, checks, groups, verdict, tuple(m for _, m in problems), signed)

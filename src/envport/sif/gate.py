"""The trust gate: the one place a SIF becomes something envport may mount, extract, hash or run.

One gate, one object (docs/apptainer.md, "What the gate guarantees"):

1. the file is opened once (sif/handle.py: the path resolved, O_NOFOLLOW) and refused when a user other
   than this one or root could rewrite it or swap its name (`sif_unsafe`);
2. its header and descriptor table are read from that descriptor and judged whole (sif/format.py
   `judge_table`: no ID twice, one primary partition, no overlapping objects: `corrupt_descriptor`);
3. under a site's `trust.require_signed` its signatures are checked on that same reading against
   `trust.keys` (sif/verify.py), and the primary partition must be one of the objects a verified signature
   covers, by the descriptor that was compared (`TrustRefused`, exit 3); under `trust.require_witnessed`
   a witness statement signed by a trust key, about that partition's sha256 (hashed through the same open
   file), must show each required check passed (sif/provenance/judge.py; `unwitnessed`, exit 3);
4. what is mounted afterwards is that descriptor's bytes: `Gated.partition` (offset and size) of
   `Gated.file` (the open descriptor), never the path again (sif/run.py `mounted`).

The content checks `envport inspect` runs (layout, the partition's sha256 against its build record,
trailing bytes, superblock, risks) need the spec layers above this one: sif/report.py
`admitted` runs them on the Gated this returns.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from envport.core.errors import EnvportError
from envport.plan.site import active_trust
from envport.sif.format import SifDescriptor, SifInfo, primary_partition, read_sif
from envport.sif.handle import SifError, SifFile, unsafe

VERIFIED, UNTRUSTED, UNSIGNED = "verified", "untrusted_signer", "unsigned"


class TrustRefused(EnvportError):
    """A SIF the site's trust policy refuses (reason unsigned, untrusted_signer or bad_signature); exit 3."""

    exit_code = 3

    def __init__(self, reason: str, message: str):
        super().__init__(f"REFUSED [{reason}] {message}")
        self.reason = reason
        self.detail = message


@dataclass(frozen=True)
class Gated:
    """A SIF that passed the gate: the open file, the table read from it, and the partition to mount."""

    file: SifFile
    info: SifInfo
    partition: SifDescriptor  # the primary partition: by the offset and size that were judged
    trust: str  # "verified (KEYS)", or why signatures were not required

    @property
    def path(self) -> Path:
        return self.file.path


def judge_signatures(source, key_files: Sequence[str]) -> tuple[str, str, frozenset]:
    """(verdict, detail, the IDs a verified signature covers) of SOURCE's signatures (a path, an open file
    or a SifInfo already read) against the PEM public keys KEY_FILES: `verified`, or the reason token
    (unsigned, untrusted_signer, bad_signature; a SifError's reason for a file that does not read)."""
    from envport.sif.keys import KeyFileError, load_public_key
    from envport.sif.verify import UNCHECKED, UNTRUSTED, check_signatures

    try:
        keys = [load_public_key(f) for f in key_files]
    except KeyFileError as exc:
        return UNTRUSTED, f"a trusted key does not load: {exc}", frozenset()
    try:
        checked = check_signatures(source, keys)
    except SifError as exc:
        return exc.reason, exc.message, frozenset()
    verdict = UNTRUSTED if checked.verdict == UNCHECKED else checked.verdict
    return verdict, "; ".join(checked.problems) or VERIFIED, checked.signed_ids


def load_trust_keys(named: Sequence[str], site_keys: Sequence[str] = ()) -> list:
    """The keys a command checks signatures against: NAMED (--key) and SITE_KEYS (the site's trust.keys), each
    file once, loaded before anything is pulled or read (a private key: one warning, its public half used,
    sif/keys.py). A file that is not a usable key is EnvportError, exit 2, naming it."""
    from envport.sif.keys import KeyFileError, load_public_key

    try:
        return [load_public_key(f) for f in dict.fromkeys([*named, *site_keys])]
    except KeyFileError as exc:
        raise EnvportError(str(exc)) from None


def judge_trust(source, keys: Sequence, keyrings: Sequence[str] = ()):
    """The one judgement of a SIF's signatures for the commands that report it (pull, inspect, verify-sig),
    so the same file and keys get the same verdict and exit code in each (issue 37 U8): (StepResult,
    SignatureReport or None). SOURCE: a path or what another check of the run read (sif/verify.py
    `check_signatures`); KEYS: `load_trust_keys`'s; KEYRINGS: PGP public key files.

    Given keys, the SIF is trusted only when every group is signed and every signature verifies against one
    of them: OK; anything else is REFUSED with the reason (bad_signature, untrusted_signer, unsigned),
    whether or not the site sets trust.require_signed (that setting is about what may be mounted or run:
    `gate`). Given none, the signatures are listed and the step is skipped: nothing is claimed. A file that
    does not read is FAILED with its reason."""
    from envport.core.verdict import StepResult, Verdict
    from envport.sif.pgp import PgpError
    from envport.sif.verify import check_signatures

    step = f"signatures {Path(getattr(source, 'path', source)).name}"
    try:
        checked = check_signatures(source, list(keys), list(keyrings))
    except SifError as exc:
        return StepResult(step, Verdict.FAILED, exc.message, reason=exc.reason), None
    except PgpError as exc:
        return StepResult(step, Verdict.REFUSED, exc.message, reason=exc.reason), None
    if checked.ok:
        by = sorted({s.by for s in checked.signatures if s.by})
        return StepResult(step, Verdict.OK, f"groups {', '.join(map(str, checked.groups))} signed, verified by "
                          + "; ".join(by)), checked
    if not keys and not keyrings:
        return StepResult(step, Verdict.SKIPPED, f"{len(checked.signatures)} signature(s) listed, not checked: "
                          "no key given (--key PUB.pem or the site's trust.keys)"), checked
    fix = [refusal_fix()] if checked.verdict in (UNTRUSTED, UNSIGNED) else []
    return StepResult(step, Verdict.REFUSED, "; ".join(checked.problems), reason=checked.verdict,
                      lines=fix), checked


def refusal_fix() -> str:
    return ("fix: ask its builder for a SIF signed by a key in the site's trust.keys (or add their public key "
            "there); envport inspect FILE.sif --key PUB.pem shows who signed it")


# Gated files of this process, by the file's identity and the policy: a witness run asks at preflight,
# at the mount and for every task line; one open file serves them all.
_gated: dict[tuple, Gated] = {}


def _cache_key(path: Path, policy, arch: Optional[str]) -> Optional[tuple]:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (os.path.realpath(path), st.st_dev, st.st_ino, st.st_size, st.st_ctime_ns, policy.keys,
            policy.require_signed, policy.require_witnessed, arch)


def gate(path: str | os.PathLike, *, arch: Optional[str] = None) -> Gated:
    """SIF at PATH through the gate (module docstring): a Gated, or SifError (the file), or TrustRefused (the
    site's policy).  ARCH: the architecture the partition must be for (default this machine's)."""
    policy = active_trust()
    key = _cache_key(Path(path), policy, arch)
    hit = _gated.get(key) if key else None
    if hit is not None and hit.file.fd >= 0 and hit.file.unchanged():
        return hit
    fh = SifFile.open(path)
    why = unsafe(fh)
    if why:
        fh.close()
        raise SifError("sif_unsafe", f"{why}; nothing was mounted or run. fix: copy it into a folder only you "
                                     "(or root) can write, owned by you (cp FILE ~/sifs/), and use the copy")
    info = read_sif(fh)
    trust = "signatures not required (the site sets no trust.require_signed)"
    if policy.require_signed:
        verdict, detail, signed = judge_signatures(info, policy.keys)
        if verdict != VERIFIED:
            raise TrustRefused(verdict, f"{fh.path}: the site requires SIFs signed by a key in trust.keys "
                               f"(trust.require_signed): {detail}; nothing was mounted or run. {refusal_fix()}")
    part = primary_partition(info, arch=arch)
    if policy.require_signed:
        if part.id not in signed:
            raise TrustRefused("unsigned", f"{fh.path}: the primary partition (object {part.id}) is not among "
                               "the objects a verified signature covers; nothing was mounted or run. "
                               + refusal_fix())
        trust = "signatures verified against " + ", ".join(Path(k).name for k in policy.keys)
    if policy.require_witnessed:
        trust += "; " + judge_witnessed(info, part, policy)
    gated = Gated(fh, info, part, trust)
    if key is not None and (fh.st.st_ino, fh.st.st_size, fh.st.st_ctime_ns) == key[2:5]:
        _gated[key] = gated
    return gated


def judge_witnessed(info, part, policy) -> str:
    """What the site's trust.require_witnessed found in the SIF INFO (read through the gate's open file): a
    witness statement signed by a trust.keys key, about PART's sha256, in which every required check
    passed; else TrustRefused `unwitnessed` naming the checks missing and each statement set aside."""
    from envport.sif.provenance.judge import TRUSTED, judge_statements, missing_witnesses

    judged = judge_statements(info, part, load_trust_keys([], policy.keys))
    missing = missing_witnesses(judged, policy.require_witnessed)
    if not missing:
        return f"witnessed ({', '.join(policy.require_witnessed)}) by a trusted statement"
    aside = [f"statement {j.object_id}: {j.verdict}: {j.detail}" for j in judged if j.verdict != TRUSTED]
    raise TrustRefused("unwitnessed", f"{info.path}: the site requires a witness statement signed by a key in "
                       f"trust.keys, about this SIF's primary partition, showing {', '.join(policy.require_witnessed)} "
                       f"passed (trust.require_witnessed); none shows {', '.join(missing)}"
                       + (f" ({'; '.join(aside)})" if aside else f" ({len(judged)} statement(s) in the file)")
                       + "; nothing was mounted or run. fix: ask its builder to run `envport witness NAME --target "
                       "apptainer --sif FILE --attest KEY.pem` and pass the checks, or attest it yourself with a "
                       "trusted key after witnessing it")


def forget() -> None:
    """Close every file this process gated (tests that swap files in place under one name call it)."""
    for g in _gated.values():
        g.file.close()
    _gated.clear()

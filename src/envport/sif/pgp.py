"""The PGP form of a SIF signature, through Debian's `gpg` (gnupg): clear-signed image metadata.

The only form apptainer's execution control list (ecl.toml) honours: it
checks PGP signatures by fingerprint against the global PGP keyring. The
signature's data is an OpenPGP clear-signed message whose plaintext is the
payload JSON; the descriptor's entity holds the signer's primary key
fingerprint. gpg runs with the caller's GNUPGHOME (signing) or a private
temporary one holding only the keys given (verifying), never the user's
default keyring for a check. A keyring file is read by envport (sif/keys.py `read_key_file`: a regular
file of at most 1 MiB, opened without blocking) and handed to gpg on its stdin, so a FIFO or
`/dev/zero` named as a keyring is a `bad_key`, never a gpg that waits or reads without end.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from dataclasses import dataclass

from envport.core.errors import ReasonError
from envport.core.proc import run
from envport.sif.dsse import MAX_DEPTH, json_depth
from envport.sif.keys import KeyFileError, read_key_file

CLEARSIGN_START = b"-----BEGIN PGP SIGNED MESSAGE-----"
LEGACY_PREFIX = b"SIFHASH:"
GPG_TIMEOUT = 60


class PgpError(ReasonError):
    """gpg missing, or a key it does not have; reason `no_gpg` or `bad_key`."""


def gpg_path() -> str:
    found = shutil.which("gpg")
    if not found:
        raise PgpError("no_gpg", "gpg is not installed; PGP signatures need it (apt-get install gnupg), "
                                 "or sign with a PEM key: envport sign FILE.sif --key KEY.pem")
    return found


def primary_fingerprint(key: str) -> str:
    """The primary key fingerprint (40 hex digits) of the secret key KEY names in the signer's keyring."""
    got = run([gpg_path(), "--batch", "--with-colons", "--fingerprint", "--list-secret-keys", key],
              timeout=GPG_TIMEOUT)
    fprs = [line.split(":")[9] for line in got.stdout.splitlines() if line.startswith("fpr:")]
    if not got.ok or not fprs:
        raise PgpError("bad_key", f"gpg has no secret key {key!r} in {os.environ.get('GNUPGHOME', '~/.gnupg')} "
                                  f"({got.text.strip()[-200:] or 'no match'}); list them with "
                                  "`gpg --list-secret-keys --fingerprint`")
    return fprs[0].upper()  # the first fpr line after a sec line is the primary key's


def clearsign(payload: bytes, fingerprint: str) -> bytes:
    got = run([gpg_path(), "--batch", "--yes", "--armor", "--digest-algo", "SHA256", "--local-user",
               fingerprint + "!", "--clearsign"], stdin=payload.decode(), timeout=GPG_TIMEOUT)
    if not got.ok or not got.stdout.startswith(CLEARSIGN_START.decode()):
        raise PgpError("bad_key", f"gpg could not sign with {fingerprint}: {got.text.strip()[-300:]}")
    return got.stdout.encode()


def plaintext(data: bytes) -> bytes | None:
    """The signed text of a clear-signed message (RFC 4880 7.1: dash-escapes undone, the last line break not
    part of it); None when DATA is not one, or when its text nests JSON deeper than any SIF metadata (crafted:
    the text is parsed whether or not a key verified it, sif/dsse.py `json_depth`)."""
    if not data.startswith(CLEARSIGN_START):
        return None
    head, sep, rest = data.partition(b"\n\n")
    body, sep2, _ = rest.partition(b"\n-----BEGIN PGP SIGNATURE-----")
    if not sep or not sep2:
        return None
    text = b"\n".join(line[2:] if line.startswith(b"- ") else line for line in body.split(b"\n"))
    return None if json_depth(text) > MAX_DEPTH else text


@dataclass(frozen=True)
class PgpCheck:
    verified: bool
    fingerprint: str  # the primary key that made a good signature, or ""
    detail: str


def verify(data: bytes, keyring_files: list[str]) -> PgpCheck:
    """Check the clear-signed DATA against the public keys in KEYRING_FILES only (armored or binary)."""
    home = tempfile.mkdtemp(prefix="envport-gpg-")
    env = dict(os.environ, GNUPGHOME=home)
    try:
        gpg = gpg_path()
        for f in keyring_files:
            try:
                ring = read_key_file(f, "PGP keyring")
            except KeyFileError as exc:
                raise PgpError(exc.reason, exc.message) from None
            got = run([gpg, "--batch", "--import"], stdin=ring, env=env, timeout=GPG_TIMEOUT)
            if not got.ok:
                raise PgpError("bad_key", f"{f}: gpg cannot import it as a public key: {got.text.strip()[-200:]}")
        got = run([gpg, "--batch", "--status-fd", "1", "--verify"], stdin=data.decode("utf-8", "replace"),
                  env=env, timeout=GPG_TIMEOUT)
        valid = re.search(r"^\[GNUPG:\] VALIDSIG (\S+)(?: \S+){8} (\S+)", got.stdout, re.M)
        if got.ok and valid:
            return PgpCheck(True, valid.group(2).upper(), "")
        if "[GNUPG:] BADSIG" in got.stdout:
            return PgpCheck(False, "", "BADSIG: the signed text or the signature changed")
        return PgpCheck(False, "", "NO_PUBKEY: no given PGP key made it")
    finally:
        run(["gpgconf", "--kill", "all"], env=env, timeout=GPG_TIMEOUT)
        shutil.rmtree(home, ignore_errors=True)

"""Keys for DSSE signatures, as apptainer loads them (sigstore's LoadSigner/LoadVerifier), with `cryptography`.

Schemes by key type: RSA -> PKCS#1 v1.5 (never PSS; keys of 1024 bits or
more); ECDSA (P-224/256/384/521) -> a DER signature over the hash of the
message; Ed25519 -> pure Ed25519. The hash is SHA-256 unless the signature
descriptor says another (apptainer signs with SHA-256). A key's id is
OpenSSH's fingerprint, `SHA256:` + unpadded base64 of sha256 of its SSH wire
encoding: apptainer's verifier skips a signature whose keyid names another key.

A key file is read as a regular file of at most MAX_KEY_BYTES, opened without blocking
(core/smallfile.py): `--key /dev/zero`, a FIFO or a directory is a `bad_key` naming the file and what
it is, never a hang or a read without end. PGP keyrings (sif/pgp.py) and a site's `trust.keys`
(plan/site.py) are held to the same rule.
"""

from __future__ import annotations

import base64
import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa

from envport.core.errors import ReasonError
from envport.core.smallfile import MAX_KEY_BYTES, MIB, NotASmallFile, read_small

CURVES = (ec.SECP224R1, ec.SECP256R1, ec.SECP384R1, ec.SECP521R1)
MIN_RSA_BITS = 1024
PAE_HASHES = {"sha256": hashes.SHA256, "sha384": hashes.SHA384, "sha512": hashes.SHA512}
KEY_HELP = ("an RSA (>= 1024 bits), ECDSA (P-224/256/384/521) or Ed25519 key in PEM; make one with "
            "`openssl genpkey -algorithm ed25519 -out key.pem` and its public half with "
            "`openssl pkey -in key.pem -pubout -out pub.pem`")


class KeyFileError(ReasonError):
    """A key file envport cannot use; reason `bad_key`."""


@dataclass(frozen=True)
class PublicKey:
    path: str
    key: object  # a cryptography public key
    keyid: str

    @property
    def kind(self) -> str:
        return key_kind(self.key)


@dataclass(frozen=True)
class PrivateKey:
    path: str
    key: object
    public: PublicKey


def key_kind(key) -> str:
    if isinstance(key, (rsa.RSAPublicKey, rsa.RSAPrivateKey)):
        return f"rsa{key.key_size}"
    if isinstance(key, (ec.EllipticCurvePublicKey, ec.EllipticCurvePrivateKey)):
        return f"ecdsa-{key.curve.name}"
    return "ed25519"


def keyid(public_key) -> str:
    """OpenSSH's SHA256 fingerprint of PUBLIC_KEY: what apptainer writes as the DSSE keyid."""
    line = public_key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    wire = base64.b64decode(line.split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(wire).digest()).decode().rstrip("=")


def _check_type(path: str, key) -> None:
    if isinstance(key, (rsa.RSAPublicKey, rsa.RSAPrivateKey)):
        if key.key_size < MIN_RSA_BITS:
            raise KeyFileError("bad_key", f"{path}: an RSA key of {key.key_size} bits; apptainer accepts "
                                       f"{MIN_RSA_BITS} bits or more: make a new key")
        return
    if isinstance(key, (ec.EllipticCurvePublicKey, ec.EllipticCurvePrivateKey)):
        if not isinstance(key.curve, CURVES):
            raise KeyFileError("bad_key", f"{path}: ECDSA on curve {key.curve.name}; apptainer accepts P-224, "
                                       "P-256, P-384 and P-521")
        return
    if isinstance(key, (ed25519.Ed25519PublicKey, ed25519.Ed25519PrivateKey)):
        return
    raise KeyFileError("bad_key", f"{path}: a {type(key).__name__} key; apptainer signs with {KEY_HELP}")


def read_key_file(path: str | Path, what: str = "key") -> bytes:
    """The bytes of the key file PATH (a regular file of at most MAX_KEY_BYTES, read without blocking), or
    KeyFileError `bad_key` naming it and what it is instead. WHAT: "key", "PGP keyring"."""
    try:
        return read_small(path, MAX_KEY_BYTES)
    except NotASmallFile as exc:
        raise KeyFileError("bad_key", f"{path}: {exc}, not a {what} file; give the {what} file itself, a "
                                   f"regular file of at most {MAX_KEY_BYTES // MIB} MiB") from None
    except OSError as exc:
        raise KeyFileError("bad_key", f"{path}: cannot read the {what} file ({exc.strerror})") from None


def load_public_key(path: str | Path, warn: Callable[[str], None] | None = None) -> PublicKey:
    """A PEM `PUBLIC KEY` (PKIX) or `RSA PUBLIC KEY` file. Of a file holding several PEM blocks only the first
    counts, as apptainer reads it (cryptography does the same). A private key's public half also serves, but a
    trust key that is a private key is a mistake worth a word (the secret half sits in a trust list, often
    world-readable): WARN (default: one `envport: warning:` line on stderr per file and process) says so."""
    data = read_key_file(path)
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, UnsupportedAlgorithm) as exc:
        try:
            key = serialization.load_pem_private_key(data, password=None).public_key()
        except (ValueError, TypeError, UnsupportedAlgorithm):
            raise KeyFileError("bad_key", f"{path}: not a PEM public key ({exc}); expected {KEY_HELP}") from None
        (warn or _warn_once)(private_key_warning(path))
    _check_type(str(path), key)
    return PublicKey(str(path), key, keyid(key))


def private_key_warning(path: str | Path) -> str:
    """What a person is told when a key they trust is a private key: which file, that its public half is used,
    and how to get that half (so the secret can leave the trust list)."""
    pub = f"{Path(path).with_suffix('')}.pub.pem"
    return (f"{path} is a PRIVATE key; a trust key should be the public half. Its public half is used. Make "
            f"it with `openssl pkey -in {path} -pubout -out {pub}`, trust {pub} instead, and keep the private "
            "key where only its owner can read it")


_warned: set[str] = set()  # the files this process already warned about: one line each, however often loaded


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        print(f"envport: warning: {message}", file=sys.stderr, flush=True)


def load_private_key(path: str | Path) -> PrivateKey:
    """A PEM private key without a passphrase (PKCS#8, or the traditional RSA/EC forms)."""
    try:
        key = serialization.load_pem_private_key(read_key_file(path), password=None)
    except TypeError:
        raise KeyFileError("bad_key", f"{path}: the key has a passphrase; envport signs with an unencrypted key "
                                   "(`openssl pkey -in KEY -out plain.pem`, kept mode 0600)") from None
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise KeyFileError("bad_key", f"{path}: not a PEM private key ({exc}); expected {KEY_HELP}") from None
    _check_type(str(path), key)
    pub = key.public_key()
    return PrivateKey(str(path), key, PublicKey(str(path), pub, keyid(pub)))


def sign(private: PrivateKey, message: bytes, hash_name: str = "sha256") -> bytes:
    key, algo = private.key, PAE_HASHES[hash_name]()
    if isinstance(key, rsa.RSAPrivateKey):
        return key.sign(message, padding.PKCS1v15(), algo)
    if isinstance(key, ec.EllipticCurvePrivateKey):
        return key.sign(message, ec.ECDSA(algo))
    return key.sign(message)


def verify(public: PublicKey, signature: bytes, message: bytes, hash_name: str = "sha256") -> bool:
    key, algo = public.key, PAE_HASHES[hash_name]()
    try:
        if isinstance(key, rsa.RSAPublicKey):
            key.verify(signature, message, padding.PKCS1v15(), algo)
        elif isinstance(key, ec.EllipticCurvePublicKey):
            key.verify(signature, message, ec.ECDSA(algo))
        else:
            key.verify(signature, message)
    except InvalidSignature:
        return False
    return True

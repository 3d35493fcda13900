"""`envport sign FILE.sif --key KEY.pem`: sign a SIF as `apptainer sign --key` does, without apptainer."""

from __future__ import annotations

from pathlib import Path

# apptainer's syecl: dirpath "" is the group for SIFs in any directory (one per file), keyfp 40-hex fingerprints.
ECL_TEMPLATE = """# for apptainer's ecl.toml (with activated = true): SIFs anywhere signed by one of these PGP keys
[[execgroup]]
  tagname = "{tag}"
  mode = "whitelist"
  dirpath = ""
  keyfp = [{fprs}]
"""


def register(sub) -> None:
    p = sub.add_parser(
        "sign", help="sign a .sif in apptainer's format (DSSE with a PEM key, or PGP through gpg)",
        description="Append one signature object per object group to FILE.sif, in place, exactly as "
        "`apptainer sign` writes it: DSSE over the image metadata (header, descriptors and objects) with a PEM "
        "private key (RSA >= 1024 bits, ECDSA P-224/256/384/521 or Ed25519; keyid = the key's OpenSSH SHA256 "
        "fingerprint), or with --pgp-key a PGP clear-signed signature made by gpg, the only form apptainer's "
        "execution control list (ecl.toml) honours. Sign last: an object added to a group afterwards fails "
        "`apptainer verify`. Check with `envport verify-sig FILE.sif --key PUB.pem`. Exit 0 signed (or "
        "present: already signed by these keys and intact), 1 not a usable SIF, 2 bad arguments or key file, "
        "3 refused (already signed by another key, nothing to sign, gpg missing; the reason token says which).")
    p.add_argument("sif", nargs="?", metavar="FILE.sif")
    p.add_argument("--key", action="append", default=[], metavar="KEY.pem",
                   help="PEM private key, no passphrase (repeat for several signers in one DSSE envelope)")
    p.add_argument("--pgp-key", default=None, metavar="FINGERPRINT",
                   help="sign with this gpg secret key (from GNUPGHOME) in the PGP clear-signed form")
    p.add_argument("--ecl", action="store_true",
                   help="print the ecl.toml [[execgroup]] that admits SIFs signed by --pgp-key (or by the PGP "
                   "signers of FILE.sif) and sign nothing; DSSE signatures can never satisfy an ECL")
    p.add_argument("--json", action="store_true", help="print the result as JSON (docs/cli.md)")
    p.set_defaults(func=run)


def run(args) -> int:
    from envport.core.errors import EnvportError
    from envport.core.verdict import report

    if args.ecl:
        return _ecl(args)
    if not args.sif:
        raise EnvportError("envport sign: name the FILE.sif to sign")
    if bool(args.key) == bool(args.pgp_key):
        raise EnvportError("envport sign: give --key KEY.pem (DSSE) or --pgp-key FINGERPRINT (PGP), one of them")
    return report([sign_step(Path(args.sif), args.key, args.pgp_key)], args.json, command="sign")


def load_signers(key_files: list[str]) -> list:
    """The PEM private keys, or the usage error (exit 2) naming the file and what is wrong with it."""
    from envport.core.errors import EnvportError
    from envport.sif.keys import KeyFileError, load_private_key

    try:
        return [load_private_key(f) for f in key_files]
    except KeyFileError as exc:
        raise EnvportError(str(exc)) from None


def sign_step(path: Path, key_files: list[str], pgp_key: str | None):
    """One StepResult: the SIF at PATH signed (OK), already signed by exactly these keys (present), or why not.
    `envport build --sign` calls it too."""
    from envport.core.verdict import StepResult, Verdict
    from envport.sif.format import SifError
    from envport.sif.pgp import PgpError
    from envport.sif.sign import sign_sif
    from envport.sif.verify import check_signatures

    step = f"sign {path.name}"
    signers = load_signers(key_files)
    try:
        if signers:
            already = check_signatures(path, [k.public for k in signers])
            if already.ok and all(len(s.signers) == len(signers) for s in already.signatures):
                return StepResult(step, Verdict.PRESENT, "already signed by "
                                  + ", ".join(k.public.keyid for k in signers) + " and intact")
        done = sign_sif(path, signers, pgp_key=pgp_key)
    except SifError as exc:
        usable = exc.reason in ("already_signed", "nothing_to_sign", "descriptors_full", "unwritable")
        return StepResult(step, Verdict.REFUSED if usable else Verdict.FAILED, exc.message, reason=exc.reason)
    except PgpError as exc:
        return StepResult(step, Verdict.REFUSED, exc.message, reason=exc.reason)
    detail = "; ".join(f"group {s.group}: signature object {s.object_id} ({s.form}, {s.signer}) covers objects "
                       + ", ".join(map(str, s.objects)) for s in done)
    return StepResult(step, Verdict.OK, detail, data={"sif": str(path), "signed": [s.to_dict() for s in done]})


def _ecl(args) -> int:
    import sys

    from envport.core.errors import EnvportError
    from envport.core.verdict import EXIT_REFUSED
    from envport.sif.pgp import PgpError, primary_fingerprint
    from envport.sif.verify import check_signatures

    if args.key:
        raise EnvportError("envport sign --ecl: apptainer's ECL checks PGP signatures only (by fingerprint); a "
                           "--key (DSSE) signature can never satisfy it: use --pgp-key FINGERPRINT")
    try:
        fprs = [primary_fingerprint(args.pgp_key)] if args.pgp_key else []
    except PgpError as exc:
        print(f"REFUSED  ecl [{exc.reason}]: {exc.message}", file=sys.stderr)
        return EXIT_REFUSED
    if args.sif and not fprs:
        fprs = sorted({s.signers[0] for s in check_signatures(args.sif).signatures if s.form == "pgp"})
    if not fprs:
        print(f"REFUSED  ecl [no_pgp_signature]: {args.sif or 'no FILE.sif'} has no PGP signature and no "
              "--pgp-key was given; an ECL admits PGP signers only: sign with --pgp-key", file=sys.stderr)
        return EXIT_REFUSED
    tag = Path(args.sif).stem if args.sif else "envport"
    sys.stdout.write(ECL_TEMPLATE.format(tag=tag, fprs=", ".join(f'"{f}"' for f in fprs)))
    return 0

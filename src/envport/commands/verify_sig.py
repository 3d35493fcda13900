"""`envport verify-sig FILE.sif --key PUB.pem`: check a SIF's signatures as `apptainer verify --key` does."""

from __future__ import annotations

from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser(
        "verify-sig", help="check a .sif's signatures against the public keys you trust (no apptainer)",
        description="List every signature object of FILE.sif (what it is linked to, DSSE or PGP, hash, signer "
        "keyids or fingerprint, the objects it covers) and check each against the given public keys, as "
        "`apptainer verify --key` does: every object group must be signed, every signature of a group must "
        "verify, and the signed metadata must equal the file (header, each descriptor and object, and the set "
        "of objects in the group). Exit 0 verified, 1 not a usable SIF, 2 bad arguments or key file, "
        "3 refused: [bad_signature] (names what changed), [untrusted_signer] (no given key made it) or "
        "[unsigned].")
    p.add_argument("sif", metavar="FILE.sif")
    p.add_argument("--key", action="append", default=[], metavar="PUB.pem",
                   help="PEM public key (PUBLIC KEY or RSA PUBLIC KEY) to trust; repeatable. A private key "
                   "is used by its public half, with a warning")
    p.add_argument("--pgp-keyring", action="append", default=[], metavar="FILE",
                   help="PGP public key file (gpg --export [--armor]) to trust for PGP signatures; repeatable")
    p.add_argument("--json", action="store_true", help="print the result as JSON (docs/cli.md)")
    p.set_defaults(func=run)


def run(args) -> int:
    import sys

    from envport.core.errors import EnvportError
    from envport.core.verdict import envelope, exit_code, print_json, report
    from envport.sif.gate import load_trust_keys

    if not args.key and not args.pgp_keyring:
        raise EnvportError("envport verify-sig: give the public key(s) to trust: --key PUB.pem or "
                           "--pgp-keyring FILE (envport inspect lists signatures without checking them)")
    keys = load_trust_keys(args.key)
    result, checked = verify_step(Path(args.sif), keys, args.pgp_keyring)
    if args.json:
        code = exit_code([result])
        print_json(envelope("verify-sig", code, [result], signatures=checked.to_dict() if checked else None))
        return code
    for line in signature_lines(checked):
        print(line, file=sys.stdout)
    return report([result], False)


def signature_lines(checked) -> list[str]:
    """One line per signature of a SignatureReport (or None): id, form, hash, what it is linked to, the objects
    it covers, its signers, its verdict and the key that verified it."""
    out = []
    for s in checked.signatures if checked else ():
        linked = f"group {s.group}" if s.group is not None else f"object {s.linked_object}"
        out.append(f"signature {s.id:<3} {s.form} {s.hash} {linked}, covers {', '.join(map(str, s.objects)) or '-'}"
                   f", signers {', '.join(s.signers) or '-'}: {s.verdict}" + (f" by {s.by}" if s.by else ""))
    return out


def verify_step(source, keys: list, keyrings: list[str]):
    """(StepResult, SignatureReport or None): sif/gate.py `judge_trust`, the one judgement pull and inspect
    make too. SOURCE: a path, or the SifInfo another check of this run read (inspect: one open file for both)."""
    from envport.sif.gate import judge_trust

    return judge_trust(source, keys, keyrings)

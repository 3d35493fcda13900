"""`envport attest FILE.sif --key KEY.pem`: add a signed in-toto statement to a SIF without rebuilding it."""

from __future__ import annotations

from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser(
        "attest", help="add a signed in-toto statement (SLSA provenance, or one you give) to a .sif",
        description="Append a signed in-toto Statement v1 to FILE.sif, in place, as an object outside every "
        "object group (so `apptainer verify` and the SIF's signature are unchanged; `siftool dump ID FILE` "
        "prints it): by default the SLSA provenance v1 of its build, read from the spec object envport's "
        "builder embedded (resolved spec and hash, site, base digest, every locked dist with its sha256); "
        "with --statement a statement you wrote, whose subject must be the SIF's primary partition. The "
        "subject is the primary partition's sha256, recomputed from the file. The DSSE envelope (payloadType "
        "application/vnd.in-toto+json) is signed with the keys `envport sign` takes. `envport inspect FILE.sif "
        "--key PUB.pem` lists and checks every statement (docs/provenance.md). Exit 0 attested, 1 not a usable "
        "SIF, 2 bad arguments or key file, 3 refused (no_embedded_spec: no build of envport's to attest; "
        "bad_statement: a statement that is not an in-toto Statement v1 about this SIF).")
    p.add_argument("sif", metavar="FILE.sif")
    p.add_argument("--key", action="append", default=[], required=True, metavar="KEY.pem",
                   help="PEM private key, no passphrase (repeat for several signers in one envelope)")
    p.add_argument("--statement", default=None, metavar="FILE.json",
                   help="sign and add this in-toto Statement v1 instead of the build's provenance")
    p.add_argument("--json", action="store_true", help="print the result as JSON (docs/cli.md)")
    p.set_defaults(func=run)


def run(args) -> int:
    from envport.core.verdict import report

    doc = _read_statement(args.statement) if args.statement else None
    return report([attest_step(Path(args.sif), args.key, doc=doc)], args.json, command="attest")


def _read_statement(path: str) -> dict:
    import json

    from envport.core.errors import EnvportError

    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise EnvportError(f"--statement {path}: not a readable JSON file ({exc}); give an in-toto Statement "
                           "v1 as JSON") from None


def attest_step(path: Path, key_files: list[str], *, witness: dict | None = None, read=None, doc=None,
                step: str | None = None):
    """One StepResult: a statement about the SIF at PATH signed with KEY_FILES and added (OK), or why not.
    WITNESS: a witness predicate (sif/provenance/witness.py) to attest; else DOC, a statement given; else the
    build's provenance. READ: (SifInfo, partition) the caller already judged (the gate a witness ran
    through). `build --sign`, `witness --attest` and `verify --attest` call it too."""
    from envport.commands.sign import load_signers
    from envport.core.verdict import StepResult, Verdict
    from envport.sif.provenance.attest import NoEmbeddedSpec, attest_sif, primary_of, provenance_of
    from envport.sif.provenance.statement import SLSA_PROVENANCE, WITNESS_PREDICATE, BadStatement
    from envport.sif.format import SifError, read_sif

    step = step or f"attest {path.name}"
    signers = load_signers(key_files)
    try:
        if read is None:
            info = read_sif(path)
            read = (info, primary_of(info))
        if witness is not None:
            kind, predicate = WITNESS_PREDICATE, witness
        elif doc is not None:
            kind, predicate = "", {}  # the statement DOC says both
        else:
            kind, predicate = SLSA_PROVENANCE, provenance_of(read[0])
        done = attest_sif(path, signers, kind, predicate, read=read, doc=doc)
    except NoEmbeddedSpec as exc:
        return StepResult(step, Verdict.REFUSED, str(exc), reason="no_embedded_spec")
    except BadStatement as exc:
        return StepResult(step, Verdict.REFUSED, str(exc), reason="bad_statement")
    except SifError as exc:
        usable = exc.reason in ("descriptors_full", "unwritable")
        return StepResult(step, Verdict.REFUSED if usable else Verdict.FAILED, exc.message, reason=exc.reason)
    return StepResult(step, Verdict.OK, done.describe(),
                      data={"sif": str(path), "statement_object": done.object_id, "predicate_type": done.predicate_type,
                            "subject_sha256": done.partition_sha256, "signers": list(done.signers)})


def add_attest_arg(parser, what: str) -> None:
    parser.add_argument("--attest", default=None, metavar="KEY.pem",
                        help=f"apptainer: add a signed in-toto statement of {what} to the SIF (envport's witness "
                        "predicate, failed checks included; docs/provenance.md), signed with this PEM private key")


def require_sif_target(args, command: str) -> None:
    """--attest writes into a SIF: any other target is a usage error (exit 2), said before anything runs."""
    from envport.core.errors import EnvportError

    from envport.targets.registry import get, names

    if args.attest and not get(args.target).signs:
        sif_targets = ", ".join(n for n in names() if get(n).signs)
        raise EnvportError(f"envport {command} --attest is for --target {sif_targets} (the statement goes into "
                           f"the SIF); a {args.target} env has no file to carry it", exit_code=2)
    if args.attest:
        load_keys_early(args.attest)


def load_keys_early(key_file: str) -> None:
    """A key that does not load is said before a long run, not after it (exit 2)."""
    from envport.commands.sign import load_signers

    load_signers([key_file])


def witness_attest_step(sif: str, key_file: str, *, env: str, env_hash: str, target: str, launcher: str, steps,
                        verdict: str, started):
    """The statement of a witness (or verify) run that began at STARTED (utc_now) and ends now: every step in
    STEPS, attested about the partition the run's gate judged and mounted (sif/gate.py keeps that open file for
    the process), not the path read again."""
    from envport.sif.provenance.witness import predicate, utc_now
    from envport.sif.format import SifError
    from envport.sif.gate import TrustRefused, gate

    try:
        gated = gate(sif)
        read = (gated.info, gated.partition)
    except (SifError, TrustRefused):
        read = None  # the run said why; the attest step reads the file itself and says so again if it must
    pred = predicate(env=env, env_hash=env_hash, target=target, launcher=launcher, steps=steps, verdict=verdict,
                     started=started, finished=utc_now())
    return attest_step(Path(sif), [key_file], witness=pred, read=read)


def provenance_present(read, key_file: str) -> bool:
    """The SIF READ ((SifInfo, primary partition), sif/provenance/attest.py `primary_of`) already holds a SLSA
    provenance statement about its partition signed by KEY_FILE's key (a second `build --sign` of a present SIF
    adds none). The caller passes the same READ to attest_step: the partition is hashed once."""
    from envport.commands.sign import load_signers
    from envport.sif.provenance.judge import TRUSTED, judge_statements
    from envport.sif.provenance.statement import SLSA_PROVENANCE

    judged = judge_statements(read[0], read[1], [k.public for k in load_signers([key_file])])
    return any(j.verdict == TRUSTED and j.predicate_type == SLSA_PROVENANCE for j in judged)

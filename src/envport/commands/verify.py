"""`envport verify NAME --target docker`: prove a built env holds what its spec promises."""

from __future__ import annotations

from pathlib import Path

from envport.commands._common import add_embedded_spec_arg, add_no_lock_arg, project_root
from envport.commands.attest import add_attest_arg
from envport.sif.provenance.witness import VERIFY_LAUNCHER, utc_now
from envport.targets.base import VERIFY
from envport.targets.registry import get, hosted, names

# Every target: one that cannot verify says why (REFUSED [unsupported]) rather than not being a choice.
VERIFY_TARGETS = names()


def register(sub) -> None:
    p = sub.add_parser("verify", help="run the spec's testinfra assertions (and tests/images/) against a built env",
                       description="Start the env's image (docker run -d --network <site network> IMAGE sleep "
                       "infinity, always removed afterwards) and run, as pytest items through testinfra, one "
                       "assertion per promise of the spec: system packages installed, pip packages at the version "
                       "the last phase naming them pins, the python version, every env var's exact value, shim "
                       "files' sha256, weight mount points present and empty, and the envport.hash label. Tests "
                       "under tests/images/ run in the same session (testinfra's `host` fixture). Writes JUnit XML "
                       "and a ledger record. Exit 1 when any check fails, 3 when refused.")
    p.add_argument("spec", metavar="NAME|PATH")
    p.add_argument("--target", choices=VERIFY_TARGETS, default="docker", help="what to verify (default: docker)")
    p.add_argument("--site", default=None, metavar="NAME|FILE", help="site profile (default: local); it names the image's hash")
    p.add_argument("--image", default=None,
                   help="verify this image instead of envport/<name>:<hash12> (its envport.hash label may then "
                   "differ: that check is skipped and says so)")
    p.add_argument("--sif", default=None, metavar="FILE",
                   help="apptainer: verify this SIF instead of <sif_dir>/<name>-<hash12>.sif (run with apptainer "
                   "exec where installed, else ch-run on the SIF mounted with squashfuse). Outside a project "
                   "its embedded spec is used, and said so; one built from another version of "
                   "specs/NAME.yaml is named, with the changed fields")
    p.add_argument("--host", default=None, help=f"{'/'.join(hosted())}: the env on this SSH host (site alias or destination), "
                   "checked through testinfra ssh:// with the site's ssh_config (verify/backends.py)")
    add_embedded_spec_arg(p, "apptainer: verify the SIF")
    add_no_lock_arg(p, "verify")
    add_attest_arg(p, "this verification")
    p.add_argument("--junit", default=None, help="JUnit XML path (default: reports/verify-<name>.xml)")
    p.add_argument("--json", action="store_true", help="print the verdict and every check as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from envport.commands._common import embedded_root, sif_spec
    from envport.core.progress import stderr_progress
    from envport.core.verdict import StepResult, report
    from envport.report import ledger

    from envport.core.extras import VERIFY_MODULES, refusal

    from envport.commands.attest import require_sif_target

    require_sif_target(args, "verify")
    target = get(args.target)
    root = embedded_root(args, args.spec)
    project = root is None
    root = root or project_root(args)
    found = sif_spec(args, args.spec, target, "verify", root=root)
    if isinstance(found, StepResult):
        return report([found], args.json, command="verify")
    loaded, site, identity, note, spec_facts = found
    missing = refusal(f"verify {loaded.spec.name}", VERIFY_MODULES)
    if missing is not None:  # nothing ran, so nothing is recorded
        return report([missing], args.json, command="verify")
    junit = Path(args.junit).resolve() if args.junit else _outside_project_junit(root, site, loaded.spec.name)
    from envport.targets.base import Unsupported, VerifyRequest

    if not target.supports(VERIFY):
        return report([target.refuse(VERIFY).result(f"verify {loaded.spec.name}")], args.json, command="verify")
    started = utc_now()
    try:
        result = target.verify(VerifyRequest(loaded, site, root, host=args.host, image=args.image,
                                             sif=Path(args.sif).resolve() if args.sif else None, junit=junit,
                                             progress=stderr_progress,
                                             identity=None if project else identity))
    except Unsupported as exc:
        return report([exc.result(f"verify {loaded.spec.name}")], args.json, command="verify")
    differs = spec_facts["sif_difference"]
    result.data.update(spec_facts)
    # What was checked is the SIF as built: recorded under its own hash, the spec's beside it.
    ledger.record(root, loaded.spec, kind="verify", target=args.target,
                  hash_=differs["sif_hash"] if differs else identity.hash, result=result, site=site,
                  **({"spec_hash": identity.hash} if differs else {}))
    if note and not args.json:
        print(note)
    steps = [result]
    if args.attest:
        steps.append(_attest(args, site, root, loaded, identity, result, started))
    return report(steps, args.json, command="verify")



def _attest(args, site, root, loaded, identity, result, started):
    """--attest: the verification attested into the SIF that was verified, as a witness statement."""
    from envport.commands.attest import witness_attest_step

    sif = str(Path(args.sif).resolve()) if args.sif else str(get(args.target).built_file(site, root, identity))
    return witness_attest_step(sif, args.attest, env=loaded.spec.name, env_hash=identity.hash, target=args.target,
                               launcher=VERIFY_LAUNCHER, steps=[result],
                               verdict=result.verdict.value, started=started)


def _outside_project_junit(root: Path, site, name: str) -> Path | None:
    """Where the JUnit report goes when ROOT is no project (an admin's folder holding a SIF): the state dir, beside
    the ledger, never a reports/ folder made in the admin's folder; None in a project (its reports/)."""
    from envport.report import ledger
    from envport.spec.loader import SPECS_DIR

    if (root / SPECS_DIR).is_dir():
        return None
    return ledger.state_dir(site.ledger_dir) / "reports" / ledger.project_key(root) / f"verify-{name}.xml"

"""`envport pull oras://HOST/REPO:TAG [-o DIR]`: a SIF from a registry, whole and checked, or nothing."""

from __future__ import annotations

import time
from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser("pull", help="pull a SIF pushed with ORAS (apptainer push, envport push) into a folder",
                       description="Download the SIF of oras://HOST/REPO:TAG (the manifest, at most 4 MiB, must be "
                       "an OCI image manifest with exactly one layer of media type "
                       "application/vnd.sylabs.sif.layer.v1.sif) into DIR/<REPO's last part>_<TAG>.sif, the name "
                       "`apptainer pull` gives it (never the name the registry's title annotation says). A file "
                       "already there that is this layer (its sha256 computed and equal to the manifest's) is "
                       "`present`: nothing is downloaded, and it is checked as a download is; any other file "
                       "there is replaced only with --force. A layer larger than DIR's free space is "
                       "refused before it is downloaded. The bytes go to a hidden partial file first; only when "
                       "their size and sha256 are the manifest's and the SIF header reads is it renamed into "
                       "place, so an interrupted (Ctrl-C, SIGTERM: exit 130), stalled or refused pull leaves "
                       "nothing under the final name. A registry that sends less than 64 KiB in "
                       "ENVPORT_REGISTRY_IDLE_S seconds (default 60) is refused registry_unreachable. TLS: the "
                       "site profile's registry_ca, else the system's CAs. Credentials: ENVPORT_REGISTRY_USER and "
                       "ENVPORT_REGISTRY_PASSWORD, else the docker config file. Signatures are judged against "
                       "--key and the site's trust.keys before the rename, as `envport inspect` judges them: given "
                       "keys, a SIF is kept only when they verify it (docs/apptainer.md). Exit 0 pulled or "
                       "present, 3 refused (registry_unreachable, not_found, denied, tls_failed, "
                       "not_a_sif_artifact, output_exists, disk_low; bad_signature, untrusted_signer, unsigned "
                       "whenever a key is given), 1 failed (digest_mismatch, not_a_sif), 2 usage or an invalid "
                       "site profile or key file (before the registry is asked), 130 interrupted.")
    p.add_argument("ref", metavar="oras://HOST/REPO:TAG")
    p.add_argument("-o", "--output", default=".", metavar="DIR", help="folder to write the SIF into (default: .); "
                   "the file is DIR/<REPO's last part>_<TAG>.sif")
    p.add_argument("--force", action="store_true", help="replace a file already at DIR/<REPO's last part>_<TAG>.sif "
                   "(without it: REFUSED [output_exists], before the registry is asked)")
    p.add_argument("--site", default=None, metavar="NAME|FILE", help="site profile: NAME (the project's "
                   "sites/NAME.yaml) or FILE (a path ending .yaml or .yml; no project needed); default: local. "
                   "Its registry_ca and trust")
    p.add_argument("--key", action="append", default=[], metavar="PUB.pem",
                   help="PEM public key to check the SIF's signatures against (beside the site's trust.keys); "
                   "repeatable. A private key is used by its public half, with a warning")
    p.add_argument("--statements", action="store_true",
                   help="also fetch the in-toto statements attached to the SIF as OCI referrers (envport push "
                   "attaches those the SIF carries) into FILE.sif.intoto.jsonl beside it, one DSSE envelope a "
                   "line (docs/provenance.md); they are judged where they are read")
    p.add_argument("--json", action="store_true", help="print the verdict as JSON")
    p.set_defaults(func=run)


# Reasons of a file that arrived but is not what was promised: FAILED (something broke), not REFUSED.
BROKEN = ("digest_mismatch", "not_a_sif")


def trust_checks(site, key_files: list[str]):
    """The check of the complete, digest-checked partial file before it is renamed into place (and of a file
    already there, before it is called present): its signatures judged against --key and the site's trust.keys
    by sif/gate.py `judge_trust`, the judgement `envport inspect` makes of the same file with the same keys.
    Given keys, anything but verified is refused (bad_signature, untrusted_signer, unsigned: exit 3). The keys
    are loaded here, before the registry is asked: a key file that is not a key is exit 2 before the first
    byte. The check raises RegistryError, and a downloaded file is removed: nothing appears under the final
    name. Returns the check and a list it fills with what was found, for the verdict line."""
    from envport.sif.gate import load_trust_keys

    keys = load_trust_keys(key_files, site.trust_keys())
    found: list[str] = []

    def check(path: Path) -> None:
        _readable_sif(path)
        found.clear()
        found.append(_judged(path, keys))
    return check, found


def _readable_sif(path: Path) -> None:
    from envport.engines.registry import RegistryError
    from envport.sif.format import SifError, read_sif

    try:
        read_sif(path)
    except SifError as exc:
        raise RegistryError("not_a_sif", f"the layer is not a usable SIF ({exc.message})") from None


def _judged(path: Path, keys: list) -> str:
    """What the signatures of PATH are, for the verdict line; RegistryError when they refuse it."""
    from envport.core.verdict import Verdict
    from envport.engines.registry import RegistryError
    from envport.sif.gate import judge_trust

    if not keys:
        return "signatures not checked (no --key, no trust.keys)"
    result, _ = judge_trust(path, keys)
    if result.verdict is Verdict.OK:
        return "signatures verified against " + ", ".join(Path(k.path).name for k in keys)
    reason = result.reason if result.verdict is Verdict.REFUSED else "not_a_sif"
    raise RegistryError(reason, f"the SIF was refused: {result.detail}" + "".join(
        f"; {line}" for line in result.lines))


def run(args) -> int:
    import sys

    from envport.commands._common import root_or_here
    from envport.core.errors import EnvportError
    from envport.core.proc import sigterm_interrupts
    from envport.core.progress import transfer_progress
    from envport.core.verdict import StepResult, Verdict, report
    from envport.engines import registry
    from envport.plan.site import load_site

    try:
        ref = registry.parse_ref(args.ref)
        idle = registry.idle_seconds()
    except ValueError as exc:
        raise EnvportError(str(exc)) from None
    if not ref.tag:
        raise EnvportError(f"{args.ref!r}: name the tag (oras://HOST/REPO:TAG; `envport push` tags with the "
                           "env's hash12)")
    site = load_site(args.site, root_or_here(args))  # outside any project: the local site's defaults
    check, found = trust_checks(site, args.key)
    step = f"pull {ref}"
    start = time.monotonic()
    try:
        # SIGTERM (a scheduler's, a `timeout`'s) and SIGHUP end the pull as Ctrl-C does: the partial removed, exit 130.
        with sigterm_interrupts():
            out = registry.pull_sif(ref, Path(args.output), ca=site.registry_ca, force=args.force, idle=idle,
                                    check=check, progress=transfer_progress(f"pull {ref}"))
    except registry.RegistryError as exc:
        verdict = Verdict.FAILED if exc.reason in BROKEN else Verdict.REFUSED
        return report([StepResult(step, verdict, str(exc), reason=exc.reason, seconds=time.monotonic() - start)],
                      args.json, command="pull")
    except KeyboardInterrupt:
        final = Path(args.output) / registry.file_name(ref)
        print(f"{step}: stopped; nothing was written to {final} and no partial file is left", file=sys.stderr)
        raise
    steps = [_pulled(step, out, found, time.monotonic() - start)]
    if args.statements:
        steps.append(_statements(ref, Path(out["path"]), site.registry_ca))
    return report(steps, args.json, command="pull")


def _statements(ref, sif: Path, ca):
    """The in-toto referrers of REF written beside SIF as SIF.intoto.jsonl (none: no file)."""
    from envport.core.files import write_atomic
    from envport.core.verdict import StepResult, Verdict
    from envport.engines.referrers import fetch_statements
    from envport.engines.registry import RegistryError

    step = f"statements {ref}"
    try:
        found = fetch_statements(ref, ca=ca)
    except RegistryError as exc:
        return StepResult(step, Verdict.REFUSED, f"the SIF was pulled; its statements were not: {exc}",
                          reason=exc.reason)
    if not found:
        return StepResult(step, Verdict.OK, "no in-toto statement is attached to it")
    path = sif.with_name(sif.name + ".intoto.jsonl")
    write_atomic(path, "".join(e.decode("utf-8") + "\n" for e in found))
    return StepResult(step, Verdict.OK, f"{len(found)} in-toto statement(s) into {path}",
                      data={"path": str(path), "count": len(found)})


def _pulled(step: str, out: dict, found: list[str], seconds: float):
    """The verdict of a pull that kept its file: OK (downloaded), or present (the file there already is the
    layer: its sha256 was computed and compared with the manifest's, nothing was downloaded)."""
    from envport.core.verdict import StepResult, Verdict

    if out["present"]:
        return StepResult(step, Verdict.PRESENT, f"{out['path']} is already this layer ({out['size']} bytes, its "
                          f"sha256 computed and equal to the manifest's {out['digest']}): nothing was downloaded; "
                          f"checked: SIF header; {'; '.join(found)}", seconds=seconds, data=out)
    return StepResult(step, Verdict.OK, f"{out['path']} ({out['size']} bytes, {out['digest']}; checked: layer "
                      f"digest and SIF header; {'; '.join(found)})", seconds=seconds, data=out)

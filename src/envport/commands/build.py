"""`envport build NAME --target T`: build an env, or report it present."""

from __future__ import annotations

from envport.commands._common import load_one, lock_gate, project_root
from envport.targets.registry import get, hosted, names

BUILD_TARGETS = names()


def register(sub) -> None:
    p = sub.add_parser("build", help="build an env (docker image, .sif, venv or conda env)",
                       description="Build an env from its spec, or report it `present` when an env with the "
                       "same content hash exists (checked, not assumed). docker: image envport/<name>:<hash12>; "
                       "apptainer: <sif_dir>/<name>-<hash12>.sif (site profile; default .cache/sif), with apptainer where it is "
                       "on PATH, else envport's own .def builder (docs/apptainer.md); venv/conda: the rendered setup script run "
                       "locally or over SSH (--host, a site host alias or an ssh destination); a venv/conda env is `present` only "
                       "when its hash AND its installed distributions are what its build recorded, and otherwise "
                       "every step is replayed into a fresh env that replaces the old one only when it succeeded "
                       "(one build per env at a time: a second waits, at most ENVPORT_LOCK_WAIT seconds). Every "
                       "build ends with a pin check: each package the spec pins with == in the last phase naming "
                       "it is what the env has, else FAILED [pin_mismatch] naming the fix. venv/conda never "
                       "install system packages unasked: missing ones are REFUSED [system_pkgs_missing] with the "
                       "command to run, unless --install-system-pkgs. SIGTERM/SIGINT stop the build's whole "
                       "process tree (over SSH too) and envport waits for it. A new build names what changed "
                       "since the env it replaces (venv/conda: the one at its place; docker/apptainer: the last good "
                       "build of the target): spec fields and distributions, old -> new, as the ledger recorded "
                       "that build. Every build is recorded in this machine's ledger (`envport ledger NAME`; `--write-docs` regenerates docs/envs/<name>.md).")
    p.add_argument("spec", metavar="NAME|PATH")
    p.add_argument("--target", choices=BUILD_TARGETS, default="venv",
                   help="what to build (default: venv, which needs no daemon)")
    p.add_argument("--site", default=None, metavar="NAME|FILE",
                   help="site profile: sites/NAME.yaml, or a FILE ending .yaml/.yml (default: local)")
    p.add_argument("--host", default=None, help="venv/conda: build on this SSH host (site alias or destination)")
    p.add_argument("--rebuild", action="store_true", help="build even when present (venv/conda: from nothing)")
    p.add_argument("--check", action="store_true",
                   help="venv/conda: only report whether the env is present (its hash and installed "
                   "distributions are what its build recorded) and what differs; exit 1 when not; builds nothing")
    p.add_argument("--install-system-pkgs", action="store_true",
                   help="venv/conda: install the spec's missing system packages with apt-get (or dnf) as root, "
                   "showing its output. Without it envport never changes the host's packages: it checks them "
                   "(dpkg-query/rpm, versions included) and REFUSES [system_pkgs_missing] with the command to run")
    p.add_argument("--no-cache", action="store_true", help="docker: do not reuse the engine's layer cache")
    p.add_argument("--no-lock", action="store_true",
                   help="resolve every pip phase at build time even when specs/<name>.lock fits the spec "
                   "(another env, with another hash; the ledger records it). Without it a lock that does not "
                   "fit is REFUSED [lock_stale|lock_python|lock_platform] with `envport lock NAME` as the fix")
    p.add_argument("--from-docker", action="store_true",
                   help="apptainer: make the SIF from the built docker image envport/<name>:<hash12> "
                   "(apptainer build docker-daemon://..., or envport's builder without %%post)")
    p.add_argument("--sign", default=None, metavar="KEY.pem",
                   help="apptainer: sign the SIF last with this PEM private key, as `envport sign FILE.sif --key "
                   "KEY.pem` does (DSSE, apptainer's format), and attest its SLSA provenance with the same key, as "
                   "`envport attest` does (docs/provenance.md); present when already signed by it")
    p.add_argument("--json", action="store_true", help="print the verdicts as JSON")
    p.set_defaults(func=run)


def _fast_present(args) -> int | None:
    """`present` without loading the spec, for a target with a fast answer (commands/fast.py, targets/fast.py)."""
    from envport.commands.fast import answer
    from envport.targets.fast import ANSWERS

    if args.target not in ANSWERS or args.rebuild or args.no_cache or args.no_lock or args.from_docker or args.sign:
        return None
    return answer(args.spec, args.target, args.site, args.root, args.json)


def run(args) -> int:
    target = get(args.target)
    if (args.check or args.install_system_pkgs) and not target.hosts:
        from envport.core.errors import EnvportError

        flag = "--check" if args.check else "--install-system-pkgs"
        raise EnvportError(f"{flag} is for --target {' or '.join(hosted())} (a {args.target} build installs "
                           "system packages inside the image and is present only when built)", exit_code=2)
    if args.sign and not target.signs:
        from envport.core.errors import EnvportError

        signers = " or ".join(t for t in names() if get(t).signs)
        raise EnvportError(f"--sign is for --target {signers} (it signs the SIF); a {args.target} build has no "
                           "SIF to sign", exit_code=2)
    fast = _fast_present(args)
    if fast is not None:
        return fast
    from envport.core.progress import stderr_progress
    from envport.core.verdict import report
    from envport.flow.build import run_build
    from envport.plan.site import load_site
    from envport.recipe.identity import resolve
    from envport.report import ledger

    root = project_root(args)
    loaded = load_one(args, args.spec)
    site = load_site(args.site, root)
    site, refused, lock_fact = lock_gate(args.no_lock, loaded, site)
    identity = resolve(loaded, site, args.target).identity
    built = run_build(target, _request(args, loaded, site, root, identity, stderr_progress),
                      lock_refused=refused, lock_fact=lock_fact)
    if built.interrupted is not None:
        built.record(ledger.record)
        raise built.interrupted  # the CLI exits 130, naming the signal
    results = list(built.results)
    if args.sign and built.last.verdict.ok and built.last.data.get("sif"):
        from pathlib import Path


        results.append(_signed_and_attested(Path(built.last.data["sif"]), args.sign))
    code = report(results, args.json, command="build")
    # --check builds nothing: a record per check made 12 `build FAILED` rows for 0 failed builds.
    # The ledger keeps the build's facts (sif, size); a signature is in the file.
    if not args.check:
        built.record(ledger.record)
    if not args.json:
        shown = results[-1] if not results[-1].verdict.ok else built.last  # a failed signature, else the build
        print(f"{shown.verdict.value} {identity.ref} --target {args.target}")
    return code


def _signed_and_attested(sif, key: str):
    """The sign step, its detail naming the SLSA provenance statement the same key attested into the SIF
    (commands/attest.py; present when one by that key is there): one step, since both are the signer's word
    on this file. A provenance that failed is that step's verdict."""
    from dataclasses import replace

    from envport.commands.attest import attest_step, provenance_present
    from envport.commands.sign import sign_step
    from envport.core.verdict import Verdict
    from envport.sif.format import SifError, read_sif
    from envport.sif.provenance.attest import primary_of

    signed = sign_step(sif, [key], None)
    if not signed.verdict.ok:
        return signed
    try:
        info = read_sif(sif)
        read = (info, primary_of(info))
    except SifError as exc:  # the file sign_step just wrote no longer reads: said as the attest step would
        return replace(signed, verdict=Verdict.FAILED, reason=exc.reason,
                       detail=f"signed ({signed.detail}); provenance not attested: {exc.message}")
    if provenance_present(read, key):
        return replace(signed, detail=f"{signed.detail}; SLSA provenance already attested by this key")
    attested = attest_step(sif, [key], read=read)
    if attested.reason == "no_embedded_spec":
        # apptainer's own route embeds no envport-spec.json to attest from: the signature asked for stands,
        # and the step says plainly that no provenance was written (never OK for a statement not made).
        return replace(signed, detail=f"{signed.detail}; no provenance attested: {attested.detail}",
                       data={**signed.data, "provenance": None})
    if not attested.verdict.ok:
        return replace(attested, step=signed.step, detail=f"signed ({signed.detail}); provenance not attested: "
                       f"{attested.detail}")
    return replace(signed, detail=f"{signed.detail}; provenance: {attested.detail}",
                   data={**signed.data, "provenance": attested.data})


def _rememberable(args, loaded) -> bool:
    """This build is the env the fast path's plain `build NAME` would mean: by name, with its lock."""
    return args.spec == loaded.spec.name and not args.no_lock


def _request(args, loaded, site, root, identity, progress):
    from envport.targets.base import BuildRequest

    return BuildRequest(
        loaded, site, root, identity, site_name=args.site, host=args.host, rebuild=args.rebuild,
        no_cache=args.no_cache, check=args.check, install_system_pkgs=args.install_system_pkgs,
        from_docker=args.from_docker, remember=_rememberable(args, loaded), progress=progress)

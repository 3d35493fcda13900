"""`envport sbom NAME --target docker|apptainer|venv` and `envport sbom FILE.sif`: what a built env holds."""

from __future__ import annotations

import sys
from pathlib import Path

SBOM_TARGETS = ("docker", "apptainer", "venv")


def register(sub) -> None:
    p = sub.add_parser("sbom", help="a CycloneDX (or SPDX) SBOM of a built env (or a .sif), read from its content",
                       description="Write a CycloneDX 1.6 JSON SBOM (or SPDX 2.3 JSON: --format spdx) of what a built env holds, read from the env "
                       "itself, never from its spec: the Debian packages its var/lib/dpkg/status lists as "
                       "installed (pkg:deb/debian/...) and the Python distributions (*.dist-info) of its "
                       "interpreter's site-packages (pkg:pypi/...), with the env's name, hash and lock as "
                       "metadata; validated against CycloneDX's schema before it is written. A SIF's partition "
                       "is mounted read-only (nosuid,nodev); a docker image's filesystem is exported to a tmp "
                       "dir (the container is never started); a venv is read in place. Exit 0 written, 3 "
                       "refused (the env is not built, or the SIF cannot be mounted here), 1 failed (not a "
                       "usable SIF).")
    p.add_argument("env", metavar="NAME|FILE.sif", help="a spec name (with --target), or a SIF file")
    p.add_argument("--target", choices=SBOM_TARGETS, default="docker", help="which built env of NAME (default: docker)")
    p.add_argument("--site", default=None, help="site profile (default: local); it names the env's hash")
    p.add_argument("--format", choices=("cyclonedx", "spdx"), default="cyclonedx",
                   help="cyclonedx (CycloneDX 1.6 JSON, default) or spdx (SPDX 2.3 JSON, via spdx-tools)")
    p.add_argument("-o", "--output", default=None, metavar="FILE", help="write the SBOM here (default: stdout)")
    p.set_defaults(func=run)


def run(args) -> int:
    from envport.core.files import write_atomic
    from envport.core.verdict import StepResult, Verdict, report

    if args.env.endswith(".sif") or Path(args.env).is_file():
        result, text = _from_sif(Path(args.env), None, args.format)
    else:
        result, text = _from_name(args)
    if text is None:
        return report([result], False, stream=sys.stderr)
    if args.output:
        write_atomic(Path(args.output), text)
        return report([StepResult(result.step, Verdict.OK, f"{result.detail}; written to {args.output}")], False,
                      stream=sys.stderr)
    sys.stdout.write(text)
    return report([result], False, stream=sys.stderr)


def _from_sif(path: Path, lock, fmt: str):
    from envport.builders.apptainer.sif_inspect import admitted
    from envport.core.verdict import StepResult, Verdict
    from envport.sif.format import SifError
    from envport.sif.run import MountError
    from envport.sif import sbom

    step = f"sbom {path.name}"
    # The gate and inspect's content checks first: an SBOM of a damaged or tampered file is no SBOM of it.
    checked = admitted(path, step=step, fix="the file you named does not exist: check the path")
    if isinstance(checked, StepResult):
        return checked, None
    gated, _ = checked
    try:
        text, packages = sbom.sif_sbom(gated, sbom.sif_facts(gated.info, lock), fmt)
    except SifError as exc:
        return StepResult(step, Verdict.FAILED, str(exc), reason=exc.reason), None
    except MountError as exc:
        fix = sbom.mount_fix("the partition is no squashfs they can read (their words above): the file is "
                             "damaged, or not the SIF it claims to be")
        return StepResult(step, Verdict.REFUSED, str(exc), reason=exc.reason, lines=[f"fix: {fix}"]), None
    return _described(step, packages, fmt), text


def _from_name(args):
    from envport.commands._common import load_one, project_root
    from envport.plan.site import load_site
    from envport.recipe.identity import resolve

    root = project_root(args)
    loaded = load_one(args, args.env)
    site = load_site(args.site, root)
    identity = resolve(loaded, site, args.target).identity
    from envport.sif.sbom import lock_fact

    lock = lock_fact(loaded, site)
    if args.target == "apptainer":
        from envport.builders.apptainer.builder import sif_path

        path = sif_path(site, root, identity)
        if not path.is_file():
            return _missing(f"sbom {identity.ref}", f"no SIF at {path}", "sif_missing",
                            f"envport build {loaded.spec.name} --target apptainer"), None
        return _from_sif(path, lock, args.format)  # the lock is known from the spec's side here, not from the file
    if args.target == "venv":
        return _from_venv(loaded, identity, lock, args.format)
    return _from_image(loaded, identity, lock, args.format)


def _from_venv(loaded, identity, lock, fmt: str):
    from envport.core import layout
    from envport.sif import sbom

    prefix = layout.env_prefix(loaded.spec.name)
    step = f"sbom {identity.ref} (venv)"
    try:
        recorded = (prefix / ".envport" / "hash").read_text().strip()
    except OSError:
        return _missing(step, f"no env at {prefix}", "env_missing",
                        f"envport build {loaded.spec.name} --target venv"), None
    if recorded != identity.hash:
        return _missing(step, f"the env at {prefix} was built as {recorded[:12]}, the spec now resolves to "
                        f"{identity.hash12}", "stale", f"envport build {loaded.spec.name} --target venv"), None
    created = sbom.timestamp((prefix / "pyvenv.cfg").stat().st_mtime)
    facts = sbom.EnvFacts(loaded.spec.name, identity.hash, "venv", lock=lock, created=created)
    return _written(step, prefix, facts, fmt, venv=())


def _from_image(loaded, identity, lock, fmt: str):
    import tempfile
    from datetime import datetime

    from envport.engines.docker import ExportError, connect, export_rootfs, get_image
    from envport.sif import sbom

    step = f"sbom {identity.image_tag}"
    client, refused = connect(step)
    if refused is not None:
        return refused, None
    image = get_image(client, identity.image_tag)
    if image is None:
        return _missing(step, f"the engine has no image {identity.image_tag}", "image_missing",
                        f"envport build {loaded.spec.name} --target docker"), None
    created = datetime.fromisoformat(image.attrs["Created"][:19] + "+00:00")
    facts = sbom.EnvFacts(loaded.spec.name, identity.hash, "docker", lock=lock, created=created)
    with tempfile.TemporaryDirectory(prefix="envport-sbom-") as tmp:
        try:
            export_rootfs(identity.image_tag, Path(tmp) / "rootfs")
        except ExportError as exc:
            from envport.core.verdict import StepResult, Verdict
            return StepResult(step, Verdict.FAILED, str(exc)), None
        return _written(step, Path(tmp) / "rootfs", facts, fmt)


def _missing(step: str, detail: str, reason: str, fix: str):
    from envport.core.verdict import StepResult, Verdict
    return StepResult(step, Verdict.REFUSED, detail, reason=reason, lines=[f"fix: {fix}"])


def _written(step: str, tree: Path, facts, fmt: str, venv=None):
    from envport.sif import sbom

    text, packages = sbom.make_sbom(tree, facts, sbom.CONTAINER_VENV if venv is None else venv, fmt)
    return _described(step, packages, fmt), text


def _described(step: str, packages, fmt: str):
    from envport.core.verdict import StepResult, Verdict

    debs = sum(p.kind == "deb" for p in packages)
    return StepResult(step, Verdict.OK, f"{debs} Debian packages, {len(packages) - debs} Python distributions "
                      f"({'SPDX 2.3, validated by spdx-tools' if fmt == 'spdx' else 'CycloneDX 1.6, schema-valid'})")

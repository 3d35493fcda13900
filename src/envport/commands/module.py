"""`envport module install|list|show|uninstall|exec`: publish a verified SIF to users as an environment module."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from envport.commands._common import root_or_here
from envport.core.untrusted import shown
from envport.core.verdict import envelope, print_json


def register(sub) -> None:
    p = sub.add_parser("module", help="publish a SIF that passes the trust gate as an Lmod/Tcl module with a "
                       "wrapper per executable its embedded spec names",
                       description="The admin's last step: a SIF, through the trust gate and inspect's content "
                       "checks, written under a modulepath as NAME/HASH12.lua (Lmod) and NAME/HASH12 (Tcl), with "
                       "one wrapper script per executable the spec it embeds names (python, its CLI witnesses' "
                       "commands), each running the command inside the SIF (apptainer exec where installed, "
                       "else `envport module exec`). Exit 0 written or present, 1 failed, 2 usage, 3 refused.")
    verbs = p.add_subparsers(dest="module_command", metavar="VERB")
    verbs.required = True
    inst = verbs.add_parser("install", help="write the module of FILE.sif (or oras://HOST/REPO:TAG) under "
                            "--modulepath")
    inst.add_argument("sif", metavar="FILE.sif|oras://HOST/REPO:TAG",
                      help="the SIF, or its registry reference: pulled into a private folder first, its signatures "
                      "judged as `envport pull` judges them")
    _modulepath(inst)
    inst.add_argument("--site", default=None, metavar="NAME|FILE",
                      help="site profile (default: local): its trust.require_signed and trust.keys")
    inst.add_argument("--key", action="append", default=[], metavar="PUB.pem",
                      help="PEM public key to name the signer by (beside the site's trust.keys); repeatable")
    inst.add_argument("--default", action="store_true", help="make this version NAME's default (.version)")
    inst.add_argument("--weights-dir", default=None, metavar="DIR",
                      help="where the weight folders are (default: envport's weights dir); each is bound "
                      "read-only at the spec's path when it exists")
    inst.add_argument("--shpc", default=None, metavar="DIR",
                      help="with oras://HOST/REPO:TAG: also write DIR/HOST/REPO/container.yaml, a Singularity-HPC "
                      "registry entry pinned by the manifest's digest (other tags there kept)")
    inst.add_argument("--json", action="store_true", help="print the result as JSON (docs/cli.md)")
    inst.set_defaults(func=run_install)
    ls = verbs.add_parser("list", help="the modules envport wrote under --modulepath")
    _modulepath(ls)
    ls.add_argument("--json", action="store_true", help="print the list as JSON")
    ls.set_defaults(func=run_list)
    show = verbs.add_parser("show", help="what one module holds: its record (spec, signer, SBOM, wrappers)")
    show.add_argument("ref", metavar="NAME[/VERSION]")
    _modulepath(show)
    show.add_argument("--json", action="store_true", help="print the records as JSON")
    show.set_defaults(func=run_show)
    rm = verbs.add_parser("uninstall", help="remove one version (NAME/VERSION) or every version (NAME)")
    rm.add_argument("ref", metavar="NAME[/VERSION]")
    _modulepath(rm)
    rm.set_defaults(func=run_uninstall)
    ex = verbs.add_parser("exec", help="run a command inside a SIF through the trust gate (what a module's "
                          "wrapper calls where apptainer is not installed)")
    ex.add_argument("--site", default=None, metavar="NAME|FILE", help="site profile whose trust policy applies")
    ex.add_argument("--nv", action="store_true", help="the GPUs (apptainer's --nv)")
    ex.add_argument("--bind", action="append", default=[], metavar="SRC:DST",
                    help="host folder bound read-only at DST; repeatable")
    ex.add_argument("sif", metavar="FILE.sif")
    ex.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- CMD ARGS")
    ex.set_defaults(func=run_exec)


def _modulepath(p) -> None:
    p.add_argument("--modulepath", required=True, metavar="DIR",
                   help="the module tree (what users `module use`)")


def run_install(args) -> int:
    from envport.core.errors import EnvportError
    from envport.plan.site import load_site

    site = load_site(args.site, root_or_here(args))  # trust.require_signed: the gate below refuses (exit 3)
    if args.sif.startswith("oras://"):
        return _install_pulled(args, site)
    if args.shpc:
        raise EnvportError("--shpc pins the SIF's registry source by digest, and a file names no registry: "
                           "install from oras://HOST/REPO:TAG (after `envport push`)")
    return _install(args, site, Path(args.sif))


def _install_pulled(args, site) -> int:
    """oras://HOST/REPO:TAG pulled into a private temp folder (the layer's digest, the SIF header and the
    signatures judged as `envport pull` judges them), then installed from there; --shpc pins its manifest."""
    import tempfile

    from envport.commands.pull import BROKEN, trust_checks
    from envport.core.errors import EnvportError
    from envport.core.progress import transfer_progress
    from envport.core.verdict import StepResult, Verdict
    from envport.engines import registry

    try:
        ref = registry.parse_ref(args.sif)
    except ValueError as exc:
        raise EnvportError(str(exc)) from None
    if not ref.tag:
        raise EnvportError(f"{args.sif!r}: name the tag (oras://HOST/REPO:TAG)")
    check, _ = trust_checks(site, args.key)
    step = f"module install {ref}"
    try:
        with tempfile.TemporaryDirectory(prefix="envport-module-pull-") as tmp:
            out = registry.pull_sif(ref, Path(tmp), ca=site.registry_ca, idle=registry.idle_seconds(), check=check,
                                    progress=transfer_progress(f"pull {ref}"))
            pin = registry.pinned(ref, ca=site.registry_ca) if args.shpc else None
            if pin is not None and pin[1]["digest"] != out["digest"]:
                return _done(args, [StepResult(step, Verdict.REFUSED, f"{ref} moved while it was pulled (its layer "
                                               f"was {out['digest']}, is {pin[1]['digest']} now): nothing was "
                                               "written", reason="tag_moved", lines=["fix: run it again"])])
            return _install(args, site, Path(out["path"]), pin=(ref, pin[0]) if pin else None)
    except registry.RegistryError as exc:
        verdict = Verdict.FAILED if exc.reason in BROKEN else Verdict.REFUSED
        return _done(args, [StepResult(step, verdict, str(exc), reason=exc.reason)])


def _install(args, site, sif: Path, pin=None) -> int:
    from envport.sif.report import admitted
    from envport.sif.embedded import embedded
    from envport.core.verdict import StepResult, Verdict, exit_code
    from envport.report import modules

    modulepath = Path(args.modulepath).absolute()
    fix = "the file you named does not exist: check the path"
    checked = admitted(sif, step=f"module install {sif.name}", fix=fix)
    if isinstance(checked, StepResult):
        return _done(args, [checked])
    gated, report = checked
    doc = report.facts.get("embedded")
    name = (doc.get("spec") or {}).get("name") if isinstance(doc, dict) and isinstance(doc.get("spec"), dict) \
        else None
    spec = embedded(sif, str(name or ""), Path.cwd(), checked=checked) if name else None
    if spec is None or isinstance(spec, StepResult):
        refused = spec or StepResult(f"module install {sif.name}", Verdict.REFUSED, f"{sif} holds no "
                                     "envport-spec.json: there is no spec to write a module from",
                                     reason="no_embedded_spec",
                                     lines=["fix: ask its builder for a SIF built by envport (envport build NAME "
                                            "--target apptainer), which embeds its spec"])
        return _done(args, [refused])
    module = _module(args, site, gated, report, spec, modulepath)
    steps = [modules.install(module, gated.file, gated.file.st.st_size, args.default)]
    if pin is not None and steps[0].verdict.ok:
        steps.append(_shpc(Path(args.shpc), module, *pin))
    code = exit_code(steps)
    if args.json:
        print_json(envelope("module install", code, steps))
        return code
    for step in steps:
        print(shown(step.line()))
    print(f"    | use it: module use {shlex.quote(str(modulepath))}; module load {module.name}/{module.version}")
    return code


def _shpc(registry_dir: Path, module, ref, digest: str):
    """REGISTRY_DIR/HOST/REPO/container.yaml for shpc: `present` when it already pins this tag to DIGEST."""
    import yaml

    from envport.core.files import write_atomic
    from envport.core.verdict import StepResult, Verdict
    from envport.report import modules

    repository = f"{ref.host}/{ref.repo}"
    path = registry_dir / ref.host / ref.repo / "container.yaml"
    try:
        existing = yaml.safe_load(path.read_text()) if path.is_file() else None
    except (OSError, yaml.YAMLError):
        existing = None  # not a file shpc could read either: written anew
    text = modules.shpc_entry(module, repository, ref.tag, digest, existing)
    step = f"shpc {repository}:{ref.tag}"
    if path.is_file() and path.read_text() == text:
        return StepResult(step, Verdict.PRESENT, f"{path} already pins it to {digest}")
    write_atomic(path, text)
    return StepResult(step, Verdict.OK, f"{path}: tag {ref.tag} pinned to {digest} (`shpc install "
                      f"{repository}:{ref.tag}` with {registry_dir} as its registry)", data={"container_yaml": str(path)})


def _module(args, site, gated, report, spec, modulepath: Path):
    from envport import __version__
    from envport.builders import weights
    from envport.report import modules
    from envport.sif import run as sif_run

    loaded = spec.loaded
    keys = list(dict.fromkeys([str(Path(k).resolve()) for k in args.key] + site.trust_keys()))
    runtime = sif_run.runtime()
    gpus = loaded.spec.resources.gpus > 0
    if runtime == "apptainer":
        runner = (sif_run.apptainer() or "apptainer", "exec", "--cleanenv", *(("--nv",) if gpus else ()))
    else:
        runtime = "envport"
        site_file = getattr(site, "_source", None)
        runner = (sys.executable, "-m", "envport", "module", "exec",
                  *(("--site", str(Path(site_file).absolute())) if site_file else ()), *(("--nv",) if gpus else ()))
    name = loaded.spec.name
    sif_name = f"{name}-{spec.identity.hash[:12]}.sif"
    return modules.Module(
        name=name, hash=spec.identity.hash, description=loaded.spec.description, source=str(args.sif),
        modulepath=modulepath, signer=signer(gated, keys), sbom=modules.sbom_line(report.facts, sif_name),
        witnessed=modules.witnessed(loaded.spec),
        spec_line=f"{spec.identity.ref} (envport-spec.json in the SIF; {spec.checked})",
        executables=modules.executables(loaded.spec), runner=runner, runtime=runtime, gpus=gpus,
        binds=tuple(weights.mounts(loaded.spec, weights.weights_root(args.weights_dir))),
        partition_sha256=str(report.facts.get("partition_sha256", "")), tool=f"envport {__version__}")


def signer(gated, keys: list[str]) -> str:
    """Who signed the gated SIF, by the keys the admin trusts: `verified: KEY`, `unsigned`, or why not."""
    from envport.sif.gate import judge_signatures
    from envport.sif.keys import KeyFileError, load_public_key
    from envport.sif.verify import UNSIGNED, VERIFIED, check_signatures

    verdict, detail, _ = judge_signatures(gated.info, keys)
    if verdict == VERIFIED:
        try:
            checked = check_signatures(gated.info, [load_public_key(k) for k in keys])
        except KeyFileError:
            return "verified"
        by = [s.by for s in checked.signatures if s.verdict == VERIFIED and s.by]
        return "verified: " + ", ".join(dict.fromkeys(by)) if by else "verified"
    if verdict == UNSIGNED:
        return "unsigned"
    if not keys:
        return f"signed, not checked (no trust.keys or --key): {detail}"
    return f"{verdict}: {detail}"


def _done(args, steps) -> int:
    from envport.core.verdict import report

    return report(steps, getattr(args, "json", False), command="module install")


def run_list(args) -> int:
    from envport.report import modules

    found = modules.installed(Path(args.modulepath))
    if args.json:
        print_json(envelope("module list", 0, modules=found))
        return 0
    if not found:
        print(f"no modules written by envport under {args.modulepath}")
    for r in found:
        marks = (" (default)" if r["default"] else "") + ("" if r["whole"] else " (incomplete: modulefile missing; "
                                                             "run module install again or uninstall it)")
        print(shown(f"{r['name']}/{r['version']}{marks}  signer: {r['signer']}  commands: "
                    f"{', '.join(r['executables'])}"))
    return 0


def run_show(args) -> int:
    from envport.report import modules

    found = modules.find(Path(args.modulepath), args.ref)
    if not found:
        return _missing(args, "show")
    if args.json:
        print_json(envelope("module show", 0, modules=found))
        return 0
    for r in found:
        print(f"module       {r['name']}/{r['version']}" + (" (default)" if r["default"] else ""))
        for key in ("spec", "signer", "sbom", "witnessed", "sif", "source", "runtime", "modulefile"):
            print(shown(f"{key:<12} {r[key]}"))
        for exe in r["executables"]:
            print(f"wrapper      {Path(r['sif']).parent / 'bin' / exe}")
    return 0


def run_uninstall(args) -> int:
    from envport.core.verdict import report
    from envport.report import modules

    found = modules.find(Path(args.modulepath), args.ref)
    if not found:
        return _missing(args, "uninstall")
    return report([modules.uninstall(Path(args.modulepath), r) for r in found], False)


def _missing(args, verb: str) -> int:
    from envport.core.verdict import StepResult, Verdict, report

    return report([StepResult(f"module {verb} {args.ref}", Verdict.REFUSED, f"no module {args.ref} written by "
                              f"envport under {args.modulepath}", reason="module_missing",
                              lines=[f"fix: envport module list --modulepath {shlex.quote(args.modulepath)}"])],
                  getattr(args, "json", False), command=f"module {verb}")


def run_exec(args) -> int:
    """The command inside the SIF, through the gate: apptainer exec of the gated descriptor, else ch-run on
    its partition mounted nosuid,nodev. Exit: the command's own."""
    from envport.core.errors import EnvportError
    from envport.core.proc import spawn
    from envport.plan.site import load_site
    from envport.sif import run as sif_run
    from envport.sif.gate import gate
    from envport.sif.handle import SifError

    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not argv:
        raise EnvportError("envport module exec FILE.sif -- CMD ARGS: name the command to run")
    if args.site:
        load_site(args.site, root_or_here(args))
    binds = [tuple(b.split(":", 1)) for b in args.bind if ":" in b]
    try:
        gated = gate(args.sif)
    except SifError as exc:
        print(f"envport: REFUSED [{exc.reason}] {exc.message}", file=sys.stderr)
        return 3
    if sif_run.runtime() == "apptainer":
        cmd = sif_run.apptainer_argv(gated, argv, binds=[(s, d, True) for s, d in binds], nv=args.nv)
        # the user's terminal is the command's: stdin, stdout and stderr are inherited
        return spawn(cmd, stdin=None, stdout=None, stderr=None, pass_fds=gated.file.pass_fds).wait()
    with sif_run.mounted(gated) as mnt:
        proc = spawn(sif_run.ch_run_argv(str(mnt), argv, binds=binds), env=sif_run.ch_run_env(), stdin=None,
                     stdout=None, stderr=None)
        try:
            return proc.wait()
        except KeyboardInterrupt:
            return proc.wait()

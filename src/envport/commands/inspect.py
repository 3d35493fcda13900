"""`envport inspect FILE.sif`: what a SIF holds and whether it matches its spec, without apptainer."""

from __future__ import annotations

import shlex
from dataclasses import replace
from pathlib import Path

from envport.commands.verify_sig import signature_lines, verify_step
from envport.core.untrusted import shown
from envport.core.verdict import envelope, print_json


def register(sub) -> None:
    p = sub.add_parser("inspect", help="read a .sif without apptainer and judge it by its content: header, "
                       "objects, the image's own labels, environment, python, distributions and risks, and "
                       "whether it matches specs/NAME.yaml",
                       description="Read a SIF file with envport alone (no apptainer, no build host): the header "
                       "and descriptors, the def file and inspect-metadata.json (shown as claims), the squashfs "
                       "superblock, then the partition itself (unsquashfs, never mounted): its "
                       "/.singularity.d labels and environment, its python and *.dist-info distributions, and "
                       "its risks (set-id files, device nodes, world-writable directories without the sticky "
                       "bit, symlinks leaving the image). It matches specs/NAME.yaml only when the content is "
                       "what the spec and its lock install; when the spec moved on, the changed fields are "
                       "named, and the fix fits this host (a build where it can build a SIF, else a rebuild by "
                       "its builder or a run with the spec it embeds); outside a project, against the spec and "
                       "lock the SIF itself embeds (envport-spec.json, once its name and hash agree with the "
                       "image's own labels; without an embedded lock, the spec's == pins). Text "
                       "from the file is printed with non-printable characters escaped. Exit 0 "
                       "matches, 1 not a usable SIF (truncated, corrupt, trailing_bytes, bytes_used_mismatch, "
                       "corrupt_object, not a SIF: the reason token says which), 3 stale, content_mismatch, "
                       "labels_disagree, risks, foreign architecture or not built by envport; with keys (--key, the site's "
                       "trust.keys) every signature is listed and checked as `envport verify-sig` does, the "
                       "judgement `envport pull` makes too: 3 bad_signature (names what changed), "
                       "untrusted_signer or unsigned. Without keys the signatures are listed, not checked. 2: "
                       "bad arguments, an invalid site profile or a key file that is not a key.")
    p.add_argument("sif", metavar="FILE.sif")
    p.add_argument("--spec", default=None, metavar="NAME|PATH",
                   help="compare with this spec (default: the SIF's envport.name label)")
    p.add_argument("--site", default=None, metavar="NAME|FILE",
                   help="site profile: NAME (the project's sites/NAME.yaml) or FILE (a path ending .yaml or .yml; "
                   "no project needed): its trust.keys, and the hash to compare (default: the site the SIF says it "
                   "was built for, when sites/ has it, else local)")
    p.add_argument("--key", action="append", default=[], metavar="PUB.pem",
                   help="PEM public key to check the signatures against (beside the site's trust.keys); "
                   "repeatable. A private key is used by its public half, with a warning")
    p.add_argument("--json", action="store_true", help="print everything as JSON (the envelope of docs/cli.md)")
    p.set_defaults(func=run)


def run(args) -> int:
    from envport.sif.report import failure, not_envport, read_report, verdict
    from envport.core.verdict import Verdict, exit_code

    path = Path(args.sif)
    report, problem = read_report(path)
    if problem is not None:
        result = failure(report, problem)
    elif not report.claimed.get("envport.hash"):
        result = verdict(report, not_envport(report))
    else:
        result = verdict(report, _compare(args, report))
    keys = _keys(args)
    signed, checked = verify_step(report.info or path, keys, [])
    statements = _statements(report.info, keys)
    # A file the signature reader cannot read either: the inspect step above already says why.
    steps = [result] + ([signed] if signed.verdict is not Verdict.FAILED else [])
    code = exit_code(steps)
    if args.json:
        print_json(envelope("inspect", code, steps, sif=report.facts,
                            signatures=checked.to_dict() if checked else None,
                            statements=[j.to_dict() for j in statements]))
        return code
    _print_facts(report)
    # Every line below may hold text from the file (labels, names, messages quoting them): escaped.
    for line in signature_lines(checked) + statement_lines(statements):
        print(shown(line))
    # The inspect verdict last: the run ends with its one-line verdict (the signatures' step before it).
    for step in steps[1:] + steps[:1]:
        print(shown(step.line()))
        for ln in step.lines:
            print(f"    | {shown(ln)}")
    return code


def _keys(args) -> list:
    """--key and the site's trust.keys, loaded: the signatures are judged against them by sif/gate.py
    `judge_trust` (the judgement `envport pull` makes of the same file with the same keys), and so are the
    in-toto statements."""
    from envport.commands._common import root_or_here
    from envport.plan.site import load_site
    from envport.sif.gate import load_trust_keys

    # Outside any project (an admin's folder): the local site's defaults.
    return load_trust_keys(args.key, load_site(args.site, root_or_here(args)).trust_keys())


def _statements(info, keys) -> list:
    """The SIF's in-toto statements judged (sif/provenance/judge.py); [] for a file that did not read."""
    from envport.sif.provenance.attest import primary_of
    from envport.sif.provenance.judge import judge_statements
    from envport.sif.format import SifError

    if info is None:
        return []
    try:
        return judge_statements(info, primary_of(info), keys)
    except SifError:  # no primary partition: the inspect step says so
        return []


def statement_lines(statements) -> list[str]:
    """One line per statement: object, predicate type, verdict, signer; a witness statement's checks."""
    lines = []
    for j in statements:
        who = j.by or ", ".join(j.signers) or "nobody"
        lines.append(f"statement    object {j.object_id}: {j.predicate_type or '?'}: {j.verdict} ({who}): {j.detail}")
        pred = (j.statement or {}).get("predicate") or {}
        if j.witnessed:
            lines.append(f"witnessed    {pred.get('verdict', '?')} on {pred.get('launcher', '?')}, "
                         f"{(pred.get('host') or {}).get('arch', '?')}, {len(pred.get('gpus') or [])} GPU census: "
                         + ", ".join(f"{c} {'OK' if ok else 'FAILED'}" for c, ok in j.witnessed.items()))
        build = (pred.get("runDetails") or {}).get("builder") if isinstance(pred, dict) else None
        if build:
            deps = (pred.get("buildDefinition") or {}).get("resolvedDependencies") or []
            version = ", ".join(f"{k} {v}" for k, v in sorted((build.get("version") or {}).items()))
            lines.append(f"provenance   built by {build.get('id')} ({version}), {len(deps)} resolved dependencies")
    return lines


def _compare(args, report):
    from envport.sif.report import compare, embedded_site
    from envport.core.errors import EnvportError
    from envport.core.verdict import StepResult, Verdict
    from envport.plan.site import DEFAULT_SITE, load_site
    from envport.recipe.identity import resolve
    from envport.renderers import RENDERER_VERSION
    from envport.spec.loader import SPECS_DIR, find_root, load_spec

    labels = report.claimed
    name = args.spec or str(labels.get("envport.name", ""))
    step = f"inspect {Path(report.path).name}"
    root = None
    try:
        root = Path(args.root).resolve() if getattr(args, "root", None) else find_root()
        loaded = load_spec(name, None if name.endswith((".yaml", ".yml")) else root)
    except EnvportError as exc:
        # An admin holding only the file: judged against the spec and lock it embeds, where it embeds one.
        embeds = isinstance((report.facts.get("embedded") or {}).get("spec"), dict)
        in_project = root is not None and (root / SPECS_DIR).is_dir()
        run = f"envport witness {shlex.quote(name)} --target apptainer --sif {shlex.quote(report.path)}"
        if embeds and not args.spec and not in_project:
            from envport.sif.embedded import judged

            result = judged(report)
            return result if result.reason else replace(result, lines=[f"to run it: {run} (with the spec it embeds)"])
        return StepResult(step, Verdict.SKIPPED, f"built as {labels.get('envport.name')}@"
                          f"{str(labels['envport.hash'])[:12]}; not compared: {exc}",
                          lines=[f"to run it: {run}{' --embedded-spec' if in_project else ''} (with the spec it "
                                 "embeds)" if embeds else f"to run it: get specs/{name}.yaml from its builder, "
                                 f"then {run} in that project"])
    site_name = args.site or embedded_site(report) or DEFAULT_SITE
    if not args.site and site_name != DEFAULT_SITE and not (root / "sites" / f"{site_name}.yaml").is_file():
        site_name = DEFAULT_SITE
    resolved = resolve(loaded, load_site(site_name, root), "apptainer")
    from envport.builders.apptainer.builder import can_build

    return compare(report, loaded, resolved.hash, RENDERER_VERSION, resolved.plan, can_build=can_build())


def _print_facts(report) -> None:
    """The report as text; every value read from the file goes through `shown` (terminal escapes)."""
    from envport.core.untrusted import shown

    f = report.facts
    print(f"sif          {shown(report.path)}")
    if "header" in f:
        h = f["header"]
        print(f"header       SIF {shown(h['version'])}, {shown(h['arch'])}, {h['size']} bytes, created "
              f"{shown(h['created'])}, uuid {h['uuid']}")
    for d in f.get("objects", []):
        extra = f" {d['fs']} {d['partition']} {shown(d['arch'])}" if "fs" in d else ""
        name = f" {shown(d['name'])}" if d.get("name") else ""
        print(f"object {d['id']:<5} {d['type']}{name}{extra} (group {d['group']}, {d['size']} bytes at {d['offset']})")
    if "squashfs" in f:
        s = f["squashfs"]
        print(f"squashfs     {s['version']} {s['compression']}, {s['inodes']} inodes, {s['bytes']} bytes, "
              f"block {s['block_size']}")
    content = f.get("content")
    labels = report.claimed
    source = "/.singularity.d/labels.json" if content and content.get("labels") is not None else \
        "inspect-metadata.json"
    if labels.get("envport.hash"):
        print(f"env          labels claim {shown(labels.get('envport.name'))}@{shown(str(labels['envport.hash'])[:12])}"
              f" ({source})")
    for key in sorted(labels):
        print(f"label        {shown(key)}={shown(labels[key], 100)}")
    scripts = content.get("environment") if content else f.get("environment")
    for script, text in sorted((scripts or {}).items()):
        for ln in (ln.strip() for ln in text.splitlines()):
            if ln.startswith("export "):
                print(f"environment  {shown(ln)}  ({shown(Path(script).name)})")
    if f.get("runscript"):
        print(f"runscript    {len(f['runscript'].splitlines())} lines (inspect-metadata.json)")
    if content:
        dists = content.get("distributions") or {}
        print(f"content      python {shown(content.get('python') or 'none')}, {len(dists)} distributions, "
              f"{content.get('entries')} entries (read from the squashfs partition)")
    for c in report.checks:
        print(f"check        {c.name}: {c.verdict.value}" + (f" [{c.reason}]" if c.reason else "")
              + f": {shown(c.detail)}")
    if content is not None:
        risks = content.get("risks") or []
        print(f"risks        {content.get('risk_count', 0)}" + ("" if risks else " (none)"))
        for r in risks:
            print(f"risk         {r['kind']}: {shown(r['path'])} ({shown(r['detail'])})")

"""`envport inspect FILE.sif`: what a SIF holds and whether it matches its spec, without apptainer."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser("inspect", help="read a .sif without apptainer: header, objects, labels, environment, "
                       "and whether it matches specs/NAME.yaml",
                       description="Read a SIF file with envport alone (no apptainer, no build host): the header "
                       "and descriptors, the def file, inspect-metadata.json (labels, environment, runscript: "
                       "what `apptainer inspect` prints), the squashfs superblock, and which spec and hash it "
                       "was built from. When specs/NAME.yaml is here, say whether the SIF matches it now and, "
                       "when it does not, which spec fields changed (envport embeds the resolved spec in the "
                       "SIFs it builds). Exit 0 matches (or nothing to compare with), 1 not a usable SIF "
                       "(truncated, corrupt, not a SIF: the reason token says which), 3 stale, foreign "
                       "architecture or not built by envport.")
    p.add_argument("sif", metavar="FILE.sif")
    p.add_argument("--spec", default=None, metavar="NAME|PATH",
                   help="compare with this spec (default: the SIF's envport.name label)")
    p.add_argument("--site", default=None,
                   help="site profile whose hash to compare (default: the site the SIF says it was built for, "
                   "when sites/ has it, else local)")
    p.add_argument("--json", action="store_true", help="print everything as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from envport.build.apptainer.sif_inspect import failure, not_envport, read_report
    from envport.core.verdict import exit_code

    path = Path(args.sif)
    report, problem = read_report(path)
    if problem is not None:
        result = failure(report, problem)
    elif not (report.facts.get("labels") or {}).get("envport.hash"):
        result = not_envport(report)
    else:
        result = _compare(args, report)
    code = exit_code([result])
    if args.json:
        json.dump({"command": "inspect", "exit_code": code, "sif": report.facts, "steps": [result.to_dict()]},
                  sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
        return code
    _print_facts(report)
    from envport.core.verdict import report as print_results

    print_results([result], False)
    return code


def _compare(args, report):
    from envport.build.apptainer.sif_inspect import compare
    from envport.core.errors import EnvportError
    from envport.core.verdict import StepResult, Verdict
    from envport.plan.site import DEFAULT_SITE, load_site
    from envport.recipe.identity import resolve
    from envport.renderers import RENDERER_VERSION
    from envport.spec.loader import find_root, load_spec

    labels = report.facts["labels"]
    name = args.spec or labels.get("envport.name", "")
    step = f"inspect {Path(report.path).name}"
    try:
        root = Path(args.root).resolve() if getattr(args, "root", None) else find_root()
        loaded = load_spec(name, None if name.endswith((".yaml", ".yml")) else root)
    except EnvportError as exc:
        return StepResult(step, Verdict.SKIPPED, f"built as {labels.get('envport.name')}@"
                          f"{labels['envport.hash'][:12]}; not compared: {exc}")
    embedded = report.facts.get("embedded") or {}
    site_name = args.site or embedded.get("site") or DEFAULT_SITE
    if not args.site and site_name != DEFAULT_SITE and not (root / "sites" / f"{site_name}.yaml").is_file():
        site_name = DEFAULT_SITE
    current = resolve(loaded, load_site(site_name, root), "apptainer").hash
    return compare(report, loaded, current, RENDERER_VERSION)


def _print_facts(report) -> None:
    f = report.facts
    print(f"sif          {report.path}")
    if "header" in f:
        h = f["header"]
        print(f"header       SIF {h['version']}, {h['arch']}, {h['size']} bytes, created {h['created']}, "
              f"uuid {h['uuid']}")
    for d in f.get("objects", []):
        extra = f" {d['fs']} {d['partition']} {d['arch']}" if "fs" in d else ""
        name = f" {d['name']}" if d.get("name") else ""
        print(f"object {d['id']:<5} {d['type']}{name}{extra} (group {d['group']}, {d['size']} bytes at {d['offset']})")
    if "squashfs" in f:
        s = f["squashfs"]
        print(f"squashfs     {s['version']} {s['compression']}, {s['inodes']} inodes, {s['bytes']} bytes, "
              f"block {s['block_size']}")
    labels = f.get("labels") or {}
    if labels.get("envport.hash"):
        print(f"env          {labels.get('envport.name')}@{labels['envport.hash'][:12]}"
              + (f" (site {f['embedded']['site']})" if f.get("embedded") else ""))
    for key in sorted(labels):
        value = labels[key]
        print(f"label        {key}={value if len(value) <= 100 else value[:97] + '...'}")
    for script, text in sorted((f.get("environment") or {}).items()):
        lines = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("export ")]
        for ln in lines:
            print(f"environment  {ln}  ({Path(script).name})")
    if f.get("runscript"):
        print(f"runscript    {len(f['runscript'].splitlines())} lines")

"""`envport ledger`: what this machine did to an env, and its doc regenerated on purpose."""

from __future__ import annotations

import re

from envport.commands._common import add_json_arg, root_or_here
from envport.core.errors import EnvportError


def register(sub) -> None:
    p = sub.add_parser("ledger", help="print an env's ledger (builds, verifies, witnesses on this machine)",
                       description="Print the records this machine's ledger holds for env NAME (kept in "
                       "$ENVPORT_STATE_DIR, else the site's ledger_dir, else $XDG_STATE_HOME/envport or "
                       "~/.local/state/envport; never in the checkout), for the project here, or outside any "
                       "project for this folder (an admin's runs of a SIF with the spec it embeds). --write-docs "
                       "regenerates docs/envs/NAME.md from them (in a project): the only command that writes that "
                       "file.")
    p.add_argument("name", metavar="NAME", help="the env's name")
    p.add_argument("--site", default=None, metavar="NAME|FILE", help="site profile whose ledger_dir to read (default: local)")
    p.add_argument("--write-docs", action="store_true", help="regenerate docs/envs/NAME.md from the records")
    add_json_arg(p, "the records")
    p.set_defaults(func=run)


def run(args) -> int:
    from envport.core.verdict import StepResult, Verdict, envelope, print_json
    from envport.plan.site import load_site
    from envport.report import ledger

    if not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,62}", args.name):
        raise EnvportError(f"{args.name!r} is not an env name (lowercase letters, digits and '-')")
    from envport.spec.loader import SPECS_DIR

    root = root_or_here(args)
    if args.write_docs and not (root / SPECS_DIR).is_dir():
        raise EnvportError(f"--write-docs regenerates docs/envs/{args.name}.md in a project, and {root} has no "
                           f"{SPECS_DIR}/: run it in the project (or -C ROOT); without it the records are printed")
    where = load_site(args.site, root).ledger_dir
    path = ledger.ledger_path(root, args.name, where)
    records = ledger.read(root, args.name, where)
    steps = []
    if args.write_docs:
        doc = ledger.write_doc(root, args.name, records)
        steps.append(StepResult(f"write {doc.relative_to(root)}", Verdict.OK, f"{len(records)} record(s)"))
    if args.json:
        print_json(envelope("ledger", 0, steps, env=args.name, ledger=str(path), records=records))
        return 0
    print(f"ledger   {path} ({len(records)} record(s))")
    for r in records:
        print(f"{r.get('when', '?'):<26} {r.get('key', '-'):<30} {r.get('kind', '?'):<8} "
              f"{r.get('target', '?'):<10} {r.get('verdict', '?'):<8} {r.get('summary', '')}")
    for s in steps:
        print(s.line())
    return 0

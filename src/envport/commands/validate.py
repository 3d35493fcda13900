"""`envport validate`: check specs, report every problem at once."""

from __future__ import annotations

import sys

from envport.commands._common import add_json_arg, add_spec_args, load_each, spec_problems


def register(sub) -> None:
    p = sub.add_parser("validate", help="check specs and report every problem (exit 2 on any)",
                       description="Load, merge (extends) and validate specs. Every problem is printed as "
                       "FILE:LINE: FIELD: what was wrong (fix: ...), all of them at once; a file that cannot "
                       "be read is one problem and the other specs are still checked. --all also refuses "
                       "specs/*.yml (spec files end in .yaml).")
    add_spec_args(p)
    add_json_arg(p, "one step per valid spec")
    p.set_defaults(func=run)


def run(args) -> int:
    from envport.core.verdict import StepResult, Verdict, envelope, print_json
    from envport.recipe.identity import portable
    from envport.spec.model import requirement_warnings

    loaded_specs, problems = load_each(args)
    results = []
    for loaded in loaded_specs:
        ident = portable(loaded)
        # Valid, but not reproducible (a git branch ref): said, never an error.
        warnings = [f"{loaded.path}: {where}: {msg}" for where, msg in requirement_warnings(loaded.spec)]
        for w in warnings if not args.json else ():
            print(f"WARNING  {w}", file=sys.stderr)
        results.append(StepResult(f"validate {loaded.spec.name}", Verdict.OK, f"{ident.ref} ({loaded.path})",
                                  data={"env": loaded.spec.name, "hash": ident.hash, "file": str(loaded.path),
                                        "warnings": warnings}))
    if args.json:
        # The valid specs' steps and every problem, in one document; the exit code says which won.
        print_json(envelope("validate", 2 if problems else 0, results, problems))
    else:
        for r in results:
            print(f"OK       {r.detail}")
    if problems:
        exc = spec_problems(problems)
        if args.json:  # already printed as JSON; still the human lines on stderr
            for p in problems:
                print(p, file=sys.stderr)
            print(f"envport: {exc.summary}", file=sys.stderr)
            return exc.exit_code
        raise exc
    return 0

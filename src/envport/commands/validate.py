"""`envport validate`: check specs, report every problem at once."""

from __future__ import annotations

from envport.commands._common import add_spec_args, load_selected


def register(sub) -> None:
    p = sub.add_parser("validate", help="check specs and report every problem (exit 2 on any)",
                       description="Load, merge (extends) and validate specs. Every problem is printed as "
                       "FILE:LINE: FIELD: what was wrong (fix: ...), all of them at once.")
    add_spec_args(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from envport.recipe.identity import portable

    for loaded in load_selected(args):
        print(f"OK       {portable(loaded).ref} ({loaded.path})")
    return 0

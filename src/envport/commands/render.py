"""`envport render`: write images/<name>/ from specs, or check for drift."""

from __future__ import annotations

import sys

from envport.commands._common import add_spec_args, load_selected, project_root

# Kept in step with envport.renderers.TARGETS (tests/test_cli.py checks); the
# renderers import Jinja2, which `--help` should not pay for.
TARGETS = ("docker", "apptainer", "shell")


def register(sub) -> None:
    p = sub.add_parser("render", help="render specs to images/<name>/ (Dockerfile, .def, setup scripts)",
                       description="Render specs to images/<name>/: Dockerfile, <name>.def, setup-venv.sh, "
                       "setup-conda.sh and the shim files they copy. All specs are validated first; on any "
                       "problem nothing is written (exit 2). --check writes nothing and exits 1 listing "
                       "every drifted file.")
    add_spec_args(p)
    p.add_argument("--target", choices=TARGETS, action="append",
                   help="render only this target (repeatable; default: all)")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if images/ differs")
    p.set_defaults(func=run)


def run(args) -> int:
    from envport.recipe.render import drift, render_spec, write
    root = project_root(args)
    targets = tuple(args.target) if args.target else TARGETS
    full = set(targets) == set(TARGETS)
    selected = load_selected(args)
    renderings = [render_spec(loaded, targets) for loaded in selected]
    if args.check:
        drifted = [d for r in renderings for d in drift(root, r, full)]
        # A lock the spec has moved past renders as unlocked recipes: that is drift too.
        from envport.plan.lock import stale
        drifted += [f"{ld.path.with_suffix('.lock').name} [{p.reason}]: {p.message}"
                    for ld in selected if (p := stale(ld))]
        for d in drifted:
            print(f"drift: {d}", file=sys.stderr)
        if drifted:
            print(f"FAILED   {len(drifted)} file(s) differ from the specs; run `envport render`", file=sys.stderr)
            return 1
        print(f"OK       {len(renderings)} spec(s) match images/")
        return 0
    for r in renderings:
        changed = write(root, r, full)
        print(f"{'OK' if changed else 'present':<8} images/{r.name}/ ({len(changed)} file(s) changed)")
    return 0

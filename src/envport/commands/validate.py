"""`envport validate`: check specs, report every problem at once."""

from __future__ import annotations

import sys

from envport.commands._common import add_json_arg, add_spec_args, load_each, spec_problems


def register(sub) -> None:
    p = sub.add_parser("validate", help="check specs and report every problem (exit 2 on any)",
                       description="Load, merge (extends) and validate specs. Every problem is printed as "
                       "FILE:LINE: FIELD: what was wrong (fix: ...), all of them at once; a file that cannot "
                       "be read is one problem and the other specs are still checked. --all also refuses "
                       "specs/*.yml (spec files end in .yaml). Each valid spec is named by the identity "
                       "`envport build` gives it on the site (--site, default local); the portable one "
                       "(images/, no site) is printed beside it and labelled as such.")
    add_spec_args(p)
    p.add_argument("--site", default=None, metavar="NAME|FILE",
                   help="the site profile whose build identity is printed (default: local, as `build`)")
    add_json_arg(p, "one step per valid spec")
    p.set_defaults(func=run)


def _missing_docs(loaded) -> list[str]:
    """A doc the spec names that is not there: the docs witness would fail on it, so say so now (a warning,
    not an error: the env still builds)."""
    out = []
    for i, doc in enumerate(loaded.spec.witnesses.docs):
        path = loaded.specs_dir / doc
        if not path.is_file():
            out.append(f"{loaded.path}: witnesses.docs[{i}]: {doc} does not exist (looked for {path}); the docs "
                       "witness fails on it (fix: write it, or drop it from witnesses.docs)")
    return out


def run(args) -> int:
    from envport.core.verdict import StepResult, Verdict, envelope, print_json
    from envport.commands._common import project_root
    from envport.plan.site import load_site
    from envport.recipe.identity import portable, resolve
    from envport.spec.model import requirement_warnings

    loaded_specs, problems = load_each(args)
    # The site is loaded only once a spec is valid: a spec error is reported with or without a site.
    site = load_site(args.site, project_root(args)) if loaded_specs else None
    results = []
    for loaded in loaded_specs:
        # `validate X` then `build X` used to print two hashes for one spec with no word why: the first
        # hash printed is the one `build` will use; the portable one is labelled.
        ident, bare = resolve(loaded, site, "docker").identity, portable(loaded)
        same = "the same as the portable one (images/)" if bare.hash == ident.hash else \
            f"portable, images/: {bare.ref}; `envport show {loaded.spec.name}` says why they differ"
        # Valid, but not reproducible (a git branch ref): said, never an error.
        warnings = [f"{loaded.path}: {where}: {msg}" for where, msg in requirement_warnings(loaded.spec)]
        warnings += _missing_docs(loaded)
        for w in warnings if not args.json else ():
            print(f"WARNING  {w}", file=sys.stderr)
        results.append(StepResult(f"validate {loaded.spec.name}", Verdict.OK,
                                  f"{ident.ref} ({loaded.path}; built on site {site.name}; {same})",
                                  data={"env": loaded.spec.name, "hash": ident.hash, "site": site.name,
                                        "portable_hash": bare.hash, "file": str(loaded.path),
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

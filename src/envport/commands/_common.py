"""Argument helpers shared by the subcommands."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from envport.core.errors import EnvportError

# The loader (pydantic) is imported inside the functions: `envport --help` and
# the fast `present` path of `envport build` must not pay for it.


def project_root(args: argparse.Namespace) -> Path:
    from envport.spec.loader import find_root
    return Path(args.root).resolve() if getattr(args, "root", None) else find_root()


def add_spec_args(parser: argparse.ArgumentParser, allow_all: bool = True) -> None:
    parser.add_argument("specs", nargs="*", metavar="NAME|PATH",
                        help="spec name (specs/<name>.yaml) or path to a spec file")
    if allow_all:
        parser.add_argument("--all", action="store_true", help="every spec in specs/")


def load_selected(args: argparse.Namespace) -> list:
    """Load every selected spec; report every problem of every file, then exit 2."""
    from envport.core.errors import SpecError
    from envport.spec.loader import all_spec_names, load_spec
    root = project_root(args)
    refs = list(args.specs)
    if getattr(args, "all", False):
        refs += [n for n in all_spec_names(root) if n not in refs]
    if not refs:
        raise EnvportError("name at least one spec, or pass --all")
    loaded, problems = [], []
    for ref in refs:
        try:
            loaded.append(load_spec(ref, root if not ref.endswith((".yaml", ".yml")) else None))
        except SpecError as exc:
            problems.extend(exc.problems)
    if problems:
        for p in problems:
            print(p, file=sys.stderr)
        n_files = len({p.file for p in problems})
        raise EnvportError(f"{len(problems)} problem(s) in {n_files} spec file(s); nothing was written")
    return loaded


def load_one(args: argparse.Namespace, ref: str):
    from envport.spec.loader import load_spec
    root = project_root(args) if not ref.endswith((".yaml", ".yml")) else None
    return load_spec(ref, root)

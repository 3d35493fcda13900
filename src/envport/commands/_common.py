"""Argument helpers shared by the subcommands."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import EnvportError, SpecError
from ..loader import Loaded, all_spec_names, find_root, load_spec


def project_root(args: argparse.Namespace) -> Path:
    return Path(args.root).resolve() if getattr(args, "root", None) else find_root()


def add_spec_args(parser: argparse.ArgumentParser, allow_all: bool = True) -> None:
    parser.add_argument("specs", nargs="*", metavar="NAME|PATH",
                        help="spec name (specs/<name>.yaml) or path to a spec file")
    if allow_all:
        parser.add_argument("--all", action="store_true", help="every spec in specs/")


def load_selected(args: argparse.Namespace) -> list[Loaded]:
    """Load every selected spec; report every problem of every file, then exit 2."""
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


def load_one(args: argparse.Namespace, ref: str) -> Loaded:
    root = project_root(args) if not ref.endswith((".yaml", ".yml")) else None
    return load_spec(ref, root)

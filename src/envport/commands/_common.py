"""Argument helpers shared by the subcommands."""

from __future__ import annotations

import argparse
from pathlib import Path

from envport.core.errors import EnvportError

# The loader (pydantic) is imported inside the functions: `envport --help` and
# the fast `present` path of `envport build` must not pay for it.


def project_root(args: argparse.Namespace) -> Path:
    from envport.spec.loader import find_root
    return Path(args.root).resolve() if getattr(args, "root", None) else find_root()


def root_or_here(args: argparse.Namespace) -> Path:
    """The project root, else this folder: where an admin holding only a SIF finds a site profile (or gets the
    local site's defaults) and where a run records."""
    try:
        return project_root(args)
    except EnvportError:
        return Path.cwd()


def add_spec_args(parser: argparse.ArgumentParser, allow_all: bool = True) -> None:
    parser.add_argument("specs", nargs="*", metavar="NAME|PATH",
                        help="spec name (specs/<name>.yaml) or path to a spec file")
    if allow_all:
        parser.add_argument("--all", action="store_true", help="every spec in specs/")


def add_json_arg(parser: argparse.ArgumentParser, what: str = "the result") -> None:
    parser.add_argument("--json", action="store_true",
                        help=f"print {what} as JSON (docs/cli.md: command, exit_code, steps, problems); "
                        "problems are JSON too")


def add_no_lock_arg(parser: argparse.ArgumentParser, what: str) -> None:
    """--no-lock for a command that finds a built env: WHAT the env `envport build --no-lock` made."""
    parser.add_argument("--no-lock", action="store_true",
                        help=f"{what} the env `envport build --no-lock` made (every pip phase resolved at build "
                        "time, not installed from specs/<name>.lock: another env, with another hash)")


def add_embedded_spec_arg(parser: argparse.ArgumentParser, what: str) -> None:
    """--embedded-spec for a command that runs in a --sif FILE: WHAT the SIF with the spec it embeds."""
    parser.add_argument("--embedded-spec", action="store_true",
                        help=f"{what} with the spec the --sif FILE embeds (its build's resolved spec, "
                        "envport-spec.json, used after the trust gate and inspect's checks tie it to the image) "
                        "instead of specs/NAME.yaml; the default with --sif outside a project (no specs/ here "
                        "or above, or -C ROOT without one)")


def embedded_root(args: argparse.Namespace, ref: str) -> Path | None:
    """Where a run with the spec the --sif FILE embeds records and writes (the project, else this folder);
    None when the project's spec NAME is used: --sif in a project, without --embedded-spec."""
    from envport.spec.loader import SPECS_DIR

    asked = getattr(args, "embedded_spec", False)
    if not getattr(args, "sif", None) or ref.endswith((".yaml", ".yml")) or "/" in ref:
        if asked:
            raise EnvportError("--embedded-spec needs --sif FILE and the env's NAME (not a spec path)")
        return None
    root = root_or_here(args)
    return root if asked or not (root / SPECS_DIR).is_dir() else None


def sif_spec(args: argparse.Namespace, ref: str, target, command: str, root: Path | None = None):
    """(loaded, site, identity, what to print about the spec, its data) for a command that runs in a built
    env: the spec the --sif FILE embeds where `embedded_root` says so, else specs/REF.yaml, and then how the
    SIF differs from it when --sif names one built from another version; or a StepResult refusing the run.
    ROOT: where the project's site profiles are (default: the spec's project)."""
    from envport.builders.weights import guard_secrets
    from envport.plan.site import load_site
    from envport.recipe.identity import resolve
    from envport.targets.base import Unsupported

    where = embedded_root(args, ref)
    if where is not None:
        # The site first: its trust policy (trust.require_signed) gates the SIF before its spec is read.
        site = unlocked(load_site(args.site, where), args.no_lock)
        try:
            got = target.embedded(args.sif, ref, where)
        except Unsupported as exc:
            return exc.result(f"{command} {ref}")
        if not hasattr(got, "loaded"):
            return got
        guard_secrets(got.loaded.spec)
        return got.loaded, site, got.identity, got.note, {"spec_source": "embedded", "sif_difference": None}
    loaded = load_one(args, ref)
    site = unlocked(load_site(args.site, root or loaded.root), args.no_lock)
    identity = resolve(loaded, site, target.name).identity
    differs = target.difference(args.sif, loaded, identity.hash) if getattr(args, "sif", None) else None
    note = f"spec: {differs['line']}" if differs else ""
    return loaded, site, identity, note, {"spec_source": "project", "sif_difference": differs}


def lock_gate(no_lock: bool, loaded, site):
    """(site, a REFUSED result or None, what the ledger says about the lock) before anything is built.

    A lock that no longer fits the spec is refused rather than ignored: building the spec's phases
    unlocked would be another env under the same name as the one the lock was reviewed for.
    `no_lock` (--no-lock) turns the lock off: the site then resolves every phase at build time."""
    from envport.core.verdict import StepResult, Verdict
    from envport.plan.lock import load_for, lock_path, problems

    if no_lock:
        return unlocked(site, True), None, "off (--no-lock)"
    lock = load_for(loaded) if site.lock else None
    if lock is None:
        return site, None, "none"
    found = problems(lock, loaded)
    if found:
        return site, StepResult(f"lock {lock_path(loaded).name}", Verdict.REFUSED, found[0].message,
                                reason=found[0].reason), "refused"
    return site, None, lock_path(loaded).name


def unlocked(site, no_lock: bool):
    """The site as `envport build --no-lock` built with it (the same site when not `no_lock`)."""
    return site.model_copy(update={"lock": False}) if no_lock else site


def load_each(args: argparse.Namespace) -> tuple[list, list]:
    """Every selected spec loaded, and every problem of the others (a file that cannot be read
    (permission, a directory, a FIFO, a symlink loop, bad bytes) is one more problem, never the end)."""
    from envport.core.errors import SpecError
    from envport.spec.loader import all_spec_names, load_spec, stray_spec_problems
    root = project_root(args)
    refs = list(args.specs)
    problems = []
    if getattr(args, "all", False):
        refs += [n for n in all_spec_names(root) if n not in refs]
        problems += stray_spec_problems(root)
    if not refs and not problems:
        raise EnvportError("name at least one spec, or pass --all")
    loaded = []
    for ref in refs:
        try:
            loaded.append(load_spec(ref, root if not ref.endswith((".yaml", ".yml")) else None))
        except SpecError as exc:
            problems.extend(exc.problems)
    return loaded, problems


def spec_problems(problems: list):
    """One SpecError for every problem of every selected file: exit 2, nothing written."""
    from envport.core.errors import SpecError
    n_files = len({p.file for p in problems})
    return SpecError(problems, f"{len(problems)} problem(s) in {n_files} spec file(s); nothing was written")


def load_selected(args: argparse.Namespace) -> list:
    """Load every selected spec; on any problem in any file raise one SpecError holding all of them."""
    loaded, problems = load_each(args)
    if problems:
        raise spec_problems(problems)
    return loaded


def load_one(args: argparse.Namespace, ref: str):
    from envport.builders.weights import guard_secrets
    from envport.spec.loader import load_spec
    root = project_root(args) if not ref.endswith((".yaml", ".yml")) else None
    loaded = load_spec(ref, root)
    guard_secrets(loaded.spec)  # its tokens never reach a line envport prints or records (core/secrets)
    return loaded

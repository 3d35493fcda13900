"""The one list of targets. A new backend is one module in this package and one name in NAMES."""

from __future__ import annotations

import importlib
from functools import cache

from envport.targets.base import Target

NAMES = ("docker", "apptainer", "venv", "conda", "podman")


@cache
def get(name: str) -> Target:
    """The target NAME (one of NAMES); a module imports nothing heavy until an operation runs."""
    if name not in NAMES:
        raise KeyError(f"no target {name!r}; targets are {', '.join(NAMES)}")
    return importlib.import_module(f"envport.targets.{name}").TARGET


def every() -> list[Target]:
    return [get(n) for n in NAMES]


def names(*operations: str) -> tuple[str, ...]:
    """The `--target` choices of a command: every target, or those that can do each of OPERATIONS.

    A command that reports `unsupported` with its reason lists every target instead (`choices()`)."""
    return tuple(t.name for t in every() if all(t.supports(op) for op in operations))


def hosted() -> tuple[str, ...]:
    """The targets with a --host option (an env on an SSH host)."""
    return tuple(t.name for t in every() if t.hosts)


def recipe_of(name: str) -> str:
    return get(name).recipe


def ssh_rows() -> dict[str, Target]:
    """The matrix/parity row names of a target on the site's SSH hosts ('ssh': venv), in NAMES order."""
    return {t.ssh_row: t for t in every() if t.ssh_row}


def matrix_rows() -> tuple[str, ...]:
    """The matrix's rows: every target, then each SSH row (docker, apptainer, venv, conda, ssh)."""
    return NAMES + tuple(ssh_rows())


def parity_rows() -> tuple[str, ...]:
    """Parity's rows: each target followed by its SSH row (docker, apptainer, venv, ssh, conda)."""
    return tuple(row for t in every() for row in (t.name, *([t.ssh_row] if t.ssh_row else [])))


def row_target(row: str) -> Target:
    """The target behind a matrix/parity row ('ssh' is venv on a host)."""
    return ssh_rows().get(row) or get(row)


def docs_table() -> str:
    """docs/cli.md's target table, from the targets themselves (a test keeps the doc in step)."""
    rows = ["| target | recipe | what it builds | --host | cannot (why) |", "|---|---|---|---|---|"]
    for t in every():
        cannot = "; ".join(f"{op}: {why}" for op, why in sorted(t.unsupported.items())) or "—"
        ssh = f"yes (matrix/parity row `{t.ssh_row}`)" if t.ssh_row else "yes" if t.hosts else "no"
        rows.append(f"| `{t.name}` | {t.recipe} | {t.summary} | {ssh} | {cannot} |")
    return "\n".join(rows) + "\n"

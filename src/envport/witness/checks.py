"""The witness checks, in the order they run, and their command-line parsing (a light module:
the CLI's --help lists them)."""

from __future__ import annotations

# The names live in core/ (a site validates them before any witness module loads); the CLI imports them here.
from envport.core.witness_checks import CHECKS


def parse_checks(values: list[str], flag: str) -> list[str]:
    """`--only a,b --only c` -> ['a', 'b', 'c']; an unknown name is a usage error naming the flag."""
    from envport.core.errors import EnvportError

    wanted = [c.strip() for item in values for c in item.split(",") if c.strip()]
    bad = [c for c in wanted if c not in CHECKS]
    if bad:
        raise EnvportError(f"{flag} {', '.join(bad)}: unknown check; choose from {', '.join(CHECKS)}")
    return wanted


def check_world_size(world_size: int | None) -> None:
    from envport.core.errors import EnvportError

    if world_size is not None and world_size < 1:
        raise EnvportError("--world-size must be >= 1")

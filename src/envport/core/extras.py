"""envport's optional extras: the one-line REFUSED `missing_extra` when a command needs a package of one.

A base `pip install envport` renders, validates and builds venvs; verifying (pytest, testinfra), the
docker SDK, SBOMs and registries come with the `build` extra. Without this check the first such import
was a `ModuleNotFoundError` traceback, and `envport up` died half-way through its table. The pip
command names this interpreter, so the extra lands in the envport that refused, not in another venv.
"""

from __future__ import annotations

import importlib.util
import shlex
import sys

from envport.core.verdict import StepResult, Verdict

BUILD = "build"
# What `verify` (and `up`'s verify step) import on every target: testinfra drives its assertions as pytest items.
VERIFY_MODULES = ("pytest", "testinfra")


def install_command(extra: str = BUILD) -> str:
    return f"{shlex.quote(sys.executable)} -m pip install 'envport[{extra}]'"


def absent(modules: tuple[str, ...]) -> list[str]:
    """The modules of MODULES this interpreter cannot import (found without importing them)."""
    return [m for m in modules if importlib.util.find_spec(m) is None]


def refusal(step: str, modules: tuple[str, ...], extra: str = BUILD) -> StepResult | None:
    """REFUSED `missing_extra` naming the absent packages and the pip command, or None when all are here."""
    gone = absent(modules)
    if not gone:
        return None
    names = ", ".join(repr(m) for m in gone)
    return StepResult(step, Verdict.REFUSED, f"the Python package(s) {names} are not installed (envport was "
                      f"installed without its `{extra}` extra); install it: {install_command(extra)}",
                      reason="missing_extra")

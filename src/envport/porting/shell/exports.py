"""`export NAME=value`: the spec's env where it lasts past the build, else a run command with why."""

from __future__ import annotations

import posixpath
from typing import Optional

from envport.porting.report import KEPT, turned_into
from envport.porting.shell.context import Outcome, ShellContext


def export_family(words, seg, line, ctx) -> Optional[Outcome]:
    return _export(words, seg, line, ctx) if posixpath.basename(words[0]) == "export" else None


def _export(words, seg, line, ctx: ShellContext) -> Outcome:
    from envport.porting.envvars import add_env

    pairs = [w.partition("=") for w in words[1:] if "=" in w]
    if not pairs or len(pairs) != len(words) - 1:
        return Outcome.KEEP
    if all(k == "DEBIAN_FRONTEND" for k, _, _ in pairs):
        return Outcome.DONE  # envport's apt step sets it itself
    if ctx.mode == "def":
        if all(ctx.runtime_env.get(k) == v for k, _, v in pairs):
            return Outcome.DONE  # the same value %environment sets at run time: the spec's env has it
        ctx.note(line, seg, KEPT, "an export in %post lasts only for the build, and %environment does not set it",
                 "if the env needs it at run time, add it to `env`")
        return Outcome.KEEP
    if ctx.mode == "docker":
        return Outcome.EXPORT
    if any("`" in v or "$(" in v for _, _, v in pairs):
        ctx.note(line, seg, KEPT, "a command substitution (`…` or $(…)): the spec's env values are literal text, "
                 "so the export stays a run command and lasts only while it runs",
                 "write the value out in `env` if the env needs it at run time")
        return Outcome.KEEP
    for k, _, v in pairs:
        before = dict(ctx.draft.env)
        add_env(ctx.draft, k, v, line, ctx.file, construct=f"export {k}={v}")
        if ctx.draft.env != before:
            ctx.variables[k] = v
            ctx.draft.note(line, f"export {k}={v}", turned_into(f"env.{k}"), "a script's export; the spec's env "
                           "is also set when the env runs, not only while it is built", file=ctx.file)
    return Outcome.DONE

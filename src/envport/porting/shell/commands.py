"""Shell commands (Dockerfile RUN, `.def` %post, install scripts) -> spec fields, words read as bash reads them.

A command line is split at its top-level `&&` and `;` (shell/line.py); each
simple command then goes to the family that recognises it: a package install
that maps onto a field (shell/packages.py: apt -> system_pkgs; shell/python.py:
pip -> one phase per call, `python3.X -m venv` -> python), cleanup envport's
renderers do themselves (shell/housekeeping.py: dropped), an export
(shell/exports.py), a weights download (shell/weights.py), or a run command,
kept in order with its source line (consecutive ones from one line stay joined
with `&&`).  A line with `||`, `&`, a here-document or an `if`/`for`/`while` is
kept whole: it cannot be split without changing what it does.  Kept text is
then looked at for what a user must hear about (shell/kept.py: downloads,
branch clones, patched packages, bash-only syntax under /bin/sh).
"""

from __future__ import annotations

import posixpath
import re
import shlex
from typing import Optional

from envport.porting.report import DROPPED, KEPT
from envport.porting.shell.context import Outcome, ShellContext
from envport.porting.shell.exports import export_family
from envport.porting.shell.housekeeping import housekeeping_family, rendered_noise
from envport.porting.shell.kept import keep
from envport.porting.shell.line import split_top
from envport.porting.shell.packages import packages_family
from envport.porting.shell.python import python_family
from envport.porting.shell.weights import UNPACK, suggest_weights, weights_family
from envport.porting.words import COMPUTED, strip_comments
from envport.porting.words import split as split_words

# One handler per command family: (words, seg, line, ctx) -> an Outcome, or None when it is not theirs.
HANDLERS = (packages_family, housekeeping_family, python_family, export_family, weights_family)


def handle(text: str, line: Optional[int], ctx: ShellContext) -> None:
    """Map one command line (a RUN's value, a %post or script line) onto the draft."""
    if ctx.rendered and ctx.rendered_step == "run":
        try:
            noise = rendered_noise(shlex.split(text), "run", ctx)
        except ValueError:
            noise = False
        if not noise:
            ctx.draft.add_run(text, line, ctx.file)
        return
    text = strip_comments(text)  # a `#` comment is no command: its `;` and words are not split or read
    segments, whole = split_top(text)
    if whole:
        keep(text.strip(), line, ctx, whole_because=whole)
        return
    pending: list[str] = []
    exports: list[str] = []
    fetched = False  # the previous segment downloaded weights: what unpacks them belongs to its `source`
    for seg in segments:
        first = posixpath.basename(seg.split(None, 1)[0]) if seg.split() else ""
        if fetched and first in UNPACK:
            _, entry = ctx.draft.suggested_weights.pop()
            suggest_weights(f"{entry['source']} && {seg}", ctx)
            ctx.note(line, seg, DROPPED, "unpacks or tidies the weights downloaded before it in this line",
                     "it is part of that download's `source` in its weight_dirs entry")
            continue
        before = len(ctx.draft.suggested_weights)
        outcome = _classify(seg, line, ctx)
        fetched = len(ctx.draft.suggested_weights) > before
        if outcome is Outcome.KEEP:
            pending.append(seg)
        elif outcome is Outcome.EXPORT:
            exports.append(seg)
            pending.append(seg)
        else:
            _flush(pending, line, ctx)
            pending = []
    if exports and ctx.mode == "docker":
        tail = pending and pending[-1] in exports and all(p in exports for p in pending)
        for e in exports:
            ctx.note(line, f"RUN {e}", DROPPED if tail else KEPT,
                     "an export in a RUN line has no effect in later layers (each RUN is a new shell)",
                     "if the env needs it at run time, add it to `env`")
        if tail:
            pending = []
    _flush(pending, line, ctx)


def _flush(pending: list[str], line: Optional[int], ctx: ShellContext) -> None:
    if pending:
        keep(" && ".join(pending), line, ctx)


def _classify(seg: str, line: Optional[int], ctx: ShellContext) -> Outcome:
    try:
        words = split_words(seg)
    except ValueError:
        ctx.note(line, seg, KEPT, "unbalanced quotes: shlex cannot split it into words")
        return Outcome.KEEP
    words = _command_words(_strip_prefix(words, line, ctx), ctx)
    if not words:
        return Outcome.DONE
    if ctx.rendered and rendered_noise(words, ctx.rendered_step, ctx):
        return Outcome.DONE
    for handler in HANDLERS:
        outcome = handler(words, seg, line, ctx)
        if outcome is not None:
            return outcome
    if posixpath.basename(words[0]) == "cd" and len(words) == 2 and words[1].startswith("/"):
        ctx.cwd = words[1]
    return Outcome.KEEP


def _strip_prefix(words: list[str], line, ctx: ShellContext) -> list[str]:
    while words:
        if re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]) and len(words) > 1:
            if not words[0].startswith("DEBIAN_FRONTEND="):
                ctx.variables = dict(ctx.variables)
            words = words[1:]
        elif words[0] in ("sudo", "command", "exec", "nice", "time"):
            words = words[1:]
            while words and words[0].startswith("-") and words[0] != "-":
                words = words[1:]
        else:
            break
    return words


def _command_words(words: list[str], ctx: ShellContext) -> list[str]:
    """`python${PYTHON_VERSION} -m venv`: the command name with the build args' defaults substituted."""
    if words and "$" in words[0] and not COMPUTED.search(words[0]):
        from envport.porting.envvars import substitute

        sub, missing = substitute(words[0], ctx.variables)
        if sub is not None and not missing:
            return [sub, *words[1:]]
    return words

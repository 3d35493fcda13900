"""A run command kept as written, with what the user must hear about it: downloads, branch clones,
patched packages, pip uninstalls, bash-only syntax under /bin/sh, installs inside a line kept whole."""

from __future__ import annotations

import re
import shlex
from typing import Optional

from envport.porting.report import KEPT, turned_into
from envport.porting.shell.context import ShellContext
from envport.porting.shell.weights import suggest_weights, weighty

BASH_ONLY = [
    (re.compile(r"\[\[\s"), "`[[ … ]]`"),
    (re.compile(r"(^|[;&|(\s])source\s"), "`source` (sh has `.`)"),
    (re.compile(r"[<>]\("), "process substitution `<(…)`"),
    (re.compile(r"&>"), "`&>` redirection"),
    (re.compile(r"\$'"), "`$'…'` quoting"),
    (re.compile(r"(^|[;&|\s])function\s"), "`function` definitions"),
    (re.compile(r"(^|\s)\w+=\("), "arrays"),
    (re.compile(r"(^|[;&|\s])(pushd|popd|shopt|declare|typeset)\s"), "bash builtins (pushd/shopt/declare)"),
    (re.compile(r"(?<![$\\])\{[^{}\s,$]*,[^{}\s$]*\}"), "brace expansion `{a,b}`"),
]
# `sed … -i …` then an installed package's path: two linear scans (one regex with both, `[^|;&]*\s-i\b.*(…)`,
# backtracked quadratically: 60 KB of ` -i` took 16 s).
SED_INPLACE = re.compile(r"\bsed\b[^|;&]*")
SITE_PATH = re.compile(r"site-packages|dist-packages|/venv/|/lib/python\d|/opt/conda")
GIT_CLONE = re.compile(r"\bgit\s+clone\b")
GIT_PINNED = re.compile(r"\b(checkout|reset\s+--hard|switch\s+--detach|fetch\s+\S+)\s+[0-9a-f]{40}\b")
DOWNLOAD = re.compile(r"(^|[;&|(\s])(wget|curl)\s")


def patches_installed(text: str) -> bool:
    """An in-place `sed -i` with an installed package's path after its `-i`."""
    last = max((m.start() for m in SITE_PATH.finditer(text)), default=-1)
    for sed in SED_INPLACE.finditer(text):
        flag = re.search(r"\s-i\b", sed.group())
        if flag and last >= sed.start() + flag.end():
            return True
    return False


def keep(text: str, line: Optional[int], ctx: ShellContext, whole_because: str = "") -> None:
    """A run command, with what the user must hear about it."""
    if not text:
        return
    if DOWNLOAD.search(text) or re.search(r"\b(huggingface-cli|hf)\s+download\b", text):
        if weighty(text):
            ctx.note(line, text, KEPT, "downloads model weights during the build (the image would carry them)",
                     "move it to a weight_dirs entry's `source` and fetch at run time (see weight_dirs in "
                     "the spec)")
            suggest_weights(text, ctx)
        else:
            ctx.note(line, text, KEPT, "downloads during the build: what it fetches can change under the same spec",
                     "check a sha256 after the download")
    if GIT_CLONE.search(text) and not GIT_PINNED.search(text):
        m = re.search(r"(-b|--branch)[ =](\S+)", text)
        ref = f"branch {m.group(2)!r}" if m else "the default branch"
        ctx.note(line, text, KEPT, f"clones {ref}: the build changes when it moves",
                 "check out a full commit sha, or install it as `name @ git+https://…@<sha>`")
    if patches_installed(text):
        ctx.note(line, text, KEPT, "patches an installed package in place; a later phase that reinstalls it "
                 "undoes the patch", "keep it after the last pip phase that touches that package, or ship a "
                 "fixed wheel")
    if re.search(r"\b(pip3?|-m pip)\s+uninstall\b", text):
        ctx.note(line, text, KEPT, "pip uninstall: envport's phases only install, and this runs after all of them",
                 "prefer not installing it: no_deps on the phase that pulls it in")
    bashisms = [what for rx, what in BASH_ONLY if rx.search(text)]
    if bashisms and ctx.shell_is_bash:
        ctx.note(line, text, turned_into("`bash -c …` in run_commands"),
                 f"uses {bashisms[0]}, which this recipe ran under bash; envport runs run_commands with /bin/sh "
                 "in Docker and Apptainer", "rewrite it for POSIX sh, or keep the bash -c wrapper")
        text = "bash -c " + shlex.quote(text)
    elif bashisms:
        ctx.note(line, text, KEPT, f"uses {bashisms[0]}, which /bin/sh (dash on Debian) does not understand",
                 "rewrite it for POSIX sh, or wrap it: bash -c '…'")
    if whole_because and not (ctx.rendered and ctx.rendered_step == "run"):
        if _installs(text):
            ctx.note(line, text, KEPT, f"a package install inside {whole_because}: envport keeps the line whole "
                     "(splitting it would change what it does), so it is not a pip phase",
                     "move the install out into its own line")
    ctx.draft.add_run(text, line, ctx.file)


def _installs(text: str) -> bool:
    return bool(re.search(r"\b(pip3?(\.\d+)?|-m pip|apt-get|apt|conda|mamba|yum|apk)\s+(install|add)\b", text))

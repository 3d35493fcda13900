"""What envport's renderers do themselves: cache cleanup, shell options, bytecode compiles, and the lines
envport's own recipes write around each step (read back from a rendered recipe)."""

from __future__ import annotations

import posixpath
import re
from typing import Optional

from envport.porting.report import DROPPED
from envport.porting.shell.context import Outcome, ShellContext
from envport.porting.shell.python import PYTHON_CMD
from envport.renderers.bytecode import COMPILE_SITE_PACKAGES

CLEANUP = re.compile(r"^(/var/lib/apt/lists(/\*)?|/var/cache/apt(/\*)?|/var/cache/apt/archives(/\*)?|"
                     r"(/root|~|\$HOME)/\.cache/pip(/\*)?|/tmp/envport-wheelhouse|/var/cache/(yum|dnf|apk)(/\*)?)/?$")


def housekeeping_family(words, seg, line, ctx) -> Optional[Outcome]:
    """Cleanup and shell options envport's renderers do themselves."""
    cmd = posixpath.basename(words[0])
    if cmd == "rm" and len(words) > 1 and all(w.startswith("-") or CLEANUP.match(w) for w in words[1:]):
        return Outcome.DONE
    if cmd == "set" and all(w.startswith(("-", "+")) or w in ("pipefail", "errexit", "nounset", "xtrace")
                            for w in words[1:]):
        return Outcome.DONE
    if _compiles_bytecode(words):
        if not ctx.rendered:  # envport's own recipes compile after each pip phase: nothing to say
            ctx.note(line, seg, DROPPED, "compiles bytecode: envport compiles it after each pip phase "
                     "(or leaves it to the first import, as the site's `bytecode` says)")
        return Outcome.DONE
    return None


def _compiles_bytecode(words: list[str]) -> bool:
    """`python -m compileall ...`, a `python -c` program that calls compileall, or envport's own step."""
    if not PYTHON_CMD.match(posixpath.basename(words[0])) or len(words) < 3:
        return False
    return words[1:3] == ["-m", "compileall"] or (words[1] == "-c" and ("compileall.compile_" in words[2]
                                                                        or words[2] == COMPILE_SITE_PACKAGES))


def rendered_noise(words: list[str], step: Optional[str], ctx: ShellContext) -> bool:
    """Lines envport's own renderers write around each step: nothing the spec holds."""
    if words[0] == "echo" and len(words) == 2 and words[1].startswith("envport: step "):
        return True
    if words[0] == ":" and words[1:3] == ["base", "image"]:
        return True
    if step == "files" and words[0] == "chmod":
        return True
    if step == "weights" and words[:2] == ["mkdir", "-p"]:
        for path in words[2:]:
            name = re.sub(r"[^a-z0-9-]+", "-", posixpath.basename(path).lower()).strip("-") or "weights"
            while name in ctx.draft.weight_dirs:
                name += "-2"
            ctx.draft.weight_dirs[name] = {"path": path}
        return True
    return False

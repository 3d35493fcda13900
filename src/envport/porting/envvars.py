"""Environment variables from a recipe (ENV, %environment, a script's export) -> the spec's `env`.

The spec's env values are literal on every target (the renderers escape `$`),
so a value that refers to another variable (`$PATH`, `${CUDA_HOME}/lib64`)
is kept as written and flagged: at run time it would hold the `$` itself.
Names the spec refuses (a shell's own, envport's own, ones that break the
build) are dropped and reported with the spec's reason.
"""

from __future__ import annotations

import re
from typing import Optional

from envport.porting.report import DROPPED, REPORTED, Draft

CONTAINER_VENV = "/opt/envport/venv"
REF = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)")
VAR = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?")
# The longest text a `$VAR` substitution may make.  Each ENV may refer to earlier ones, so the
# length can triple per line (an 864-byte Dockerfile grew one value to 1.3 GB); real values
# (PATH-like lists) are a few hundred characters.
MAX_EXPANDED = 8192


def substitute(text: str, variables: dict[str, str], limit: int = MAX_EXPANDED) -> tuple[Optional[str], list[str]]:
    """TEXT with each $VAR / ${VAR} known in VARIABLES replaced, and the names not known (left as written).

    None instead of the text when it would be longer than LIMIT characters: counted before it is built."""
    out, missing, size, last = [], [], 0, 0
    for m in VAR.finditer(text):
        name = m.group(1)
        value = variables[name] if name in variables else m.group(0)
        if name not in variables:
            missing.append(name)
        size += (m.start() - last) + len(value)
        if size > limit:
            return None, missing
        out += [text[last:m.start()], value]
        last = m.end()
    if size + len(text) - last > limit:
        return None, missing
    out.append(text[last:])
    return "".join(out), missing


def too_long(done: str) -> tuple[str, str]:
    """The (why, fix) of a note for a substitution past MAX_EXPANDED; DONE: what envport did instead."""
    return (f"substituting its variables would make more than {MAX_EXPANDED} characters (references that "
            f"multiply, line after line); {done}", "write the value out in full")


def env_value_ok(key: str, value: str) -> str:
    """Why the spec cannot hold KEY=VALUE, or "" when it can."""
    from envport.spec import model

    try:
        model._env_key(key) if model._env_key.__code__.co_argcount == 1 else model._env_key(key, _NoInfo())
    except ValueError as exc:
        return f"the spec refuses it: {exc}"
    if model.CONTROL_RE.search(value):
        return "the value holds a newline or control character, which no recipe line can carry"
    return ""


class _NoInfo:
    data: dict = {}


# Entries of a search path that every target's own env already gives: the shell's own value, the system
# dirs, a venv's or conda's bin/ (envport's venv takes their place), the CUDA base image's libraries.
PROVIDED = re.compile(r"^(\$\{?(PATH|LD_LIBRARY_PATH|PYTHONPATH)\}?|/usr/local/s?bin|/usr/s?bin|/s?bin|"
                      r"/usr/local/cuda(-[\d.]+)?/(bin|lib64)|/usr/local/nvidia/lib(64)?|.*/(venv|\.venv|env)/bin|"
                      r"/opt/(conda|miniconda3?|mambaforge|micromamba)(/envs/[^/]+)?/(bin|lib))/?$")
SEARCH_FIX = {
    "PATH": "for each tool, a shim_files wrapper on the env's PATH (e.g. /usr/local/bin/TOOL: `#!/bin/sh` + "
            "`exec DIR/TOOL \"$@\"`), or an env entry such as TOOL_HOME=DIR that the tool reads",
    "LD_LIBRARY_PATH": "a shim file /etc/ld.so.conf.d/NAME.conf listing the directories, then `ldconfig` in "
                       "run_commands",
    "PYTHONPATH": "install the directory's code as a package (a pip phase, `name @ git+URL@SHA`), or a shim file "
                  "NAME.pth in the venv's site-packages naming the directory",
}


def explain_search_path(key: str, value: str) -> Optional[tuple[str, str]]:
    """(why, fix) for PATH, LD_LIBRARY_PATH, PYTHONPATH, VIRTUAL_ENV: which part the target's own env already
    provides and which part the env would lose; None for other names (and envport's own venv activation)."""
    if key == "VIRTUAL_ENV" and value != CONTAINER_VENV:
        return (f"envport's env is its own venv ({CONTAINER_VENV}), active on every target; {value} would point "
                "tools at another env", "nothing to do: paths under it now live under " + CONTAINER_VENV)
    if key not in SEARCH_FIX or (key == "PATH" and value.startswith(CONTAINER_VENV + "/bin:")):
        return None
    parts = [p for p in value.split(":") if p]
    given = [p for p in parts if PROVIDED.match(p)]
    lost = [p for p in parts if not PROVIDED.match(p)]
    why = f"the spec refuses {key} (it replaces what the build and the env rely on)"
    if given:
        why += f"; the target's own env already provides {', '.join(given)}"
    if not lost:
        return why + ": the env loses nothing", "nothing to do"
    return why + f"; the env loses {', '.join(lost)}", SEARCH_FIX[key]


def add_env(draft: Draft, key: str, value: str, line: Optional[int], file: Optional[str] = None,
            rendered: bool = False, construct: str = "", shell: bool = False) -> None:
    """SHELL: the value was read from shell text (%environment, a script's export), where `…` and $(…)
    run a command; a Dockerfile ENV is not shell, and there they are plain characters."""
    construct = construct or f"{key}={value}"
    if shell and ("`" in value or "$(" in value):
        draft.note(line, construct, DROPPED, "a command substitution (`…` or $(…)) runs a command each time the "
                   "env starts; the spec's env values are literal text, so the value is unknown here",
                   "write the value it gives out in full, or compute it in a shim script", file=file)
        return
    if key == "VIRTUAL_ENV" and value == CONTAINER_VENV or key == "PATH" and value.startswith(CONTAINER_VENV + "/bin:"):
        if not rendered:
            draft.note(line, construct, DROPPED, "envport's own venv activation; every target sets it", file=file)
        return
    if key.startswith("ENVPORT_") and rendered:
        return  # envport's identity: the new spec gets its own
    explained = explain_search_path(key, value)
    if explained:
        draft.note(line, construct, DROPPED, *explained, file=file)
        return
    why = env_value_ok(key, value)
    if why:
        draft.note(line, construct, DROPPED, why, "set it inside a run command or a shim script that needs it",
                   file=file)
        return
    refs = REF.findall(value)
    if refs:
        draft.note(line, construct, REPORTED, f"refers to ${refs[0]}: the spec writes env values literally, so the "
                   f"env would hold the text ${refs[0]}", "write the value out in full", file=file)
    draft.env[key] = value

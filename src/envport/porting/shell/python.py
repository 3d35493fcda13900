"""Python installers: pip in every spelling (-> a pip phase), venv/virtualenv (-> python), conda,
lockfile installers, venv activation, and the build args that name the python version."""

from __future__ import annotations

import posixpath
import re
from typing import Optional

from envport.porting.pip_args import install_phase
from envport.porting.report import DROPPED, KEPT, REPORTED, turned_into
from envport.porting.shell.context import Outcome, ShellContext
from envport.porting.words import COMPUTED

CONTAINER_VENV = "/opt/envport/venv"
CONDA = {"conda", "mamba", "micromamba"}
LOCKFILE = {("uv", "sync"), ("poetry", "install"), ("pipenv", "install"), ("pipenv", "sync"), ("pdm", "install"),
            ("pdm", "sync"), ("conda-lock", "install"), ("conda-lock", ""), ("pip-sync", ""), ("hatch", "env")}
PYTHON_CMD = re.compile(r"^python(3(\.\d{1,2})?)?$")
PIP_CMD = re.compile(r"^pip(3(\.\d{1,2})?)?$")
# Build args and env names recipes use for the interpreter's version (`ARG PYTHON_VERSION=3.10`).
PYTHON_VARIABLE = re.compile(r"^(PYTHON|PY|PYTHON_VER|PYTHON_VERSION|PY_VERSION|PYVER)$")


def python_variable(key: str, value: str, construct: str, line: Optional[int], ctx: ShellContext) -> None:
    """A variable that names the python version: the spec's python, with the line it came from."""
    m = re.match(r"^(3\.\d{1,2})(\.\d+)?$", value or "")
    if PYTHON_VARIABLE.match(key) and m:
        ctx.draft.set_python(m.group(1), f"`{construct}`", line, ctx.file)


def python_family(words, seg, line, ctx) -> Optional[Outcome]:
    """pip (every spelling), venv/virtualenv, conda, lockfile installers, venv activation."""
    pip = _pip_words(words, line, ctx)
    if pip is not None:
        return _pip(pip, words, seg, line, ctx)
    if _venv(words, seg, line, ctx):
        return Outcome.DONE
    cmd = posixpath.basename(words[0])
    if cmd in CONDA:
        return _conda(words, seg, line, ctx)
    sub = words[1] if len(words) > 1 else ""
    if (cmd, sub) in LOCKFILE or (cmd, "") in LOCKFILE or (cmd == "uv" and words[1:3] == ["pip", "sync"]):
        ctx.note(line, seg, KEPT, "installs from a lockfile, which envport cannot read into pip phases",
                 "export the lock to pinned requirements (`uv export`, `poetry export`) and import those")
        return Outcome.KEEP
    if cmd in ("source", ".") and len(words) > 1 and re.search(r"activate$", words[1]):
        ctx.note(line, seg, DROPPED, "envport's venv is active in every step", "")
        return Outcome.DONE
    return None


def _pip_words(words: list[str], line, ctx: ShellContext) -> Optional[list[str]]:
    """The words after `pip` when WORDS runs pip (pip, pip3.X, pythonX -m pip, uv pip), else None."""
    cmd = posixpath.basename(words[0])
    if PIP_CMD.match(cmd):
        m = re.match(r"^pip(3\.\d+)$", cmd)
        if m:
            ctx.draft.set_python(m.group(1), f"`{cmd}`", line, ctx.file)
        return words[1:]
    if PYTHON_CMD.match(cmd) and words[1:3] == ["-m", "pip"]:
        if re.match(r"^python3\.\d+$", cmd):
            ctx.draft.set_python(cmd[6:], f"`{cmd} -m pip`", line, ctx.file)
        return words[3:]
    if cmd == "uv" and words[1:2] == ["pip"] and words[2:3] != ["sync"]:
        return words[2:]
    return None


def _pip(rest: list[str], words, seg, line, ctx: ShellContext) -> Outcome:
    opts = []
    while rest and rest[0].startswith("-"):
        opts.append(rest[0])
        rest = rest[1:]
    sub = rest[0] if rest else ""
    if sub == "install" and any(COMPUTED.search(w) for w in rest):
        ctx.note(line, seg, KEPT, "a requirement computed when the line runs (`$(…)`, a backtick): its value is "
                 "unknown here, so the pip call stays a run command", "write the requirements into pip_phases")
        return Outcome.KEEP
    if sub == "install":
        if posixpath.basename(words[0]) == "uv":
            ctx.note(line, seg, turned_into("a pip phase"), "uv's resolver may choose other versions than pip's "
                     "for unpinned requirements", "pin them")
        args = opts + rest[1:]
        if ctx.rendered and "--require-hashes" in args:
            args = _locked_phase(args, line, ctx)
        phase = install_phase(args, ctx.pip(line))
        if phase:
            ctx.draft.add_phase(phase)
        return Outcome.DONE
    if sub == "cache":
        return Outcome.DONE
    return Outcome.KEEP


def _locked_phase(args: list[str], line, ctx: ShellContext) -> list[str]:
    """A phase envport rendered from its lock: the spec's requirements are in the step title."""
    title = ctx.rendered_title.split(": ", 1)[-1]
    if title.endswith(" ...") or ": " not in ctx.rendered_title:
        ctx.note(line, "pip install --require-hashes -r …", REPORTED, "a phase envport installed from its lock, "
                 "with more requirements than its step comment names: the phase holds the lock's pins",
                 "replace them with the phase's own requirements, then `envport lock NAME`")
        return args
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a in ("-r", "--requirement"):
            skip = True
        elif a not in ("--require-hashes", "--no-deps"):
            out.append(a)
    ctx.note(line, f"pip phase: {title}", REPORTED, "installed from envport's lock (--no-deps --require-hashes); "
             "the requirements come from the step comment, and the lock's no_deps/pre are not in the recipe",
             "`envport lock NAME` writes specs/NAME.lock again")
    return out + title.split(", ")


def _venv(words, seg, line, ctx: ShellContext) -> bool:
    cmd = posixpath.basename(words[0])
    path = None
    if PYTHON_CMD.match(cmd) and words[1:3] == ["-m", "venv"]:
        path = next((w for w in words[3:] if not w.startswith("-")), None)
        if re.match(r"^python3\.\d+$", cmd):
            ctx.draft.set_python(cmd[6:], f"`{cmd} -m venv`", line, ctx.file)
    elif cmd == "virtualenv" or (PYTHON_CMD.match(cmd) and words[1:3] == ["-m", "virtualenv"]):
        args = words[1:] if cmd == "virtualenv" else words[3:]
        py = next((a.split("=", 1)[-1] for a in args if a.startswith(("-p", "--python"))), "")
        m = re.search(r"3\.\d+", py + " " + " ".join(args))
        if m:
            ctx.draft.set_python(m.group(0), f"`{seg}`", line, ctx.file)
        path = next((a for a in args if not a.startswith("-") and not re.match(r"^python", a)), None)
    else:
        return False
    if path != CONTAINER_VENV:
        ctx.note(line, seg, DROPPED, f"envport makes the env's venv itself at {CONTAINER_VENV} and every pip "
                 "phase installs there", f"paths that named {path} now live under {CONTAINER_VENV}")
    return True


def _conda(words, seg, line, ctx: ShellContext) -> Outcome:
    from envport.porting.conda import conda_packages

    sub = words[1] if len(words) > 1 else ""
    if sub == "env" and len(words) > 2 and words[2] in ("create", "update"):
        spec = next((words[i + 1] for i, w in enumerate(words) if w in ("-f", "--file") and i + 1 < len(words)), "")
        found = ctx.open_file(spec) if spec else None
        if found:
            from envport.porting.conda import read_environment
            ctx.note(line, seg, turned_into("fields"), f"read {found[1]} (conda itself is not run: see its lines)")
            read_environment(found[0], found[1], ctx.draft, ctx.open_file)
        else:
            ctx.draft.lose(line, seg, "a conda environment file that is not a file inside the build context "
                           "(missing, or outside it through `..` or a link)", "import the environment.yml itself",
                           file=ctx.file)
        return Outcome.DONE
    if sub in ("create", "install"):
        pkgs, skip = [], False
        for w in words[2:]:
            if skip:
                skip = False
            elif w in ("-n", "--name", "-p", "--prefix", "-c", "--channel", "--file"):
                skip = True
            elif not w.startswith("-"):
                pkgs.append(w)
        if sub == "install" and ctx.draft.phases:
            ctx.note(line, seg, REPORTED, "a conda install after pip phases: conda may replace what pip installed, "
                     "so the order changes what is installed", "install conda packages before any pip call")
        conda_packages(pkgs, ctx.draft, ctx.file, line)
        return Outcome.DONE
    if sub in ("activate", "deactivate", "init", "clean", "config"):
        ctx.note(line, seg, DROPPED, "envport has no conda in containers; its venv is active in every step")
        return Outcome.DONE
    ctx.note(line, seg, KEPT, "a conda command envport cannot map")
    return Outcome.KEEP

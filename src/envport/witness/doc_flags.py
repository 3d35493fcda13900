"""Which `--long-option`s a doc's command gives which program, and whether that program's `--help` offers them.

Pure: a command line in, (program, flags) uses out; a help text in, its flags out.  The help itself
runs inside the env (witness/scripts/docs.py), so `"$ENVPORT_ROOT/opt/app/run.py" --help` expands there:
each program is kept as the shell words the doc wrote, quotes and `$VARS` included.

A program is `PROG` (`pip`), `python -m MOD`, or `python SCRIPT`; its subcommand is the first word after
it when that word looks like a name (`pip show`).  A flag passes when PROG's or PROG SUB's help lists it.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Iterable, Optional

_OPERATORS = ("&&", "||", ";;", "|&", "|", "&", ";", "(", ")")
_REDIRECT = re.compile(r"^\d*(>>|>&|<&|>|<)$|^&>>?$")
_ATTACHED = re.compile(r"^(\d*(>>|>&|<&|>|<)|&>>?)\S")
_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_SUBCOMMAND = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]*$")
_PYTHON = re.compile(r"^(.*/)?python(\d+(\.\d+)?)?$")
# Words that run the command after them; their own options are not the doc's point.
_WRAPPERS = {"env", "exec", "command", "time", "nohup", "sudo", "xargs"}
# Shell builtins: no --help of their own to check against.
_BUILTINS = {"cd", "echo", "export", "printf", "test", "[", "true", "false", "set", "unset", "source", ".", "read",
             "eval", "wait", "shift", "exit", "return", "trap", "umask", "alias", "type", "ulimit", "pushd", "popd"}
HELP_FLAG = re.compile(r"(?<![\w-])--[A-Za-z0-9][A-Za-z0-9_-]*")


@dataclass(frozen=True)
class Word:
    raw: str  # as written, quotes included: what a shell gets back when the word is re-joined
    value: str  # after quote removal, without expansion


@dataclass(frozen=True)
class Use:
    """One program a command runs and the long options it passes it."""

    program: tuple[str, ...]  # raw words: ("pip",), ("python", "-m", "pip"), ("python", '"$X/run.py"')
    sub: Optional[str]  # the raw subcommand word, or None
    flags: tuple[str, ...]

    @property
    def name(self) -> str:
        return " ".join(self.program)

    def help_lines(self) -> list[str]:
        """The shell lines that print its help: the program's, then the subcommand's."""
        out = [f"{self.name} --help"]
        if self.sub is not None:
            out.append(f"{self.name} {self.sub} --help")
        return out


def words(line: str) -> list[Word]:
    """Shell words and operators (as Words whose value is the operator) of LINE, quotes kept in `raw`."""
    out: list[Word] = []
    i, n = 0, len(line)
    while i < n:
        c = line[i]
        if c.isspace() or (c == "\\" and line[i + 1:i + 2] == "\n"):
            i += 1 if c.isspace() else 2
            continue
        if c == "#":
            break
        op = None if line.startswith("&>", i) else next((o for o in _OPERATORS if line.startswith(o, i)), None)
        if op is not None:
            out.append(Word(op, op))
            i += len(op)
            continue
        i = max(_word(line, i, out), i + 1)  # a word is at least one character: never stuck
    return out


def _word(line: str, i: int, out: list[Word]) -> int:
    """Read one word starting at I into OUT; the index after it."""
    start, value, n = i, [], len(line)
    depth = 0  # inside $( ... ): operators and blanks belong to the word
    while i < n:
        c = line[i]
        # `2>&1`: the & belongs to the redirection, not a background job.
        glued = c == "&" and (i == start or line[i - 1] in "<>")
        if depth == 0 and not glued and (c.isspace() or any(line.startswith(o, i) for o in _OPERATORS)):
            break
        if c == "'":
            end = line.find("'", i + 1)
            end = n if end < 0 else end
            value.append(line[i + 1:end])
            i = end + 1
            continue
        if c == '"':
            i = _double_quoted(line, i + 1, value)
            continue
        if c == "\\" and i + 1 < n:
            value.append(line[i + 1])
            i += 2
            continue
        if line.startswith("$(", i):
            depth += 1
        elif c == ")" and depth:
            depth -= 1
        value.append(c)
        i += 1
    out.append(Word(line[start:i], "".join(value)))
    return i


def _double_quoted(line: str, i: int, value: list[str]) -> int:
    n = len(line)
    while i < n and line[i] != '"':
        if line[i] == "\\" and i + 1 < n and line[i + 1] in '"\\$`':
            value.append(line[i + 1])
            i += 2
            continue
        value.append(line[i])
        i += 1
    return i + 1


def simple_commands(line: str) -> list[list[Word]]:
    """LINE cut at its operators (`|`, `&&`, `;`, ...), each part without its redirections."""
    parts: list[list[Word]] = [[]]
    skip_next = False
    for w in words(line):
        if w.raw in _OPERATORS:
            parts.append([])
            continue
        if skip_next:
            skip_next = False
            continue
        if _REDIRECT.match(w.raw):
            skip_next = True
            continue
        if _ATTACHED.match(w.raw):  # `>out.txt`, `2>/dev/null`: target attached
            continue
        parts[-1].append(w)
    return [p for p in parts if p]


def uses(line: str) -> list[Use]:
    """Each program LINE runs with at least one long option, and those options."""
    out = []
    for part in simple_commands(line):
        use = _use(part)
        if use is not None and use.flags:
            out.append(use)
    return out


def _use(part: list[Word]) -> Optional[Use]:
    i = 0
    while i < len(part) and (_ASSIGN.match(part[i].value) or part[i].value in _WRAPPERS):
        i += 1
    if i >= len(part) or part[i].value in _BUILTINS:
        return None
    prog, rest = [part[i]], part[i + 1:]
    if _PYTHON.match(part[i].value):
        j = 0
        while j < len(rest) and rest[j].value.startswith("-") and rest[j].value not in ("-m", "-c"):
            j += 1  # the interpreter's own switches (-u, -X dev): not the program's options
        if j >= len(rest) or rest[j].value == "-c":
            return None  # `python -c CODE`: the code's arguments are nobody's documented options
        if rest[j].value == "-m" and j + 1 < len(rest):
            prog, rest = [part[i], rest[j], rest[j + 1]], rest[j + 2:]
        else:
            prog, rest = [part[i], rest[j]], rest[j + 1:]
    sub = rest[0] if rest and _SUBCOMMAND.match(rest[0].raw) else None
    return Use(tuple(w.raw for w in prog), sub.raw if sub else None, tuple(_long_options(rest)))


def _long_options(args: Iterable[Word]) -> list[str]:
    out: list[str] = []
    for w in args:
        if w.value == "--":
            break  # what follows is operands, even when it starts with --
        m = HELP_FLAG.match(w.value)
        # --help is how the flags are checked, never a flag to check.
        if m and w.value.startswith("--") and m.group(0) not in out and m.group(0) != "--help":
            out.append(m.group(0))
    return out


def help_flags(text: str) -> set[str]:
    """Every `--long-option` a help text names."""
    return set(HELP_FLAG.findall(text))


def closest(flag: str, offered: Iterable[str]) -> Optional[str]:
    """The offered flag nearest to FLAG (difflib), or None when none is near."""
    near = difflib.get_close_matches(flag, sorted(offered), n=1, cutoff=0.5)
    return near[0] if near else None

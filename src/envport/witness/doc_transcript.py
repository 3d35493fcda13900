"""A markdown doc's `console` transcripts: the commands it tells a user to type and the output it promises.

Pure: text in, commands out.  The format (docs/spec.md, "The docs witness"):

- a fenced block whose info string is `console` is a transcript; other blocks are prose;
- each line starting with `$ ` is a command; a trailing `\\` continues it on the next line;
- the lines up to the next `$ ` are the output the doc promises: `...` alone matches any number of
  lines, a line ending in `...` matches any line that starts with what comes before it, and a last
  line `[N]` promises exit status N (else 0);
- `<!-- envport: norun -->` on the last non-blank line before the fence marks a block that is not
  run (a GPU cluster, data, hours) but whose flags are still checked.

Every command and every promised line keeps its line number in the doc, so a verdict names it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional

WILDCARD = "..."
# Any indentation: a fence inside a list item is indented with the item, and so are its lines.
_FENCE = re.compile(r"^( *)(`{3,}|~{3,})\s*([^`\s]*)")
_NORUN = re.compile(r"^<!--\s*envport:\s*norun\s*-->$")
_EXIT = re.compile(r"^\[(\d{1,3})\]$")


@dataclass(frozen=True)
class Promised:
    """One line of output the doc promises, where it stands in the doc."""

    line: int
    text: str

    @property
    def any_lines(self) -> bool:
        return self.text.strip() == WILDCARD

    def matches(self, got: str) -> bool:
        if self.text.endswith(WILDCARD):
            return got.startswith(self.text[:-len(WILDCARD)])
        return got == self.text


@dataclass(frozen=True)
class Command:
    line: int  # the doc line of its `$ `
    text: str  # as a shell reads it: continuation lines joined with their backslash-newlines
    output: tuple[Promised, ...] = ()
    exit_status: int = 0
    norun: bool = False

    @property
    def shown(self) -> str:
        """The command on one line, for a verdict."""
        return " ".join(part.strip() for part in self.text.replace("\\\n", "\n").splitlines() if part.strip())


@dataclass
class Transcript:
    commands: list[Command] = field(default_factory=list)
    problems: list[tuple[int, str]] = field(default_factory=list)  # (line, what is wrong with the doc itself)


def parse(text: str) -> Transcript:
    """Every command of every `console` block in TEXT, in doc order, and what in a block is not a transcript."""
    out = Transcript()
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        end = _fence_end(lines, i + 1, m.group(2))
        if m.group(3) == "console":
            _block(_dedent(lines, i + 1, end, len(m.group(1))), i + 1, end, _norun(lines, i), out)
        i = end + 1
    return out


def _fence_end(lines: list[str], start: int, fence: str) -> int:
    """The index of the closing fence (the same character, at least as long); the doc's end if none."""
    for j in range(start, len(lines)):
        s = lines[j].strip()
        if s.startswith(fence) and set(s) == {fence[0]}:
            return j
    return len(lines)


def _dedent(lines: list[str], start: int, end: int, indent: int) -> list[str]:
    """LINES with the block's lines (START..END-1) shifted left by the fence's indentation, as CommonMark reads them."""
    if not indent:
        return lines
    out = list(lines)
    for j in range(start, end):
        out[j] = lines[j][min(indent, len(lines[j]) - len(lines[j].lstrip(" "))):]
    return out


def _norun(lines: list[str], fence_at: int) -> bool:
    j = fence_at - 1
    while j >= 0 and not lines[j].strip():
        j -= 1
    return j >= 0 and _NORUN.match(lines[j].strip()) is not None


def _block(lines: list[str], start: int, end: int, norun: bool, out: Transcript) -> None:
    """The commands of one console block (doc lines start..end-1, 0-based) appended to OUT."""
    j = start
    current: Optional[tuple[int, list[str]]] = None
    promised: list[Promised] = []
    while j < end:
        raw = lines[j].rstrip()
        if raw.startswith("$ ") or raw == "$":
            if current is not None:
                out.commands.append(_command(current, promised, norun))
            parts = [raw[2:]]
            while parts[-1].endswith("\\") and j + 1 < end:
                j += 1
                parts.append(lines[j].rstrip())
            current, promised = (j - len(parts) + 2, parts), []
        elif current is not None:
            promised.append(Promised(j + 1, raw))
        elif raw.strip():
            out.problems.append((j + 1, "text before the first `$ ` command of a console block (start each "
                                        "command with `$ `, or fence plain output as ```text)"))
        j += 1
    if current is not None:
        out.commands.append(_command(current, promised, norun))


def _command(current: tuple[int, list[str]], promised: list[Promised], norun: bool) -> Command:
    line, parts = current
    while promised and not promised[-1].text.strip():
        promised.pop()
    status = 0
    if promised and (m := _EXIT.match(promised[-1].text.strip())):
        status = int(m.group(1))
        promised.pop()
    return Command(line, "\n".join(parts), tuple(promised), status, norun)


@dataclass(frozen=True)
class Mismatch:
    line: int  # the doc line to look at
    message: str


def compare(cmd: Command, got: str) -> Optional[Mismatch]:
    """Where the output GOT first differs from what CMD promises (None: it matches); trailing blanks ignored."""
    lines = [ln.rstrip() for ln in got.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    want = list(cmd.output)
    # Forward over (promised line, output line) states: no recursion, so a long output cannot overflow.
    seen, todo = {(0, 0)}, [(0, 0)]
    while todo:
        w, g = todo.pop()
        nxt = []
        if w < len(want) and want[w].any_lines:
            nxt = [(w + 1, g)] + ([(w, g + 1)] if g < len(lines) else [])
        elif w < len(want) and g < len(lines) and want[w].matches(lines[g]):
            nxt = [(w + 1, g + 1)]
        for state in nxt:
            if state not in seen:
                seen.add(state)
                todo.append(state)
    if (len(want), len(lines)) in seen:
        return None
    # The furthest promised line reached names the difference (never a `...`: one always steps past it).
    w, g = max(seen)
    if w == len(want):
        return Mismatch(cmd.line, f"$ {cmd.shown}: printed more than the doc shows, from {_plain(lines[g])} "
                                  f"(end the promised output with `...` if the rest does not matter)")
    got_text = _plain(lines[g]) if g < len(lines) else "no more output"
    return Mismatch(want[w].line, f"expected {_plain(want[w].text)}, got {got_text}")


def _plain(text: str) -> str:
    """A line as the doc writes it; quoted only where blanks at its ends would otherwise vanish."""
    return repr(text) if not text or text != text.strip() else text

"""Install scripts and `.def` %post bodies: logical lines, and multi-line blocks kept whole as shim scripts.

A run command is one line (the spec refuses newlines), so an `if … fi`,
`for … done`, a function or a here-document spanning several lines cannot
become one.  Such a block is written verbatim into a shim script and run from
run_commands, in order: nothing is split in a way that changes what it does.
"""

from __future__ import annotations

import re
from typing import Optional

from envport.porting.report import REPORTED, Draft, turned_into
from envport.porting.shell.commands import handle
from envport.porting.shell.context import ShellContext
from envport.porting.shell.kept import BASH_ONLY

OPEN = re.compile(r"(?:^|[;&|]\s*|\bthen\s+|\bdo\s+|\belse\s+)(if|for|while|until|case|select)\b")
CLOSE = re.compile(r"(?:^|[;&|]\s*)(fi|done|esac)\b")
HEREDOC = re.compile(r"<<-?\s*['\"]?([A-Za-z_][A-Za-z0-9_]*)['\"]?")
BLOCK_DIR = "/opt/envport-import"


def _depth_change(line: str) -> int:
    code = re.sub(r"'[^']*'|\"(?:[^\"\\]|\\.)*\"", "''", line.split(" #", 1)[0])
    change = len(OPEN.findall(code)) - len(CLOSE.findall(code))
    if re.search(r"(\(\)|\bfunction\s+\S+)\s*\{\s*$", code) or re.match(r"^\s*\{\s*$", code):
        change += 1
    if re.match(r"^\s*\}\s*;?\s*$", code):
        change -= 1
    return change


def logical_lines(lines: list[str], first: int) -> list[tuple[int, str, str]]:
    """[(line number, text, "line"|"block"|"step")]: continuation lines joined, blanks and comments skipped
    except envport's own `# step i/n KIND:` comments (text: KIND)."""
    out: list[tuple[int, str, str]] = []
    i = 0
    while i < len(lines):
        no, raw = first + i, lines[i]
        stripped = raw.strip()
        i += 1
        if not stripped or stripped.startswith("#"):
            step = comment_step(stripped)
            if step:
                out.append((no, "\t".join(step), "step"))
            continue
        text = stripped
        while text.endswith("\\") and i < len(lines):
            text = text[:-1].rstrip() + " " + lines[i].strip()
            i += 1
        doc = HEREDOC.search(text)
        depth = _depth_change(text)
        if not doc and depth <= 0:
            out.append((no, text, "line"))
            continue
        block = [raw.rstrip()]
        while i < len(lines) and (depth > 0 or doc):
            line = lines[i]
            block.append(line.rstrip())
            i += 1
            if doc:
                if line.strip() == doc.group(1):
                    doc = None
                continue
            doc = HEREDOC.search(line)
            depth += _depth_change(line)
        out.append((no, "\n".join(block), "block"))
    return out


def block_shim(text: str, line: int, ctx: ShellContext, errexit: bool) -> None:
    """A multi-line block -> a shim script (verbatim) and one run command that runs it."""
    import textwrap

    body = textwrap.dedent(text).strip("\n")
    bash = ctx.shell_is_bash or any(rx.search(body) for rx, _ in BASH_ONLY)
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", ctx.file.rsplit("/", 1)[-1]).strip("-") or "recipe"
    dest = f"{BLOCK_DIR}/{stem}-line{line}.sh"
    data = f"#!/bin/{'bash' if bash else 'sh'}\n{'set -e' if errexit else ''}\n{body}\n".replace("\n\n", "\n", 1)
    ctx.draft.blocks[dest] = (data.encode("utf-8"), ctx.file, line)
    ctx.draft.note(line, body.split("\n", 1)[0] + " …", turned_into(f"shim_files[{dest}] + a run command"),
                   "a multi-line block (if/for/while/case, a function or a here-document): run_commands are single "
                   "lines, so the block runs as a script, verbatim and in order")
    ctx.draft.add_run(dest, line, ctx.file)


def read_lines(text: str, first: int, ctx: ShellContext, errexit: bool = True) -> None:
    for no, line, kind in logical_lines(text.split("\n"), first):
        if kind == "step":
            ctx.rendered_step, ctx.rendered_title = line.split("\t", 1)
        elif kind == "block":
            block_shim(line, no, ctx, errexit)
        else:
            handle(line, no, ctx)


def read_script(text: str, label: str, draft: Draft, open_file=None) -> None:
    """An install script (bash/sh): each line in order, as a shell running it would."""
    text = text.replace("\r\n", "\n")
    first = text.split("\n", 1)[0]
    ctx = ShellContext(draft, label, "script", shell_is_bash="bash" in first if first.startswith("#!") else False)
    if open_file:
        ctx.open_file = open_file
    errexit = bool(re.search(r"(?m)^\s*set\s+-[a-z]*e", text))
    if not errexit:
        draft.note(1, first, REPORTED, "the script does not `set -e`: a failing line did not stop it; envport's "
                   "recipes stop at the first failing command")
    read_lines(text, 1, ctx, errexit=True)


def comment_step(line: str) -> Optional[tuple[str, str]]:
    """(kind, title) of envport's own `# step i/n KIND: TITLE` comment."""
    m = re.match(r"^\s*# step \d+/\d+ ([a-z]+)(-\d+)?: (.*)$", line)
    return (m.group(1), m.group(3)) if m else None

"""A command line's structure: its top-level `&&`/`;` segments, or why it must stay whole.

`||`, a background `&`, a here-document, unbalanced quotes or a compound
command (`if`, `for`, a function …) cannot be split without changing what the
line does; quotes, backslashes and parentheses (`$(…)`, subshells) hide the
operators inside them.
"""

from __future__ import annotations

import re
from typing import Optional

COMPOUND = {"if", "for", "while", "until", "case", "select", "function", "{", "(", "[["}


def split_top(text: str) -> tuple[list[str], str]:
    """Top-level `&&`/`;` segments of TEXT, and why TEXT must stay whole ("" when it can be split)."""
    segments, whole = _top_level_segments(text)
    if whole:
        return [text], whole
    segments = [s.strip() for s in segments if s.strip()]
    first = _compound_start(segments)
    if first is not None:
        return [text.strip()], f"`{first}`"
    return segments, ""


def _top_level_segments(text: str) -> tuple[list[str], str]:
    """TEXT cut at its top-level `&&`, `;` and newlines, or ([], why) at the first operator that keeps it whole."""
    segments, cur, i, depth, quote = [], [], 0, 0, ""
    while i < len(text):
        c = text[i]
        two = text[i:i + 2]
        if quote:
            i, quote = _quoted(text, i, quote, cur)
        elif c == "\\" and i + 1 < len(text):
            cur += [c, text[i + 1]]
            i += 1
        elif c in "'\"`":
            quote = c
            cur.append(c)
        elif c == "(":  # `$(` too: counted once, at its `(` (counting the `$` as well left depth 1 for good)
            depth += 1
            cur.append(c)
        elif c == ")":
            depth = max(0, depth - 1)
            cur.append(c)
        elif depth == 0 and two == "&&":
            segments.append("".join(cur))
            cur = []
            i += 1
        elif depth == 0 and (why := _keeps_whole(text, i)):
            return [], why
        elif depth == 0 and c in ";\n":
            segments.append("".join(cur))
            cur = []
        else:
            cur.append(c)
        i += 1
    if quote:
        return [], "unbalanced quotes"
    segments.append("".join(cur))
    return segments, ""


def _quoted(text: str, i: int, quote: str, cur: list[str]) -> tuple[int, str]:
    """One character inside QUOTE, appended to CUR: the index it ends at and the quote still open ("" closed).
    Inside `"…"` a backslash carries the next character with it, so `\\"` does not close the quote."""
    c = text[i]
    cur.append(c)
    if c == "\\" and quote == '"' and i + 1 < len(text):
        cur.append(text[i + 1])
        i += 1
    elif c == quote:
        quote = ""
    return i, quote


def _keeps_whole(text: str, i: int) -> str:
    """The top-level operator at I that splitting would change the meaning of ("" when none).
    Called after `&&` was ruled out, so a lone `&` here is a background job unless it is a redirection."""
    c, two = text[i], text[i:i + 2]
    if two == "||":
        return "`||`"
    if c == "&" and text[i - 1:i] not in (">", "<") and two not in ("&>",):
        return "a background `&`"
    if two == "<<":
        return "a here-document"
    return ""


def _compound_start(segments: list[str]) -> Optional[str]:
    """The first word of the first segment that opens a compound command or a function definition."""
    for s in segments:
        first = s.split(None, 1)[0] if s.split() else ""
        if first in COMPOUND or re.match(r"^[A-Za-z_][A-Za-z0-9_]*\(\)", s):
            return first
    return None

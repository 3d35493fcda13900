"""How deeply brackets nest in a piece of text, counted without recursion, before a recursive parser sees it.

json.loads and packaging's marker parser recurse once (or more) per level: a Dockerfile `RUN` of
20,000 `[` or a requirement marker of 3,000 `(` ends in RecursionError.  Callers measure first and
refuse past MAX_NESTING with a "too deeply nested" reason; real exec-form RUN lines nest once,
real markers two or three times.  The bound is the spec reader's YAML depth (spec/yamlfile).
"""

from __future__ import annotations

MAX_NESTING = 32
_OPEN, _CLOSE = "([{", ")]}"


def depth(text: str) -> int:
    """The deepest (, [ or { nesting in TEXT, outside '…' and "…" strings (a backslash escapes in "…")."""
    deepest = level = 0
    quote = ""
    escaped = False
    for ch in text:
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\" and quote == '"':
                escaped = True
            elif ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in _OPEN:
            level += 1
            deepest = max(deepest, level)
        elif ch in _CLOSE:
            level = max(0, level - 1)
    return deepest


def too_deep(text: str, limit: int = MAX_NESTING) -> str:
    """Why TEXT is refused ("" when it is not): nested deeper than LIMIT levels."""
    n = depth(text)
    return f"too deeply nested ({n} levels of brackets, at most {limit})" if n > limit else ""

"""Text read from a file envport did not write (a pulled SIF's labels, environment, file names), made safe
to print.

A label holding `\\x1b[2J` clears the admin's terminal; one holding `\\r` and a fake `OK ... matches`
line draws over the real verdict.  Every printer of such text passes it through `shown`: each
non-printable character (controls, ESC, DEL, the C1 range, line and paragraph separators, bidi
overrides) becomes a visible escape, so what is printed is exactly what the file holds and nothing
the terminal would act on.
"""

from __future__ import annotations

import unicodedata

# Printable by str.isprintable() yet acted on by terminals or by readers splitting lines: bidi controls
# reorder what the eye reads (CVE-2021-42574, "Trojan Source"), U+2028/U+2029/U+0085 split lines.
_ALSO_ESCAPED = frozenset("\u2028\u2029\u0085\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def _escape(ch: str) -> str:
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def shown(value: object, limit: int | None = None) -> str:
    """VALUE as text with every non-printable character escaped; cut to LIMIT characters with `...` when
    given.  A backslash stays as it is: a literal `\\x1b` in a label is four harmless characters."""
    text = value if isinstance(value, str) else str(value)
    if limit is not None and len(text) > limit:
        text = text[:max(limit - 3, 0)] + "..."
    out = []
    for ch in text:
        if ch in _ALSO_ESCAPED or not ch.isprintable() or unicodedata.category(ch) == "Cf":
            out.append(_escape(ch))
        else:
            out.append(ch)
    return "".join(out)

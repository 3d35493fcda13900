"""Secret values envport must never print or record: registered once known, scrubbed at every sink.

The values come from the layers that know what is secret (builders/weights: every weight's `auth_hint`
variable, gated or not; plan/site and the spec: the password of a pip URL, `https://u:TOKEN@host`).
Once one is registered, this process's stdout and stderr replace it with `***` on every write
(verdict lines, progress, log tails, `--json`), and the ledger scrubs each record before it writes
it.  A non-gated weight's token printed by its `source` command reached the terminal before this
(issue 21, F14): scrubbing only where a leak was expected missed the places nobody expected.

Limits, said plainly: a value shorter than MIN_CHARS is not scrubbed (`***` in place of every `a`
would make output unreadable, and such a value is no secret), and bytes a child process writes
straight to an inherited terminal never pass through Python.
"""

from __future__ import annotations

import sys
from typing import Any, Iterable, Optional
from urllib.parse import urlsplit

MIN_CHARS = 4
MASK = "***"
_values: set[str] = set()


def register(values: Iterable[Optional[str]]) -> None:
    """Add secret values; from then on stdout and stderr scrub them."""
    new = {v for v in values if v and len(v) >= MIN_CHARS}
    if new - _values:
        _values.update(new)
        _guard_streams()


def url_password(url: Optional[str]) -> Optional[str]:
    """The password (or token) inside a URL's user info, if any."""
    if not url or "@" not in url:
        return None
    try:
        return urlsplit(url).password
    except ValueError:
        return None


def scrub(text: str) -> str:
    # Longest first: a secret that contains another must not be left half-masked.
    for value in sorted(_values, key=len, reverse=True):
        if value in text:
            text = text.replace(value, MASK)
    return text


def scrub_data(obj: Any) -> Any:
    """OBJ (JSON-like: dicts, lists, strings) with every registered value masked, keys included."""
    if not _values:
        return obj
    if isinstance(obj, str):
        return scrub(obj)
    if isinstance(obj, dict):
        return {scrub_data(k): scrub_data(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [scrub_data(v) for v in obj]
    return obj


class _Scrubbed:
    """A text stream that masks registered values in what it is given; everything else is the stream's."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        return self._stream.write(scrub(text) if isinstance(text, str) else text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def _guard_streams() -> None:
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, _Scrubbed):
            setattr(sys, name, _Scrubbed(stream))

"""Progress lines for long work."""

from __future__ import annotations

import sys
from typing import Callable

Progress = Callable[[str], None]


def stderr_progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def quiet(_line: str) -> None:
    pass


def tail(text: str, n: int = 30) -> list[str]:
    return text.rstrip().splitlines()[-n:]


def human_size(n: int) -> str:
    """Bytes as a build line says them: GB with two decimals, else MB, kB below one MB."""
    if n >= 1e9:
        return f"{n / 1e9:.2f} GB"
    return f"{n / 1e6:.0f} MB" if n >= 1e6 else f"{n / 1e3:.0f} kB"


def transfer_progress(label: str, say: Progress = stderr_progress) -> Callable[[int, int], None]:
    """A (done, total) bytes callback that says `LABEL: D of T MiB` at each tenth of TOTAL."""
    shown = [0]

    def progress(done: int, total: int) -> None:
        if total and done * 10 // total > shown[0]:
            shown[0] = done * 10 // total
            say(f"{label}: {done >> 20} of {total >> 20} MiB")

    return progress

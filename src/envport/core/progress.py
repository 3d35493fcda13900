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

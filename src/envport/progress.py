"""Progress lines for long work, and timing a step into a StepResult."""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from typing import Callable

Progress = Callable[[str], None]


def stderr_progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def quiet(_line: str) -> None:
    pass


@contextmanager
def timer():
    """`with timer() as t: ...; t()` gives the seconds since the block started."""
    start = time.monotonic()
    yield lambda: time.monotonic() - start


def tail(text: str, n: int = 30) -> list[str]:
    return [ln for ln in text.rstrip().splitlines()][-n:]

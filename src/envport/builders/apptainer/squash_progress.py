"""mksquashfs with a progress line at least every few seconds, read from its own progress bar.

Quiet, mksquashfs was ~50 s of silence on a 1 GB rootfs: a user cannot tell it from a hang. With
`-progress -quiet` it writes only its bar, redrawn after `\r` (`[====    ] 120/400  30%`); a reader
thread keeps the latest one and the caller says it every TICK seconds (the bar can stall while a big
file is compressed; the line then says how long it has been running).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from typing import Callable, Optional

from envport.core.proc import spawn

TICK_S = 4.0  # under the 5 s a build may stay silent
BAR = re.compile(r"(\d+)/(\d+)\s+(\d+)%")
KEEP_CHARS = 64 * 1024  # of its other output, for a failure's tail


def last_state(text: str) -> Optional[tuple[int, int, int]]:
    """The last (done, total, percent) the progress bar drew in TEXT, or None before its first."""
    found = BAR.findall(text)
    return tuple(int(x) for x in found[-1]) if found else None


def progress_line(state: Optional[tuple[int, int, int]], seconds: float) -> str:
    if state is None:
        return f"mksquashfs: reading the tree ({seconds:.0f}s)"
    done, total, percent = state
    return f"mksquashfs: {percent}% ({done}/{total} blocks, {seconds:.0f}s)"


def run_mksquashfs(argv: list[str], say: Callable[[str], None], tick_s: float = TICK_S) -> tuple[int, str]:
    """Run ARGV (mksquashfs ... with -progress -quiet), saying its progress every TICK_S; (exit code,
    its output with the bar's redraws cut to the last)."""
    # A SIGKILLed envport must not leave mksquashfs writing into a work dir the next run deletes.
    # mksquashfs refuses SOURCE_DATE_EPOCH beside -all-time/-mkfs-time: the builder passes the times itself.
    env = {k: v for k, v in os.environ.items() if k != "SOURCE_DATE_EPOCH"}
    proc = spawn(argv, dies_with=signal.SIGKILL, env=env)
    chunks: list[str] = []
    state: list = [None]

    def read() -> None:
        for raw in iter(lambda: proc.stdout.read1(4096), b""):
            text = raw.decode("utf-8", "replace")
            chunks.append(text)
            now = last_state(text)
            if now is not None:
                state[0] = now
            if sum(map(len, chunks)) > KEEP_CHARS:
                del chunks[:len(chunks) // 2]

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    start = time.monotonic()
    while True:
        try:
            code = proc.wait(timeout=tick_s)
            break
        except subprocess.TimeoutExpired:
            say(progress_line(state[0], time.monotonic() - start))
    reader.join()
    if state[0] is not None:
        say(progress_line(state[0], time.monotonic() - start))
    out = "".join(chunks)
    lines = [part.rsplit("\r", 1)[-1] for part in out.split("\n")]
    return code, "\n".join(ln for ln in lines if ln.strip())

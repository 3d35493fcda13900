"""One way to run a short external command and keep what it said.

Probes (nvidia-smi, sbatch/squeue/scontrol, docker/ssh/bash parity probes,
a torch probe) all need the same three things: a timeout, "not installed"
told apart from "failed", and the output kept for the verdict's tail.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import threading
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping, Optional, Sequence


@dataclass(frozen=True)
class Ran:
    returncode: Optional[int]  # None: it did not start, or did not answer in time (see `why`)
    stdout: str = ""
    stderr: str = ""
    why: str = ""

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def text(self) -> str:
        """stdout and stderr together, or why it never answered."""
        return (self.stdout + self.stderr) if self.returncode is not None else self.why


def run(argv: Sequence[str], *, timeout: float = 30, stdin: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None) -> Ran:
    argv = list(argv)
    try:
        p = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout,
                           env=dict(env) if env is not None else None,
                           stdin=None if stdin is not None else subprocess.DEVNULL)
    except FileNotFoundError:
        return Ran(None, why=f"{argv[0]}: not found")
    except OSError as exc:
        return Ran(None, why=f"{argv[0]}: {exc.strerror or exc}")
    except subprocess.TimeoutExpired:
        return Ran(None, why=f"{argv[0]} did not answer within {timeout:.0f}s")
    return Ran(p.returncode, p.stdout, p.stderr)


class Terminated(KeyboardInterrupt):
    """A SIGTERM, raised as an interrupt by `sigterm_interrupts`."""


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """Turn SIGTERM into an interrupt meanwhile, so `finally` blocks (a container's removal, an unmount) run;
    the CLI reports it as interrupted (exit 130). A no-op outside the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum, frame):
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def dies_with_parent(sig: int) -> Callable[[], None]:
    """A `preexec_fn` that has the child sent SIG when its parent dies (PR_SET_PDEATHSIG), so a SIGKILLed
    envport leaves no docker client building, mksquashfs writing or mount holder behind. libc is bound here,
    in the parent; the child only calls prctl. A libc without prctl: the child runs without it."""
    import ctypes

    try:
        prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return lambda: None

    def preexec() -> None:
        prctl(1, sig)  # PR_SET_PDEATHSIG

    return preexec

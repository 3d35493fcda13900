"""One way to run an external command and keep what it said.

Every external command envport runs starts here (tests/test_no_subprocess.py greps for any other):
probes (nvidia-smi, sbatch/squeue/scontrol, docker/ssh/bash parity probes, a torch probe) and builds
(docker, apptainer, mksquashfs, pip) all need the same things: a timeout, "not installed" told apart from
"failed", the output kept for the verdict's tail, and no child left running when envport is killed.
`run` waits for the end; `spawn` hands back the running child for a caller that streams its output.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from dataclasses import dataclass
from typing import IO, Callable, Iterator, Mapping, Optional, Sequence, Union

PathLike = Union[str, "os.PathLike[str]"]


@dataclass(frozen=True)
class Ran:
    returncode: Optional[int]  # None: it did not start, or did not answer in time (see `why`)
    stdout: Union[str, bytes] = ""  # bytes where `run(binary=True)`
    stderr: str = ""
    why: str = ""
    timed_out: bool = False  # it started and was killed at the timeout

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def text(self) -> str:
        """stdout and stderr together, or why it never answered."""
        return (self.stdout + self.stderr) if self.returncode is not None else self.why


def run(argv: Sequence[str], *, timeout: Optional[float] = 30, stdin: Union[str, bytes, None] = None,
        stdin_from: Optional[IO] = None, env: Optional[Mapping[str, str]] = None, cwd: Optional[PathLike] = None,
        binary: bool = False, errors: str = "strict", dies_with: Optional[int] = None,
        pass_fds: Sequence[int] = ()) -> Ran:
    """ARGV run to its end, its output kept. TIMEOUT None only where the work has no bound envport can name
    (a build, a squashfs of a whole tree, a user's own fetch command): the child is killed when it passes it.
    STDIN is fed as input; STDIN_FROM is a file (another child's pipe) read instead; with neither the child
    reads /dev/null, so it never waits on a terminal. BINARY: stdout is bytes (a file's content), stderr text.
    DIES_WITH: the signal the child gets when envport dies (`dies_with_parent`). PASS_FDS: descriptors the
    child inherits at the same numbers (an open SIF it reads as /proc/self/fd/N)."""
    argv = [str(a) for a in argv]
    text = not binary and not isinstance(stdin, bytes)
    try:
        p = subprocess.run(argv, input=stdin, capture_output=True, timeout=timeout, cwd=cwd,
                           env=dict(env) if env is not None else None,
                           stdin=None if stdin is not None else (stdin_from or subprocess.DEVNULL),
                           text=text, errors=errors if text else None, pass_fds=tuple(pass_fds),
                           preexec_fn=dies_with_parent(dies_with) if dies_with is not None else None)
    except FileNotFoundError:
        return Ran(None, why=f"{argv[0]}: not found")
    except OSError as exc:
        return Ran(None, why=f"{argv[0]}: {exc.strerror or exc}")
    except subprocess.TimeoutExpired:
        return Ran(None, why=f"{argv[0]} did not answer within {timeout:.0f}s", timed_out=True)
    stderr = p.stderr if text else p.stderr.decode("utf-8", "replace")
    return Ran(p.returncode, p.stdout if text or binary else p.stdout.decode("utf-8", "replace"), stderr)


def spawn(argv: Sequence[str], *, cwd: Optional[PathLike] = None, env: Optional[Mapping[str, str]] = None,
          stdin: Union[int, IO] = subprocess.DEVNULL, stdout: Union[int, IO] = subprocess.PIPE,
          stderr: Union[int, IO, None] = subprocess.STDOUT,
          text: bool = False, errors: Optional[str] = None, dies_with: Optional[int] = None,
          new_session: bool = False, pass_fds: Sequence[int] = ()) -> subprocess.Popen:
    """ARGV started, for the caller to stream (a build's log, a tar into ssh) and wait on. By default it
    reads /dev/null and its stderr joins its stdout, so a log is read in the order it was written; STDIN,
    STDOUT and STDERR also take a file (a mount holder's stderr kept for its error message).
    DIES_WITH: as for `run`. NEW_SESSION: a Ctrl-C at the terminal reaches envport alone, which stops the
    child in order. PASS_FDS: as for `run`. Raises OSError when ARGV cannot start (the caller names the tool)."""
    return subprocess.Popen([str(a) for a in argv], cwd=cwd, env=dict(env) if env is not None else None,
                            stdin=stdin, stdout=stdout, stderr=stderr, text=text or None, errors=errors,
                            preexec_fn=dies_with_parent(dies_with) if dies_with is not None else None,
                            start_new_session=new_session, pass_fds=tuple(pass_fds))


def stream_lines(proc: subprocess.Popen, on_line: Callable[[str], None], grace_s: float = 20) -> int:
    """PROC's text output fed to ON_LINE line by line, then its exit code. On any exception (an interrupt,
    a failing ON_LINE) PROC gets SIGINT, as a Ctrl-C, so a build client cancels its build in the engine,
    and is killed after GRACE_S; the exception goes on."""
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            on_line(line)
        return proc.wait()
    except BaseException:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()  # SIGINT ignored (a child of a nohup'd run inherits SIG_IGN): reaped below
            proc.wait()
        raise


class Terminated(KeyboardInterrupt):
    """A SIGTERM or SIGHUP, raised as an interrupt by `sigterm_interrupts`; `signal_name` says which."""

    def __init__(self, signal_name: str = "SIGTERM"):
        super().__init__(signal_name)
        self.signal_name = signal_name


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """Turn SIGTERM and SIGHUP (a closed terminal, a logged-out session) into an interrupt meanwhile, so
    `finally` blocks (a container's removal, an unmount, a partial download) run; the CLI reports it as
    interrupted (exit 130), naming the signal. A no-op outside the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum, frame):
        raise Terminated(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, _raise) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


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

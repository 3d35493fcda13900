"""The launcher interface and the one deadline-bounded runner they share."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, ContextManager, Mapping, Optional, Sequence

from envport.core.verdict import StepResult

# The witness scripts on this host: bind-mounted into containers, run in place by `local`.
WITNESS_DIR = Path(__file__).resolve().parent.parent / "scripts"


@dataclass
class Invocation:
    """What to execute on this host to run one witness script in the env."""

    argv: list[str]
    env: Optional[dict[str, str]] = None  # the host process's whole environment; None inherits
    cleanup: list[list[str]] = field(default_factory=list)  # run after a timeout or Ctrl-C
    label: str = ""  # e.g. the container name, for messages


@dataclass
class LaunchResult:
    argv: list[str]
    returncode: Optional[int]  # None when it was stopped at the deadline
    output: str  # stdout and stderr, interleaved as written
    seconds: float
    timed_out: bool = False

    @property
    def lines(self) -> list[str]:
        return self.output.splitlines()


class Launcher(ABC):
    """Starts witness scripts inside one built env.

    Subclasses say where the witness folder appears inside the env
    (`witness_path`) and how to start a script there (`invocation`); `run`
    adds the deadline, output capture and cleanup.  A wrapper (srun, ssh) keeps
    an inner launcher and prefixes its Invocation's argv.
    """

    name: str = "launcher"
    # True: the witness starts its own ranks (torch.multiprocessing spawn).
    # A launcher that starts one process per rank itself (srun) sets False,
    # and the witness then runs just the rank its environment names.
    spawns_ranks: bool = True

    @abstractmethod
    def witness_path(self, script: str) -> str:
        """The path of witness `script` (e.g. "dist.py") as the env's interpreter sees it."""

    @abstractmethod
    def invocation(self, script: str, args: Sequence[str], env: Mapping[str, str]) -> Invocation:
        """The host-side command that runs `script args` in the env with `env` added."""

    def preflight(self) -> Optional[StepResult]:
        """A REFUSED/FAILED StepResult when this launcher cannot run at all, else None."""
        return None

    def describe(self) -> str:
        return self.name

    def sweep_line(self) -> str:
        """The shell line a batch job's cleanup runs to remove what this launcher's killed tasks left (a SIF's
        mounts); empty when a task leaves nothing its own trap does not remove."""
        return ""

    def session(self) -> ContextManager[None]:
        """Held around a whole witness run (`run_witnesses`): what a launcher sets up once for all its
        calls (the SIF's one mount), torn down on the way out, whatever happened. Raises
        core.errors.ReasonError when that cannot be set up."""
        return contextlib.nullcontext()

    def run(self, script: str, args: Sequence[str], env: Mapping[str, str], deadline_s: float,
            on_line: Optional[Callable[[str], None]] = None) -> LaunchResult:
        return run_with_deadline(self.invocation(script, args, env), deadline_s, on_line)


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _stop(proc: subprocess.Popen, grace: float = 5.0) -> None:
    """SIGTERM the whole process group, then SIGKILL what is left after `grace` seconds."""
    if proc.poll() is not None:
        # The leader is gone; its group may not be (spawned ranks).
        _signal_group(proc, signal.SIGKILL)
        return
    _signal_group(proc, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    _signal_group(proc, signal.SIGKILL)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass


def _cleanup(inv: Invocation) -> None:
    from envport.core.proc import run

    for argv in inv.cleanup:
        run(argv, timeout=30)  # best effort: a cleanup that cannot run must not hide the witness verdict


def run_with_deadline(inv: Invocation, deadline_s: float,
                      on_line: Optional[Callable[[str], None]] = None) -> LaunchResult:
    """Run `inv` to completion or to the deadline; stdout+stderr captured line by line.

    The command gets its own session so a timeout or Ctrl-C stops everything it
    started (spawned ranks included), and `inv.cleanup` then removes what lives
    outside that group (a container the docker daemon keeps running).
    """
    from envport.core.proc import spawn

    t0 = time.monotonic()
    proc = spawn(inv.argv, env=inv.env, new_session=True, text=True, errors="replace")
    chunks: list[str] = []

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            chunks.append(line)
            if on_line is not None:
                try:
                    on_line(line.rstrip("\n"))
                except Exception:  # a progress printer must never break the run
                    pass

    reader = threading.Thread(target=pump, daemon=True)
    timed_out = False
    try:
        # Inside the try: a Ctrl-C that lands as soon as the first line is read must stop the group too.
        reader.start()
        proc.wait(timeout=max(deadline_s, 0.1))
    except subprocess.TimeoutExpired:
        timed_out = True
        _stop(proc)
        _cleanup(inv)
    except BaseException:  # Ctrl-C or anything else: leave nothing running
        _stop(proc, grace=2.0)
        _cleanup(inv)
        raise
    reader.join(timeout=10)
    # Ranks that outlived the leader would keep the group busy: end them too.
    _signal_group(proc, signal.SIGKILL)
    return LaunchResult(
        argv=list(inv.argv),
        returncode=None if timed_out else proc.returncode,
        output="".join(chunks),
        seconds=time.monotonic() - t0,
        timed_out=timed_out,
    )

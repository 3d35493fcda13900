"""The shell builder: run the rendered setup script locally or over SSH.

The script decides `present` itself (the hash AND the installed distributions
recorded inside the env), takes the env's lock, replays every step into a
fresh env and checks the spec's pins before it swaps that env in, so the same
rules hold on a host envport cannot otherwise inspect.  Over SSH the script
travels on stdin (`ssh HOST bash -c WRAPPER`), shim files inside it.  An
unreachable host is REFUSED within the connect timeout.

Stopping: the script runs in its own process group under a small wrapper
that reads the script's length from its argv and then watches its stdin.
envport keeps that stdin open for the whole build; when envport is told to
stop (SIGTERM, SIGINT, SIGHUP) it closes it, and so does the kernel when
envport dies (even by SIGKILL), or sshd when the connection drops: the
wrapper then sends SIGTERM to the whole group (bash, pip, run commands),
whose trap removes the half-made env, and envport waits for it.  Without
this, a `timeout` or `kill` left `bash -s` and pip running, reparented to
PID 1, and over SSH nothing reached the remote side at all.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import threading
import time
from pathlib import Path

from envport.recipe.render import render_plan

from envport.spec.loader import Loaded
from envport.recipe.identity import Resolved, resolve
from envport.engines.ssh import is_unreachable, resolve_host, ssh_argv, unreachable
from envport.core.proc import spawn
from envport.core.progress import Progress
from envport.core.verdict import INTERRUPTED_REASON, StepResult, Verdict

FORWARDED_ENV = ("ENVPORT_ENVS_DIR", "ENVPORT_ROOT", "ENVPORT_LOCK_WAIT")
REFUSED_RE = re.compile(r"REFUSED \[(\w+)\]: (.*)$")
PREFIX_RE = re.compile(r"(?:ready|present \S+) at (\S.*)$")
# The script's word for an env of another hash it is about to replace: which one the build changes.
REPLACED_RE = re.compile(r"building: the env at .* is ([0-9a-f]{12}), the spec is now [0-9a-f]{12}$")
PGID_LINE = "envport-build-pgid "
# How long a stopped build may take to clean up before its process group is killed outright.
STOP_GRACE_S = 30.0
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

# Runs the script ($1 bytes of stdin) as its own process group and turns EOF on
# stdin into SIGTERM to that group (see the module docstring).  `setsid` does
# not fork here (a background job is not a group leader), so $! is the group.
WRAPPER = r"""set -u
s="$(mktemp "${TMPDIR:-/tmp}/envport-build.XXXXXX")" || exit 1
trap 'rm -f "$s"' EXIT
head -c "$1" > "$s"
if [ "$(wc -c < "$s")" -ne "$1" ]; then echo "envport: the setup script did not arrive whole" >&2; exit 1; fi
exec 3<&0
setsid bash "$s" </dev/null &
pid=$!
echo "envport-build-pgid $pid"
( while read -r _; do :; done; kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null ) <&3 >/dev/null 2>&1 &
watcher=$!
exec 3<&-
rc=0
wait "$pid" || rc=$?
kill "$watcher" 2>/dev/null
exit "$rc"
"""


def script_text(resolved: Resolved, flavour: str) -> str:
    fname = f"setup-{flavour}.sh"
    rendering = render_plan(resolved.plan, resolved.hash, ("shell",), site=resolved.identity.site)
    return rendering.files[fname][0].decode()


def build(loaded: Loaded, site, root: Path, *, flavour: str, host: str | None = None, rebuild: bool = False,
          check: bool = False, install_system_pkgs: bool = False, progress: Progress) -> list[StepResult]:
    name = f"build {loaded.spec.name} ({flavour}{' on ' + host if host else ''})"
    resolved = resolve(loaded, site, "shell")
    env_pairs = {k: os.environ[k] for k in FORWARDED_ENV if k in os.environ}
    for flag, key in ((rebuild, "ENVPORT_REBUILD"), (check, "ENVPORT_CHECK"),
                      (install_system_pkgs, "ENVPORT_INSTALL_SYSTEM_PKGS")):
        if flag:
            env_pairs[key] = "1"
    script = script_text(resolved, flavour).encode()
    target_host = resolve_host(site, host)
    if target_host is None:
        argv = ["bash", "-c", WRAPPER, "envport-build", str(len(script))]
        env = {**os.environ, **env_pairs}
    else:
        remote = " ".join(["env", *[f"{k}={shlex.quote(v)}" for k, v in sorted(env_pairs.items())], "bash", "-c",
                           shlex.quote(WRAPPER), "envport-build", str(len(script))])
        argv = ssh_argv(target_host) + [remote]
        env = None
    start = time.monotonic()
    # Its own session: a Ctrl-C at the terminal reaches envport alone, which stops the build in order.
    proc = spawn(argv, stdin=subprocess.PIPE, env=env, new_session=True)
    assert proc.stdin and proc.stdout
    run = _Run(proc, local=target_host is None)
    # ssh may give up before reading the script (host unreachable): its exit code and output say why.
    with contextlib.suppress(BrokenPipeError):
        proc.stdin.write(script)
        proc.stdin.flush()
    lines: list[str] = []
    with run.stoppable():
        for raw in proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            if line.startswith(PGID_LINE):
                run.pgid = int(line[len(PGID_LINE):]) if line[len(PGID_LINE):].isdigit() else None
                continue
            lines.append(line)
            if line.startswith("envport["):
                progress(line)
        rc = proc.wait()
    run.release()
    seconds = time.monotonic() - start
    return [_verdict(name, resolved, host, target_host, rc, lines, seconds, run.stopped_by)]


class _Run:
    """One running build: its lifeline (our end of its stdin) and how to stop it."""

    def __init__(self, proc: subprocess.Popen, *, local: bool):
        self.proc, self.local = proc, local
        self.pgid: int | None = None  # the script's process group (local builds)
        self.stopped_by: str | None = None
        self._timer: threading.Timer | None = None

    def release(self) -> None:
        if self._timer:
            self._timer.cancel()
        with contextlib.suppress(OSError, ValueError):
            self.proc.stdin.close()

    def _stop(self, signum, frame) -> None:
        first = self.stopped_by is None
        self.stopped_by = self.stopped_by or signal.Signals(signum).name
        with contextlib.suppress(OSError, ValueError):
            self.proc.stdin.close()  # the wrapper's watcher sends SIGTERM to the build's group, once
        if first:
            self._timer = threading.Timer(STOP_GRACE_S, self._kill)
            self._timer.daemon = True
            self._timer.start()
        else:
            self._kill()  # asked twice: stop waiting for the cleanup

    def _kill(self) -> None:
        for pgid in (self.pgid if self.local else None, self.proc.pid):
            if pgid:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, signal.SIGKILL)

    @contextlib.contextmanager
    def stoppable(self):
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {s: signal.signal(s, self._stop) for s in STOP_SIGNALS}
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)


def _verdict(name: str, resolved: Resolved, host, target_host, rc: int, lines: list[str], seconds: float,
             stopped_by: str | None) -> StepResult:
    says = [ln.split("]: ", 1)[1] for ln in lines if ln.startswith("envport[") and "]: " in ln]
    stopped = _interrupted(name, lines, says, seconds, stopped_by)
    if stopped is not None:
        return stopped
    if rc == 0:
        return _built(name, resolved, host, lines, says, seconds)
    if rc == 3:
        return _refused(name, lines, seconds)
    return _failed(name, host, target_host, rc, lines, says, seconds)


def _interrupted(name: str, lines: list[str], says: list[str], seconds: float,
                 stopped_by: str | None) -> StepResult | None:
    """The build was stopped (envport was sent a signal, or the script says it was): whatever its exit code."""
    said = next((s for s in says if s.startswith("INTERRUPTED by ")), None)
    if not (stopped_by or said):
        return None
    # The script only ever sees SIGTERM from the wrapper; what envport was sent is the news.
    why = f"stopped by {stopped_by} to envport" if stopped_by else said[len("INTERRUPTED "):]
    if said:
        why += "; " + said.split(": ", 1)[-1]
    if stopped_by:
        # "INTERRUPTED by SIGTERM" is the wrapper passing the stop on; shown, it hid the SIGINT the user sent.
        lines = [ln for ln in lines if "]: INTERRUPTED by " not in ln]
    return StepResult(name, Verdict.FAILED, why, reason=INTERRUPTED_REASON, lines=lines[-30:], seconds=seconds)


def _built(name: str, resolved: Resolved, host, lines: list[str], says: list[str], seconds: float) -> StepResult:
    """Exit 0: the env was built (OK, naming the hash it replaced) or was already there (PRESENT)."""
    prefix = next((m.group(1) for ln in reversed(lines) if (m := PREFIX_RE.search(ln))), None)
    detail = {"prefix": prefix, "ssh_host": host}
    present = any(s.startswith("present ") and "@" in s for s in says[-3:])
    verdict = Verdict.PRESENT if present else Verdict.OK
    replaced = next((m.group(1) for s in says if (m := REPLACED_RE.match(s))), None)
    if replaced and verdict is Verdict.OK:
        detail["replaced"] = replaced
    return StepResult(name, verdict, f"{resolved.identity.ref} at {prefix}", seconds=seconds,
                      data={k: v for k, v in detail.items() if v})


def _refused(name: str, lines: list[str], seconds: float) -> StepResult:
    """Exit 3: the script refused, with its reason on its last `REFUSED [reason]: why` line."""
    m = next((REFUSED_RE.search(ln) for ln in reversed(lines) if REFUSED_RE.search(ln)), None)
    reason, why = (m.group(1), m.group(2)) if m else ("refused", lines[-1] if lines else "")
    return StepResult(name, Verdict.REFUSED, why, reason=reason, seconds=seconds)


def _failed(name: str, host, target_host, rc: int, lines: list[str], says: list[str], seconds: float) -> StepResult:
    """Any other exit: the first cause the script's words name (not present, a pin, a swapped hash, an
    unreachable host), else the exit code with the output's tail."""
    not_present = next((s for s in says if s.startswith("NOT PRESENT: ")), None)
    if not_present:
        return StepResult(name, Verdict.FAILED, not_present[len("NOT PRESENT: "):], reason="not_present",
                          seconds=seconds)
    pins = [s[len("FAILED pin "):] for s in says if s.startswith("FAILED pin ")]
    if pins:
        return StepResult(name, Verdict.FAILED, pins[0], reason="pin_mismatch", lines=pins, seconds=seconds)
    from envport.builders.lock import hash_mismatches

    swapped = hash_mismatches(lines)
    if swapped:
        return StepResult(name, Verdict.FAILED, f"{swapped[0]}; that phase installed nothing",
                          reason="hash_mismatch", lines=swapped, seconds=seconds)
    last = "\n".join(lines[-3:])
    if target_host is not None and is_unreachable(rc, last):
        return unreachable(name, host, last, seconds)
    return StepResult(name, Verdict.FAILED, f"setup script exited {rc}", lines=lines[-30:], seconds=seconds)

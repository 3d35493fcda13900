"""core/proc: the helpers every module that runs a command shares."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from envport.core.proc import run, spawn, stream_lines

PARENT = """
import subprocess, sys, signal
from envport.core.proc import dies_with_parent
child = subprocess.Popen(["sleep", "300"], preexec_fn=dies_with_parent(getattr(signal, sys.argv[1])))
print(child.pid, flush=True)
child.wait()
"""


def _state(pid: int) -> str:
    """The process's /proc state letter, "" once it is gone (a zombie counts as gone: it ended)."""
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""
    return "" if state == "Z" else state


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGKILL"])
def test_a_child_dies_with_its_sigkilled_parent(sig):
    """What the docker client, mksquashfs and the SIF mount holder rely on: envport SIGKILLed, they go too."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT, sig], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    try:
        assert _state(child), "the child never started"
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)
        deadline = time.monotonic() + 30
        while _state(child):  # polled with a bound: the kernel sends SIG as the parent exits
            assert time.monotonic() < deadline, f"sleep {child} outlived its SIGKILLed parent"
            time.sleep(0.05)
    finally:
        if _state(child):
            os.kill(child, signal.SIGKILL)
        parent.stdout.close()


def test_run_tells_not_installed_from_failed():
    missing = run(["envport-no-such-tool-x"])
    assert missing.returncode is None and not missing.ok and "envport-no-such-tool-x" in missing.why
    failed = run(["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert (failed.returncode, failed.stdout, failed.stderr, failed.ok) == (3, "out\n", "err\n", False)


def test_run_keeps_bytes_reads_a_pipe_and_says_it_timed_out(tmp_path):
    from envport.core.proc import spawn
    raw = run(["printf", "\\377\\000x"], binary=True)
    assert raw.ok and raw.stdout == b"\xff\x00x"
    here = run(["pwd"], cwd=tmp_path)
    assert here.stdout.strip() == str(tmp_path)
    source = spawn(["printf", "a\\nb\\n"])
    try:
        counted = run(["wc", "-l"], stdin_from=source.stdout)
    finally:
        source.stdout.close()
        source.wait()
    assert counted.stdout.strip() == "2"
    slow = run(["sleep", "30"], timeout=0.5)
    assert slow.timed_out and slow.returncode is None and "within" in slow.why
    assert not run(["envport-no-such-tool-x"]).timed_out


def test_spawn_joins_stderr_to_stdout_in_order_and_reads_no_terminal():
    from envport.core.proc import spawn
    child = spawn(["sh", "-c", "echo one; echo two >&2; read x || echo no-stdin"], text=True)
    out = child.stdout.read()
    child.stdout.close()
    assert child.wait() == 0 and out == "one\ntwo\nno-stdin\n"


def test_stream_lines_feeds_each_line_and_stops_the_child_when_the_reader_fails():
    """The build clients' runner (engines/docker.run_buildkit, engines/podman.build): every line reaches the
    caller, and a caller that raises (an interrupt) leaves no child running."""
    seen = []
    proc = spawn(["sh", "-c", "echo one; echo two; exit 3"], text=True)
    assert stream_lines(proc, seen.append) == 3 and seen == ["one\n", "two\n"]

    proc = spawn(["sh", "-c", "echo go; exec sleep 300"], text=True)

    def stop(line):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        stream_lines(proc, stop, grace_s=5)
    assert proc.poll() is not None, "the child still runs after the reader was interrupted"

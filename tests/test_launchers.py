"""Launchers: the deadline runner, the local launcher, and docker (argv always; the real engine through the
docker_client / base_image / demo_image fixtures, never "whatever image is tagged latest").

The Ctrl-C tests set SIGINT's default handler themselves: pytest started as a background job inherits
SIGINT ignored, and then no KeyboardInterrupt could ever arrive. They send it on an event (the
command or container is running), not after a fixed sleep.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from envport.witness.launchers.base import WITNESS_DIR, Invocation, run_with_deadline

from envport.witness.launchers.docker import DockerLauncher

from envport.witness.launchers.local import LocalLauncher
from envport.witness.launchers.docker import MOUNT_POINT
from envport.core.verdict import Verdict
from envport.witness.judge import parse_sentinels

from .support import needs_bwrap


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


# --- the deadline runner -------------------------------------------------------


def test_deadline_stops_the_whole_process_group_and_runs_cleanup(tmp_path):
    marker = tmp_path / "cleaned"
    inv = Invocation(["/bin/sh", "-c", "sleep 300 & echo child $!; wait"], cleanup=[["touch", str(marker)]])
    res = run_with_deadline(inv, 5.0)
    assert res.timed_out and res.returncode is None
    assert "child " in res.output, f"the command never started: {res.output!r}"
    _wait_gone(int(res.output.split("child ")[1].split()[0]))
    assert marker.exists()


def test_normal_exit_keeps_output_and_skips_cleanup(tmp_path):
    marker = tmp_path / "cleaned"
    seen: list[str] = []
    inv = Invocation(["/bin/sh", "-c", "echo one; echo two >&2; exit 3"], cleanup=[["touch", str(marker)]])
    res = run_with_deadline(inv, 30, on_line=seen.append)
    assert (res.returncode, res.timed_out) == (3, False)
    assert res.lines == ["one", "two"] and seen == ["one", "two"]
    assert not marker.exists()


@pytest.fixture
def sigint_raises():
    """SIGINT raises KeyboardInterrupt in this test, whatever disposition pytest inherited."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


def _wait_gone(pid: int, limit: float = 10.0) -> None:
    deadline = time.monotonic() + limit
    while _alive(pid):
        assert time.monotonic() < deadline, f"pid {pid} outlived the stop by {limit}s"
        time.sleep(0.1)


def test_ctrl_c_stops_the_command_runs_cleanup_and_propagates(tmp_path, sigint_raises):
    marker = tmp_path / "cleaned"
    inv = Invocation(["/bin/sh", "-c", "sleep 300 & echo child $!; wait"], cleanup=[["touch", str(marker)]])
    children: list[int] = []

    def on_line(line: str) -> None:
        if line.startswith("child "):  # the command runs: now Ctrl-C
            children.append(int(line.split()[1]))
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(KeyboardInterrupt):
        run_with_deadline(inv, 120, on_line=on_line)
    assert children, "the command never started"
    _wait_gone(children[0])
    assert marker.exists()


# --- local ---------------------------------------------------------------------


def test_local_launcher_runs_a_witness_in_place():
    launcher = LocalLauncher(sys.executable, base_env={"PATH": os.environ["PATH"], "KEEP": "1"})
    inv = launcher.invocation("basic.py", ["--import", "json"], {"EXTRA": "2"})
    assert inv.argv == [sys.executable, str(WITNESS_DIR / "basic.py"), "--import", "json"]
    assert inv.env["KEEP"] == "1" and inv.env["EXTRA"] == "2"
    res = launcher.run("basic.py", ["--import", "json"], {}, 60)
    assert res.returncode == 0
    assert {r["check"] for r in parse_sentinels(res.output)} == {"python", "import"}


def test_local_launcher_refuses_a_missing_interpreter(tmp_path):
    problem = LocalLauncher(tmp_path / "nope" / "python").preflight()
    assert problem is not None and problem.verdict is Verdict.REFUSED and problem.reason == "env_missing"


def test_activated_env_reads_env_sh_exactly_and_names_a_script_that_fails(tmp_path):
    from envport.core.errors import EnvportError
    from envport.witness.launchers.local import activated_env

    script = tmp_path / ".envport" / "env.sh"
    script.parent.mkdir()
    script.write_text("export MULTI=$'one\\ntwo=2'\n")
    env = activated_env(tmp_path, {"PATH": os.environ["PATH"]})
    assert env["MULTI"] == "one\ntwo=2" and env["VIRTUAL_ENV"] == str(tmp_path)
    script.write_text("export A=1\necho 'env.sh: no such thing' >&2; false\n")
    with pytest.raises(EnvportError) as err:
        activated_env(tmp_path, {"PATH": os.environ["PATH"]})
    assert str(err.value).startswith(f"{script}: sourcing it in bash failed: env.sh: no such thing (fix: ")
    assert err.value.exit_code == 1


def _weight_arg(folder) -> str:
    import hashlib
    import json

    data = (folder / "w.bin").read_bytes()
    return json.dumps({"name": "w", "env": "W_DIR", "path": "/weights/w",
                       "files": [{"path": "w.bin", "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}]})


def _weights(tmp_path):
    folder = tmp_path / "weights"
    folder.mkdir()
    (folder / "w.bin").write_bytes(b"weight" * 100)
    return folder


def test_local_launcher_binds_the_weights_read_only_under_bwrap(tmp_path):
    """The weight step reads through the variable from a read-only bind, and a write under it is EROFS."""
    needs_bwrap()
    folder = _weights(tmp_path)
    launcher = LocalLauncher(sys.executable, base_env={"PATH": os.environ["PATH"], "W_DIR": str(folder)},
                             read_only=[str(folder)])
    write = '{"cmd": "touch \\"$W_DIR/new\\"", "expect": "Read-only file system"}'
    res = launcher.run("basic.py", ["--weight", _weight_arg(folder), "--cli", write], {}, 60)
    records = {r["check"]: r for r in parse_sentinels(res.output)}
    assert res.returncode == 0, res.output
    assert records["weight"]["ok"] and records["weight"]["read_only"] is True, records["weight"]
    assert records["cli"]["ok"], records["cli"]
    assert not (folder / "new").exists()
    # Outside the run the folder is as writable as before.
    (folder / "after").write_text("x")


def test_local_launcher_says_why_the_weights_stay_writable_without_bwrap(tmp_path):
    folder = _weights(tmp_path)
    empty = tmp_path / "bin"
    empty.mkdir()
    launcher = LocalLauncher(sys.executable, base_env={"PATH": str(empty), "W_DIR": str(folder)},
                             read_only=[str(folder)])
    inv = launcher.invocation("basic.py", [], {})
    assert inv.argv[0] == sys.executable  # run as it is, not under bwrap
    res = launcher.run("basic.py", ["--weight", _weight_arg(folder)], {}, 60)
    (rec,) = [r for r in parse_sentinels(res.output) if r["check"] == "weight"]
    assert rec["ok"] and rec["read_only"] is False
    assert rec["writable_why"] == "no bwrap on this host (apt install bubblewrap)", rec


def test_a_deadline_reaches_the_witness_through_bwrap(tmp_path):
    """bwrap forwards no signal: the group's SIGTERM must still reach the witness (its stack dump), and
    nothing may outlive the stop."""
    needs_bwrap()
    folder = _weights(tmp_path)
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "hang.py").write_text(
        "import os, signal, sys, time\n"
        "def term(*_):\n"
        "    print('witness got TERM', flush=True)\n"
        "    sys.exit(3)\n"
        "signal.signal(signal.SIGTERM, term)\n"
        "print('pid', os.getpid(), flush=True)\n"
        "time.sleep(300)\n")
    launcher = LocalLauncher(sys.executable, witness_dir=scripts, base_env={"PATH": os.environ["PATH"]},
                             read_only=[str(folder)])
    assert launcher.invocation("hang.py", [], {}).argv[4].endswith("bwrap")
    res = launcher.run("hang.py", [], {}, 5.0)
    assert res.timed_out, res.output
    assert "pid " in res.output, f"the witness never started: {res.output!r}"
    assert "witness got TERM" in res.output, res.output
    _wait_gone(int(res.output.split("pid ")[1].split()[0]))


# --- docker: the command line ---------------------------------------------------


def test_docker_argv_is_hardened_and_names_each_container():
    launcher = DockerLauncher("envport/x:abc123")
    a = launcher.invocation("dist.py", ["--world-size", "2"], {"K": "v w"})
    b = launcher.invocation("dist.py", [], {})
    argv = a.argv
    assert argv[:5] == ["docker", "run", "--rm", "--init", "--network"] and argv[5] == "host"
    assert f"{WITNESS_DIR}:{MOUNT_POINT}:ro" in argv
    assert "--ipc" in argv and "--gpus" not in argv
    assert argv[argv.index("-e") + 1] == "K=v w"
    image_at = argv.index("envport/x:abc123")
    assert argv[image_at + 1:] == ["python3", f"{MOUNT_POINT}/dist.py", "--world-size", "2"]
    assert a.label != b.label and a.label.startswith("envport-witness-")
    assert a.cleanup == [["docker", "rm", "-f", a.label]]


def test_docker_gpus_and_shm_options():
    gpu = DockerLauncher("img", gpus=True, shm_size="8g").invocation("kernel.py", [], {}).argv
    assert gpu[gpu.index("--gpus") + 1] == "all"
    assert gpu[gpu.index("--shm-size") + 1] == "8g" and "--ipc" not in gpu


def test_docker_preflight_refuses_without_a_client():
    problem = DockerLauncher("img", docker="/nonexistent/docker").preflight()
    assert problem.verdict is Verdict.REFUSED and problem.reason == "docker_unreachable"


# --- docker: a real engine --------------------------------------------------------


def test_docker_preflight_refuses_a_missing_image(docker_client):
    problem = DockerLauncher("envport/no-such-image:000000000000").preflight()
    assert problem.verdict is Verdict.REFUSED and problem.reason == "image_missing"


def test_docker_runs_the_mounted_witness(base_image):
    launcher = DockerLauncher(base_image)
    res = launcher.run("basic.py", ["--import", "json", "--cli", '{"cmd": "echo $WIT", "expect": "^mounted$"}'],
                       {"WIT": "mounted"}, 120)
    recs = {(r["check"], r["name"]): r for r in parse_sentinels(res.output)}
    assert res.returncode == 0, res.output
    assert recs[("import", "json")]["ok"] and recs[("cli", "echo $WIT")]["ok"]


def _containers(name: str, *filters: str) -> str:
    argv = ["docker", "ps", "-a", "-q", "--filter", f"name={name}"]
    for f in filters:
        argv += ["--filter", f]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout.strip()


def _when_running(label: str, then=None, limit: float = 60.0) -> tuple[threading.Thread, list[bool]]:
    """A thread that polls (bounded) until the container LABEL runs, records it, then calls THEN."""
    seen: list[bool] = []

    def watch() -> None:
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            if _containers(label, "status=running"):
                seen.append(True)
                break
            time.sleep(0.2)
        if then is not None:
            then()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread, seen


SLEEPER = ["--cli", '{"cmd": "sleep 300", "expect": "x"}', "--timeout", "600"]


def test_docker_timeout_removes_the_container(base_image):
    inv = DockerLauncher(base_image).invocation("basic.py", SLEEPER, {})
    watcher, seen = _when_running(inv.label, limit=20.0)
    res = run_with_deadline(inv, 20.0)
    watcher.join()
    assert seen, f"container {inv.label} never ran before the deadline: nothing was tested"
    assert res.timed_out
    assert _containers(inv.label) == "", f"container {inv.label} survived the deadline"


def test_docker_ctrl_c_removes_the_container(base_image, sigint_raises):
    inv = DockerLauncher(base_image).invocation("basic.py", SLEEPER, {})
    watcher, seen = _when_running(inv.label, then=lambda: os.kill(os.getpid(), signal.SIGINT))
    with pytest.raises(KeyboardInterrupt):
        run_with_deadline(inv, 120)
    watcher.join()
    assert seen, f"container {inv.label} never ran before Ctrl-C: nothing was tested"
    assert _containers(inv.label) == ""


def test_docker_collectives_with_torch_image(demo_image):
    from envport.spec.model import Spec
    from envport.witness.plan import WitnessOptions
    from envport.witness.run import run_witnesses

    spec = Spec(name="wit", base="debian:bookworm", python="3.11",
                witnesses={"kernel": True, "collectives": {"world_size": 2}})
    results = run_witnesses(spec, DockerLauncher(demo_image.tag), WitnessOptions(only=["kernel", "collectives"]))
    assert [r.verdict for r in results] == [Verdict.OK, Verdict.OK], [(r.detail, r.lines) for r in results]

"""envport.builders.apptainer.post_runner: %files then %post inside a real rootfs, and nothing left behind.

Needs root, `bwrap` (Debian package bubblewrap) and the docker engine with the
base image (tests/apptainer_rootfs.py exports its rootfs); each test skips with
the reason when one is missing.

apptainer mounts the host's /tmp over the image's during %post, so nothing %post
needs may live under /tmp: these tests put their %files elsewhere, and one
checks that the runner hides the image's /tmp the same way.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from envport.builders.apptainer.deffile import parse_def
from envport.builders.apptainer.post_runner import (RunnerError, copy_files, mounts_under, remove_rootfs,
                                                 resolve_in_root, run_post)
from envport.builders.apptainer.singularity_d import prepare_rootfs


# The rootfs, image_config and base_rootfs_tar fixtures (docker base image exported).
pytest_plugins = ["tests.apptainer_rootfs"]

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="%post runs as root, as apptainer's root build does"),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bwrap missing: apt-get install bubblewrap"),
]


def def_with(post: str, files: str = "") -> object:
    text = "Bootstrap: docker\nFrom: envport/debian-bookworm:base\n"
    if files:
        text += "\n%files\n" + files
    return parse_def(text + "\n%post\n" + textwrap.dedent(post), "t.def")


@pytest.fixture
def context(tmp_path: Path) -> Path:
    ctx = tmp_path / "ctx"
    (ctx / "files" / "tree" / "sub").mkdir(parents=True)
    (ctx / "files" / "tool.py").write_text("print('tool')\n")
    (ctx / "files" / "tree" / "sub" / "leaf.txt").write_text("leaf\n")
    (ctx / "files" / "link.txt").symlink_to("tool.py")
    return ctx


def test_post_writes_files_and_reports_steps(rootfs: Path, image_config: dict):
    prepare_rootfs(rootfs, image_env=image_config["Env"])
    d = def_with("""\
        set -eu
        # step 1/2 base: base
        echo 'envport: step 1/2 base'
        echo "home=$HOME pwd=$(pwd) pid=$$ lang=$LANG" > /opt/made-by-post
        # step 2/2 labels: labels
        echo 'envport: step 2/2 labels'
        echo 'export FROM_POST=1' >> "$APPTAINER_ENVIRONMENT"
        echo 'from.post yes' >> "$APPTAINER_LABELS"
        env | sort > /opt/post-env
        """)
    lines: list[str] = []
    result = run_post(d, rootfs, on_line=lines.append)
    assert result.ok and (result.rc, result.timed_out) == (0, False), result.tail
    assert [ln for ln in lines if ln.startswith("envport: step")] == ["envport: step 1/2 base",
                                                                       "envport: step 2/2 labels"]
    assert "+ set -eu" in lines  # /bin/sh -ex: the trace is in the output
    assert result.step.n == 2 and result.step.marker == "labels"
    # cwd /, HOME /root, in its own PID namespace, the image's ENV (LANG) sourced from env/10-*.
    assert (rootfs / "opt/made-by-post").read_text() == "home=/root pwd=/ pid=2 lang=C.UTF-8\n"
    env = dict(line.split("=", 1) for line in (rootfs / "opt/post-env").read_text().splitlines())
    assert env["PATH"] == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    assert not {"VIRTUAL_ENV", "PYTEST_CURRENT_TEST", "USER"} & set(env)  # --cleanenv
    assert env["APPTAINER_LABELS"] == "/.build.labels"
    assert "export FROM_POST=1" in (rootfs / ".singularity.d/env/91-environment.sh").read_text()
    assert (rootfs / ".build.labels").read_text() == "from.post yes\n"
    assert not (rootfs / ".post.script").exists()
    assert mounts_under(rootfs) == []


def test_failing_step_is_named_with_the_tail(rootfs: Path):
    d = def_with("""\
        set -eu
        # step 1/3 base: base
        echo 'envport: step 1/3 base'
        # step 2/3 pip-1: pip phase 1: nothing
        echo 'envport: step 2/3 pip phase 1: nothing'
        echo 'about to fail'
        ls /definitely/not/here
        # step 3/3 labels: labels
        echo 'envport: step 3/3 labels'
        """)
    result = run_post(d, rootfs)
    assert result.rc != 0 and not result.ok
    assert (result.step.n, result.step.marker, result.step.title) == (2, "pip-1", "pip phase 1: nothing")
    assert result.step.line == 9  # the echo line in the .def
    assert "about to fail" in result.tail
    assert any("/definitely/not/here" in line for line in result.tail[-2:])
    assert not any("step 3/3" in line for line in result.tail)


def test_tail_keeps_the_last_40_lines(rootfs: Path):
    result = run_post(def_with("set +x\ni=0\nwhile [ $i -lt 100 ]; do echo line $i; i=$((i+1)); done\n"), rootfs)
    assert result.ok and len(result.tail) == 40 and result.tail[-1] == "line 99"


def test_files_are_copied_before_post_and_visible_there(rootfs: Path, context: Path):
    d = def_with("""\
        test "$(cat /opt/app/tool.py)" = "print('tool')"
        test -f /opt/app/tree/sub/leaf.txt
        test -f /srv/link.txt && test ! -L /srv/link.txt
        test -f /files/tool.py
        echo seen > /opt/app/seen
        """, files='    "files/tool.py" "/opt/app/tool.py"\n    files/tree /opt/app/tree\n'
                   '    files/link.txt /srv/\n    files/tool.py\n')
    copied = copy_files(d, rootfs, context)
    assert copied == ["/opt/app/tool.py", "/opt/app/tree", "/srv/link.txt", "/files/tool.py"]
    result = run_post(d, rootfs)
    assert result.ok, result.tail
    assert (rootfs / "opt/app/seen").read_text() == "seen\n"


def test_relative_rootfs_and_context_paths(rootfs: Path, context: Path, monkeypatch):
    monkeypatch.chdir(rootfs.parent)
    d = def_with("test -f /opt/rel/tool.py\n", files="    files/tool.py /opt/rel/tool.py\n")
    rel_context = os.path.relpath(context, rootfs.parent)
    assert copy_files(d, "rootfs", rel_context) == ["/opt/rel/tool.py"]
    assert run_post(d, "rootfs").ok


def test_files_under_tmp_are_hidden_from_post_as_under_apptainer(rootfs: Path, context: Path):
    d = def_with("test -f /tmp/tool.py\n", files='    "files/tool.py" "/tmp/tool.py"\n')
    copy_files(d, rootfs, context)
    assert (rootfs / "tmp/tool.py").is_file()
    result = run_post(d, rootfs)
    assert result.rc == 1, "apptainer hides the image's /tmp during %post; so must we"


def test_tmp_is_world_writable_for_apts_sandbox_user(rootfs: Path):
    # apt-get update writes its temporary files as `_apt` under /tmp: a 0755 tmpfs failed it (measured).
    result = run_post(def_with("stat -c '%n=%a' /tmp /var/tmp\n"), rootfs)
    assert result.rc == 0, result.tail
    assert "/tmp=1777" in result.tail and "/var/tmp=1777" in result.tail, result.tail


def test_files_cannot_escape_the_rootfs_through_image_symlinks(rootfs: Path, context: Path, tmp_path: Path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (rootfs / "opt" / "evil").symlink_to(outside)  # absolute: means /<outside> inside the image
    d = def_with(":\n", files='    files/tool.py /opt/evil/tool.py\n')
    copy_files(d, rootfs, context)
    assert not list(outside.iterdir())
    assert (rootfs / str(outside).lstrip("/") / "tool.py").is_file()
    assert resolve_in_root(rootfs, "/opt/evil" + "/.." * 30 + "/etc/passwd") == rootfs / "etc/passwd"


def test_missing_files_source_is_refused(rootfs: Path, context: Path):
    d = def_with(":\n", files="    files/nope.py /opt/nope.py\n")
    with pytest.raises(RunnerError) as err:
        copy_files(d, rootfs, context)
    assert err.value.reason == "missing_source" and "files/nope.py" in str(err.value)
    assert str(err.value).startswith("t.def:5: ")


def test_timeout_kills_post(rootfs: Path):
    # Judged by what ended it, not by a clock: the line after the sleep never ran, and the shell died of SIGKILL.
    result = run_post(def_with("echo start\nsleep 30\necho after-the-sleep\n"), rootfs, timeout_s=1)
    assert result.timed_out and result.rc == -signal.SIGKILL, result
    assert "start" in result.tail and "after-the-sleep" not in result.tail, result.tail


def test_sigkill_of_the_builder_leaves_no_process_and_no_mount(rootfs: Path):
    code = textwrap.dedent(f"""
        from envport.builders.apptainer.deffile import parse_def
        from envport.builders.apptainer.post_runner import run_post
        d = parse_def("Bootstrap: docker\\nFrom: x\\n%post\\n    echo started\\n"
                      "    sleep 300 & sleep 301\\n    wait\\n", "t.def")
        run_post(d, {str(rootfs)!r}, on_line=lambda line: print(line, flush=True))
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        for line in proc.stdout:
            if line.strip() == "started":
                break
        # Polled (bounded) until both sleeps run: bwrap, its namespace init, %post's shell, two sleeps.
        deadline = time.monotonic() + 30
        while len(_sleeps(sandbox := _descendants(proc.pid))) < 2:
            assert time.monotonic() < deadline, f"the %post's two sleeps never ran: {sandbox}"
            time.sleep(0.05)
        assert len(sandbox) >= 4, f"the %post did not start: {sandbox}"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    deadline = time.monotonic() + 10
    while _alive(sandbox) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _alive(sandbox) == []
    assert mounts_under(rootfs) == []
    remove_rootfs(rootfs)  # a killed build's rootfs is never reused: deleting it must work
    assert not rootfs.exists()


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _sleeps(pids: list[int]) -> list[int]:
    """Those of PIDS running `sleep 300` or `sleep 301` (the %post's two)."""
    found = []
    for pid in pids:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[:2] in ([b"sleep", b"300"], [b"sleep", b"301"]):
            found.append(pid)
    return found


def _alive(pids: list[int]) -> list[int]:
    """Those of PIDS still running (zombies waiting to be reaped count as gone)."""
    alive = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            alive.append(pid)
    return alive


def test_remove_rootfs_refuses_while_something_is_mounted(tmp_path: Path):
    root = tmp_path / "rootfs"
    (root / "proc").mkdir(parents=True)
    (root / "keep").write_text("x")
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(root / "proc")], check=True)
    try:
        with pytest.raises(RunnerError) as err:
            remove_rootfs(root)
        assert err.value.reason == "busy" and str(root / "proc") in str(err.value)
        assert (root / "keep").exists()
    finally:
        subprocess.run(["umount", str(root / "proc")], check=True)
    remove_rootfs(root)
    assert not root.exists()
    remove_rootfs(root)  # gone already: nothing to do


def test_remove_rootfs_finds_mount_points_with_spaces(tmp_path: Path):
    root = tmp_path / "with space"
    (root / "a dir").mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(root / "a dir")], check=True)
    try:
        assert mounts_under(root) == [str(root / "a dir")]
    finally:
        subprocess.run(["umount", str(root / "a dir")], check=True)
    assert mounts_under(root) == []


def test_refuses_a_rootfs_without_sh(tmp_path: Path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(RunnerError) as err:
        run_post(def_with("echo hi\n"), tmp_path / "empty")
    assert err.value.reason == "no_shell"

"""The shell builder's contract, each of issue 8's venv reproductions against a real venv.

Every build runs the real CLI (`envport build NAME --target venv`), the real setup script and real
pip installs of small local wheels (tests/tinywheels.py: no network, no torch, seconds per build),
into a throwaway ENVPORT_ENVS_DIR.  "Equal to a fresh build" compares `pip freeze --all` and the env
block with a build of the same spec into an empty envs dir.

The SIGTERM/SIGINT tests signal the real envport process and look for the build's real process tree
(bash, pip, a run command's `sleep`) in /proc by a marker variable the spec exports; the SSH one
builds on the test sshd, which runs on this machine, so the same /proc scan sees the remote side.
"""

from __future__ import annotations

import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from .support import REPO, wait_until
from .tinywheels import ShellProject, env_vars, freeze, make_wheelhouse, spec_data

NAME = "tiny"


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory) -> Path:
    return make_wheelhouse(tmp_path_factory.mktemp("wheels"))


@pytest.fixture
def proj(tmp_path, wheelhouse) -> ShellProject:
    p = ShellProject.make(tmp_path / "project", wheelhouse)
    shutil.copytree(REPO / "sites", p.root / "sites")  # the site's `test` SSH host
    return p


def fresh(proj: ShellProject, data: dict, tag: str) -> tuple[list[str], dict]:
    """freeze and env block of a build of DATA into an empty envs dir."""
    other = ShellProject.make(proj.root.parent / f"fresh-{tag}", proj.wheelhouse)
    shutil.copytree(proj.root / "sites", other.root / "sites")  # the same site: the same hash
    other.write(data)
    built = other.build(data["name"])
    assert built.rc == 0 and built.verdict == "OK", built.why()
    return freeze(other.prefix(data["name"])), env_vars(other.prefix(data["name"]))


def assert_fresh(proj: ShellProject, data: dict, tag: str) -> None:
    prefix = proj.prefix(data["name"])
    want_freeze, want_env = fresh(proj, data, tag)
    assert freeze(prefix) == want_freeze
    assert env_vars(prefix) == {**want_env, "ENVPORT_ROOT": str(prefix / "root")}


def site_packages(prefix: Path) -> Path:
    return next(prefix.glob("lib/python3*/site-packages"))


# --- the env equals a fresh build of its spec --------------------------------------------------


def test_editing_a_pin_and_back_rebuilds_each_time(proj):
    """Issue: `numpy==2.0.2` -> `1.26.4` -> back said `present` and kept 1.26.4."""
    v2 = spec_data(NAME, [["beta==1.0"], ["alpha==2.0"]], env={"GREETING": "hi"})
    v1 = spec_data(NAME, [["beta==1.0"], ["alpha==1.0"]], env={"GREETING": "hi"})
    for data, want in ((v2, "alpha==2.0"), (v1, "alpha==1.0"), (v2, "alpha==2.0")):
        proj.write(data)
        built = proj.build(NAME)
        assert built.rc == 0 and built.verdict == "OK", built.why()
        assert want in freeze(proj.prefix(NAME))
    assert_fresh(proj, v2, "v2")
    again = proj.build(NAME)
    assert again.verdict == "present", again.why()
    # The env works at its name after the swap: console scripts, activate and the env block.
    prefix = proj.prefix(NAME)
    cli = subprocess.run([str(prefix / "bin" / "alpha-cli")], capture_output=True, text=True, timeout=60)
    assert cli.stdout == "alpha 2.0\n", cli
    act = subprocess.run(["bash", "-c", '. "$1/bin/activate" && echo "$GREETING" && python -c "import alpha"',
                          "x", str(prefix)], capture_output=True, text=True, timeout=60)
    assert act.returncode == 0 and act.stdout == "hi\n", act


def test_removing_a_package_removes_what_it_pulled(proj):
    """Issue: removing torchmetrics from a phase left it and its deps installed."""
    with_gamma = spec_data(NAME, [["alpha==1.0"], ["gamma==1.0", "epsilon==1.0"]])
    proj.write(with_gamma)
    assert proj.build(NAME).verdict == "OK"
    assert {"gamma==1.0", "delta==1.1"} <= set(freeze(proj.prefix(NAME)))
    without = spec_data(NAME, [["alpha==1.0"], ["epsilon==1.0"]])
    proj.write(without)
    built = proj.build(NAME)
    assert built.verdict == "OK", built.why()
    names = {line.split("==")[0] for line in freeze(proj.prefix(NAME))}
    assert "gamma" not in names and "delta" not in names
    assert_fresh(proj, without, "without")
    # Nothing of the replaced builds is left beside the env.
    builds = proj.envs_dir / f".{NAME}.builds"
    assert [p.name for p in builds.iterdir()] == [os.readlink(proj.prefix(NAME)).rsplit("/", 1)[1]]


def test_a_deleted_package_is_not_present_and_rebuild_starts_from_nothing(proj):
    """Issue: `rm -rf site-packages/einops`: `present`, and `--rebuild` said OK with einops still missing."""
    data = spec_data(NAME, [["alpha==1.0", "epsilon==1.0"]])
    proj.write(data)
    assert proj.build(NAME).verdict == "OK"
    prefix = proj.prefix(NAME)
    shutil.rmtree(site_packages(prefix) / "epsilon")

    check = proj.build(NAME, "--check")
    assert check.rc == 1 and check.last["reason"] == "not_present", check.why()
    assert "epsilon lost 1 installed file(s): epsilon/__init__.py" in check.last["detail"]
    assert not (site_packages(prefix) / "epsilon").exists(), "--check must build nothing"

    built = proj.build(NAME)
    assert built.verdict == "OK", built.why()
    assert "building: the env at" in built.proc.stderr and "epsilon lost" in built.proc.stderr
    assert (site_packages(prefix) / "epsilon" / "__init__.py").is_file()

    shutil.rmtree(site_packages(prefix) / "epsilon")
    rebuilt = proj.build(NAME, "--rebuild")
    assert rebuilt.verdict == "OK", rebuilt.why()
    assert (site_packages(prefix) / "epsilon" / "__init__.py").is_file()
    assert_fresh(proj, data, "deleted")


def test_a_pin_a_later_phase_moved_fails_naming_the_fix_and_the_snap_back_holds(proj):
    """Issue: scanpy-cpu pinned numpy 1.26.4 in phase 1, ended with 2.0.2, and the build said OK."""
    old = spec_data(NAME, [["epsilon==1.0"]])
    proj.write(old)
    assert proj.build(NAME).verdict == "OK"
    moved = spec_data(NAME, [["alpha==1.0"], ["beta==2.0"]])  # beta 2.0 requires alpha>=2
    proj.write(moved)
    built = proj.build(NAME)
    assert built.rc == 1 and built.verdict == "FAILED" and built.last["reason"] == "pin_mismatch", built.why()
    assert built.last["detail"].startswith(
        "alpha==1.0 (pinned by pip phase 1): alpha 2.0 won (pip phase 2 moved it); fix: ")
    assert 'snap-back phase after pip phase 2: {packages: ["alpha==1.0"], no_deps: true, force_reinstall: true}' \
        in built.last["detail"]
    # The failed build was not swapped in: the old env is still there, whole.
    assert "epsilon==1.0" in freeze(proj.prefix(NAME))

    snapped = spec_data(NAME, [["alpha==1.0"], ["beta==2.0"],
                               {"packages": ["alpha==1.0"], "no_deps": True, "force_reinstall": True}])
    proj.write(snapped)
    built = proj.build(NAME)
    assert built.verdict == "OK", built.why()
    assert {"alpha==1.0", "beta==2.0"} <= set(freeze(proj.prefix(NAME)))


# --- interrupts, the lock ------------------------------------------------------------------------


class Background:
    """`envport build` running in the background, its progress lines collected as they come."""

    def __init__(self, proj: ShellProject, *args: str, **extra: str):
        self.proc = subprocess.Popen(proj.argv(NAME, *args), cwd=proj.root, env=proj.env(**extra),
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self._q: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self._q.put(line.rstrip("\n"))

    def wait_for(self, needle: str, timeout: float = 120) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            hit = next((ln for ln in self.lines if needle in ln), None)
            if hit:
                return hit
            try:
                self.lines.append(self._q.get(timeout=0.2))
            except queue.Empty:
                if self.proc.poll() is not None and self._q.empty():
                    break
        raise AssertionError(f"{needle!r} never came; got:\n" + "\n".join(self.lines[-30:]))

    def finish(self, timeout: float = 300) -> tuple[int, str]:
        out, _ = self.proc.communicate(timeout=timeout)
        while not self._q.empty():
            self.lines.append(self._q.get())
        return self.proc.returncode, out


def marked(mark: str) -> list[str]:
    """Command lines of the processes whose environment holds MARK (the build's tree: it exports it)."""
    needle = f"TINY_TEST_MARK={mark}".encode()
    found = []
    for env in Path("/proc").glob("[0-9]*/environ"):
        try:
            if needle in env.read_bytes().split(b"\0"):
                found.append((env.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue
    return found


def sleeper(mark: str) -> dict:
    """A spec whose run command runs until the test stops it (bounded: 300 s)."""
    return spec_data(NAME, [["alpha==1.0"]], env={"TINY_TEST_MARK": mark}, run_commands=["sleep 300"])


def test_ctrl_c_while_the_venv_is_made_leaves_nothing_half_made(proj):
    """Issue: Ctrl-C one second in left a venv without pip; every later build said `present: venv`."""
    proj.write(spec_data(NAME, [["alpha==1.0"]]))
    bg = Background(proj)
    bg.wait_for("python: python 3.11")
    bg.proc.send_signal(signal.SIGINT)
    rc, out = bg.finish(timeout=120)
    assert rc == 130 and '"reason": "interrupted"' in out, out
    assert '"detail": "stopped by SIGINT to envport; the half-made env was removed;' in out, out
    assert not proj.prefix(NAME).exists()
    assert list((proj.envs_dir / f".{NAME}.builds").iterdir()) == []
    built = proj.build(NAME)
    assert built.verdict == "OK", built.why()
    pip = subprocess.run([str(proj.prefix(NAME) / "bin" / "python"), "-m", "pip", "--version"],
                         capture_output=True, text=True, timeout=60)
    assert pip.returncode == 0, pip.stderr


def test_sigterm_reaches_every_child_and_envport_waits_for_them(proj):
    """Issue: SIGTERM to envport left `bash -s` and pip running, reparented to PID 1."""
    old = spec_data(NAME, [["epsilon==1.0"]])
    proj.write(old)
    assert proj.build(NAME).verdict == "OK"
    mark = f"term-{os.getpid()}-{time.time_ns()}"
    proj.write(sleeper(mark))
    bg = Background(proj)
    wait_until("the run command started", lambda: any(c.startswith("sleep 300") for c in marked(mark)), timeout=120)
    bg.proc.send_signal(signal.SIGTERM)
    rc, out = bg.finish(timeout=120)
    # envport returned only after the tree was gone: nothing with the marker is left.
    assert marked(mark) == [], "processes outlived envport"
    assert rc == 130 and '"reason": "interrupted"' in out, out
    assert '"detail": "stopped by SIGTERM to envport; the half-made env was removed;' in out, out
    proj.write(old)
    assert proj.build(NAME).verdict == "present", "the old env must survive an interrupted rebuild"


def test_sigterm_over_ssh_stops_the_remote_build(proj, ssh_host):
    """The same over the test sshd: the remote bash and its children end, and envport waits for them."""
    mark = f"ssh-term-{os.getpid()}-{time.time_ns()}"
    data = spec_data(NAME, [], env={"TINY_TEST_MARK": mark}, run_commands=["sleep 300"])
    proj.write(data)
    bg = Background(proj, "--host", "test")
    wait_until("the remote run command started", lambda: any(c.startswith("sleep 300") for c in marked(mark)),
               timeout=180)
    bg.proc.send_signal(signal.SIGTERM)
    rc, out = bg.finish(timeout=120)
    assert rc == 130 and '"reason": "interrupted"' in out, out
    wait_until("end of the remote processes", lambda: marked(mark) == [], timeout=30)
    left = subprocess.run(ssh_host.argv(f"ls -A {proj.envs_dir}/.{NAME}.builds"), capture_output=True, text=True,
                          timeout=60)
    assert left.stdout.strip() == "", f"a half-made env was left on the host: {left.stdout}"


def test_a_second_build_of_the_same_env_waits_for_the_lock(proj):
    """Issue: two builds at once: the second logged `present: venv`, then failed."""
    gate = proj.root / "gate"
    mark = f"lock-{time.time_ns()}"
    data = spec_data(NAME, [["alpha==1.0"]], env={"TINY_TEST_MARK": mark},
                     run_commands=[f"for _ in $(seq 1500); do [ -e {gate} ] && break; sleep 0.2; done"])
    proj.write(data)
    first = Background(proj)
    first.wait_for("run: run commands")
    refused = proj.build(NAME, ENVPORT_LOCK_WAIT="0")
    assert refused.rc == 3 and refused.last["reason"] == "env_locked", refused.why()
    second = Background(proj)
    second.wait_for(f"waiting for another build of {NAME} to finish")
    gate.touch()
    rc1, out1 = first.finish()
    rc2, out2 = second.finish()
    assert rc1 == 0 and '"verdict": "OK"' in out1, out1
    assert rc2 == 0 and '"verdict": "present"' in out2, out2  # it waited, then found the finished env


# --- host safety ---------------------------------------------------------------------------------


def spy_bin(tmp_path: Path) -> tuple[Path, Path]:
    """apt-get/apt/dnf stand-ins that log their argv: a test must not change this host's packages,
    so the real package managers are replaced on PATH (the only mock here, and why)."""
    bindir, log = tmp_path / "spybin", tmp_path / "spy.log"
    bindir.mkdir()
    for tool in ("apt-get", "apt", "dnf", "yum"):
        script = bindir / tool
        script.write_text(f'#!/bin/sh\necho "{tool} $*" >> {log}\necho "Setting up (spy) $*"\n')
        script.chmod(0o755)
    return bindir, log


def test_system_packages_are_checked_never_installed_unasked(proj, tmp_path):
    """Issue: as root, a venv build ran apt-get update/install on the host, output hidden, unasked."""
    bindir, log = spy_bin(tmp_path)
    path = f"{bindir}:{os.environ['PATH']}"
    bash_version = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "bash"], capture_output=True, text=True,
                                  check=True).stdout
    missing = "envport-no-such-package"
    proj.write(spec_data(NAME, [["alpha==1.0"]], system_pkgs=["bash", missing, "coreutils=0.0-envport"]))
    built = proj.build(NAME, PATH=path)
    assert built.rc == 3 and built.last["reason"] == "system_pkgs_missing", built.why()
    coreutils = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "coreutils"], capture_output=True,
                               text=True, check=True).stdout
    assert built.last["detail"] == (
        f"not on this host: {missing} (not installed) coreutils=0.0-envport ({coreutils} is installed); run "
        f"`apt-get install -y --no-install-recommends {missing} coreutils=0.0-envport` "
        "(or pass --install-system-pkgs to let envport run it)")
    assert not log.exists(), f"a package manager ran: {log.read_text()}"
    assert not proj.prefix(NAME).exists()

    proj.write(spec_data(NAME, [["alpha==1.0"]], system_pkgs=["bash", f"bash={bash_version}"]))
    assert proj.build(NAME, PATH=path).verdict == "OK"
    assert not log.exists()

    proj.write(spec_data(NAME, [["alpha==1.0"]], system_pkgs=[missing]))
    built = proj.build(NAME, "--install-system-pkgs", PATH=path)
    assert built.verdict == "OK", built.why()
    assert log.read_text().splitlines() == ["apt-get update",
                                            f"apt-get install -y --no-install-recommends {missing}"]
    assert f"envport[{NAME}]:   apt: Setting up (spy) install -y --no-install-recommends {missing}" \
        in built.proc.stderr


def test_scanpy_cpu_as_a_venv_refuses_instead_of_running_apt(tmp_path):
    """The issue's own case: scanpy-cpu's system packages are checked, apt never runs, the fix is printed."""
    import yaml

    from .support import copy_project, run_envport

    root = copy_project(tmp_path / "p")
    spec = root / "specs" / "scanpy-cpu.yaml"
    data = yaml.safe_load(spec.read_text())
    data["system_pkgs"] = data["system_pkgs"] + ["envport-no-such-package"]  # missing here whatever is installed
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    bindir, log = spy_bin(tmp_path)
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "ENVPORT_ENVS_DIR": str(tmp_path / "envs")}
    proc = run_envport("build", "scanpy-cpu", "--target", "venv", root=root, env=env, timeout=300)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "REFUSED" in proc.stdout and "system_pkgs_missing" in proc.stdout
    assert "envport-no-such-package (not installed)" in proc.stdout and "--install-system-pkgs" in proc.stdout
    assert not log.exists(), log.read_text()
    help_ = run_envport("build", "--help", root=root, env=env, timeout=60).stdout
    assert "--install-system-pkgs" in help_ and "never changes the host's packages" in " ".join(help_.split())


def test_check_and_install_flags_are_for_host_targets_only(proj):
    proj.write(spec_data(NAME, [["alpha==1.0"]]))
    proc = subprocess.run([sys.executable, "-m", "envport", "-C", str(proj.root), "build", NAME, "--target",
                           "docker", "--check"], capture_output=True, text=True, timeout=60, env=proj.env())
    assert proc.returncode == 2 and "--check is for --target venv or conda" in proc.stderr + proc.stdout


def test_a_full_disk_mid_build_leaves_the_old_env_and_the_next_build_repairs(tmp_path, wheelhouse):
    """ENOSPC while the new env is made: FAILED, the half-made env removed, the old env still present;
    with space again, the next build ends equal to a fresh build.  The envs dir is a real tmpfs sized to
    hold one env (~26 MB) but not two side by side."""
    envs = tmp_path / "small"
    envs.mkdir()
    # mode=0700: a tmpfs root is 1777 by default, and a build refuses an envs dir others can write.
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=40m,mode=0700", "tmpfs", str(envs)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root and CAP_SYS_ADMIN): {mounted.stderr.strip()}")
    try:
        proj = ShellProject(tmp_path / "project", envs, wheelhouse)
        (proj.root / "specs").mkdir(parents=True)
        shutil.copytree(REPO / "sites", proj.root / "sites")
        old = spec_data(NAME, [["alpha==1.0"]])
        proj.write(old)
        assert proj.build(NAME).verdict == "OK"
        new = spec_data(NAME, [["alpha==2.0", "epsilon==1.0"]])
        proj.write(new)
        full = proj.build(NAME)
        assert full.rc == 1 and full.verdict == "FAILED", full.why()
        # ensurepip or pip dies of ENOSPC (its own words vary); the script names the step it stopped at.
        assert any("FAILED at step" in ln for ln in full.last["lines"]), full.why()
        builds = envs / f".{NAME}.builds"
        assert [p.name for p in builds.iterdir()] == [os.readlink(proj.prefix(NAME)).rsplit("/", 1)[1]]
        proj.write(old)
        assert proj.build(NAME).verdict == "present", "the old env must be whole after the failed build"
        subprocess.run(["mount", "-o", "remount,size=120m", str(envs)], check=True)
        proj.write(new)
        built = proj.build(NAME)
        assert built.verdict == "OK", built.why()
        assert_fresh(proj, new, "after-full")
    finally:
        subprocess.run(["umount", "-l", str(envs)], capture_output=True)

"""The committed workflow's podman job on an envport/* base finds its base (issue 38, U5), run for real.

On a runner, `envport base debian-bookworm` (under sudo) puts the base into docker's store; rootless podman
reads the runner user's own store, so the podman pair used to fail `base_image_missing`. Here the steps the
workflow runs for such a pair after the base step (its `if:`s evaluated for the row) run as an unprivileged
user with rootless podman (.ci/services/podman.sh's `envport-podman`, given the docker group for this run
only, as a hosted runner's user has it) and a fresh HOME and runtime dir: a podman store that has never seen
the base. Stood in for, and said so: the base step itself (debootstrap as root) is the session's base image
already in docker (the `base_image` fixture).
"""

from __future__ import annotations

import grp
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml

from .support import REPO, missing
from .test_workflow import WORKFLOW, _runs

USER = "envport-podman"


def _as_runner(home: Path, runtime: Path, script: str) -> subprocess.CompletedProcess:
    argv = ["runuser", "-u", USER, "-g", USER, "-G", "docker", "--", "env", "-i", f"HOME={home}", f"USER={USER}",
            "PATH=/usr/sbin:/usr/bin:/sbin:/bin", f"XDG_RUNTIME_DIR={runtime}",
            "bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script]
    return subprocess.run(argv, capture_output=True, text=True, timeout=600)


@pytest.fixture
def fresh_podman_home():
    if shutil.which("podman") is None or shutil.which("runuser") is None:
        missing("podman or runuser not installed (.ci/install.sh installs podman)")
    try:
        pw = pwd.getpwnam(USER)
        grp.getgrnam("docker")
    except KeyError:
        missing(f"no user {USER} or no docker group (.ci/services/podman.sh makes the user)")
    top = Path(tempfile.mkdtemp(prefix="envport-podman-home-", dir="/var/tmp"))
    home, runtime = top / "home", top / "run"
    (home / ".config" / "containers").mkdir(parents=True)
    runtime.mkdir(mode=0o700)
    # Native overlay, as .ci/services/podman.sh configures the user's own store (vfs copies the rootfs).
    (home / ".config" / "containers" / "storage.conf").write_text('[storage]\ndriver = "overlay"\n')
    for path in (top, home, runtime, *home.rglob("*")):
        shutil.chown(path, pw.pw_uid, pw.pw_gid)
    top.chmod(0o700)
    try:
        yield home, runtime
    finally:
        _as_runner(home, runtime, "podman system reset -f >/dev/null 2>&1 || true")
        shutil.rmtree(top, ignore_errors=True)


def test_a_podman_pair_on_a_local_base_finds_it_in_the_runner_users_store(base_image, fresh_podman_home):
    home, runtime = fresh_podman_home
    data = yaml.safe_load((REPO / WORKFLOW).read_text())
    row = next(r for r in data["jobs"]["up"]["strategy"]["matrix"]["include"]
               if r["target"] == "podman" and r["local-base"])
    steps = data["jobs"]["up"]["steps"]
    base_step = next(i for i, s in enumerate(steps) if "envport base " in s.get("run", ""))
    up_step = next(i for i, s in enumerate(steps) if s.get("name") == "envport up")
    between = [s for s in steps[base_step + 1:up_step] if "run" in s and _runs(s.get("if", ""), row)]
    assert between, f"no step puts {base_image} where podman finds it for {row['pair']}"
    check = f"podman image exists {base_image}"
    before = _as_runner(home, runtime, check)
    assert before.returncode == 1, before.stderr  # the store the runner user starts with lacks it
    for step in between:
        ran = _as_runner(home, runtime, step["run"])
        assert ran.returncode == 0, f"{step['name']}:\n{ran.stdout[-2000:]}{ran.stderr[-2000:]}"
    after = _as_runner(home, runtime, check)
    assert after.returncode == 0, after.stderr

"""A signal to `envport build --target venv` exits 130 and names the signal the user sent (issue 27 row 8).

Before, Ctrl-C during a venv build exited 1 (`FAILED [interrupted]`) and its log tail said
"INTERRUPTED by SIGTERM": the SIGTERM the build's wrapper passes on to the script, not the SIGINT
the user sent.  A real build of small local wheels (tests/tinywheels.py) runs as the real CLI in its
own process group, as a terminal's foreground job is; the signal goes to that group once the build
is inside its pip phase (its run command, a `sleep 300`, keeps it there until the signal).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time

import pytest

from .support import REPO
from .tinywheels import ShellProject, make_wheelhouse, spec_data

NAME = "tiny-stop"


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory):
    return make_wheelhouse(tmp_path_factory.mktemp("wheels"))


def signalled_in_pip_phase(argv: list[str], proj, sig) -> tuple[subprocess.Popen, str, str]:
    """ARGV (a build of a spec whose first pip phase installs alpha==1.0) run in its own process group, as a
    terminal's foreground job; SIG sent to the group once the build is inside that phase. (proc, out, err)."""
    proc = subprocess.Popen(argv, cwd=proj.root, env=proj.env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        seen = []
        deadline = time.monotonic() + 180
        for line in proc.stderr:
            seen.append(line)
            if "pip phase 1: alpha==1.0" in line or time.monotonic() > deadline:
                break
        assert any("pip phase 1" in ln for ln in seen), "the build never reached its pip phase:\n" + "".join(seen)
        time.sleep(0.5)
        os.killpg(proc.pid, sig)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc, out, err


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_during_a_venv_build_exits_130_naming_it(tmp_path, wheelhouse, sig):
    proj = ShellProject.make(tmp_path / "project", wheelhouse)
    shutil.copytree(REPO / "sites", proj.root / "sites")
    proj.write(spec_data(NAME, [["alpha==1.0"]], run_commands=["sleep 300"]))
    proc, out, err = signalled_in_pip_phase(proj.argv(NAME), proj, sig)
    assert proc.returncode == 130, f"exit {proc.returncode}\n{out}\n{err}"
    data = json.loads(out)
    assert data["exit_code"] == 130, data
    step = data["steps"][-1]
    assert step["reason"] == "interrupted", step
    assert step["detail"].startswith(f"stopped by {sig.name} to envport; the half-made env was removed"), step
    other = "SIGTERM" if sig is signal.SIGINT else "SIGINT"
    assert other not in out, f"the output names a signal the user did not send:\n{out}"
    assert not proj.prefix(NAME).exists(), "an interrupted build left an env behind"

"""The shell target on a real host over SSH: build, verify (testinfra ssh://), witnesses (launchers/ssh.py).

The host is the test sshd on 127.0.0.1:2222 (site alias `test`), which is this
machine: the env goes to a fresh folder of its own each session (tests/fixtures.py
`ssh_venv`) so it is built over SSH for real, not found present from a local build
or an earlier session.
"""

from __future__ import annotations

import base64
import io
import json
import shlex
import subprocess
import tarfile
import threading
import time

import pytest

from envport.witness.launchers.ssh import SshLauncher, prefix_expr, remote_word, witness_payload
from envport.witness.launchers.base import WITNESS_DIR
from envport.plan.site import SshHost as SiteSshHost

from envport.witness.judge import parse_sentinels

from .support import ENV_NAME, cli_env, fail_with, needs_bwrap, run_envport

UNREACHABLE = "ssh://root@127.0.0.1:1"  # nothing listens on port 1: connection refused at once


# --- units ---------------------------------------------------------------------------


def test_remote_words_quote_everything_but_the_env_and_scripts_dirs():
    assert remote_word("$P/bin/python") == '"$P"/bin/python'
    assert remote_word("$D/dist.py") == '"$D"/dist.py'
    assert remote_word("it's $HOME") == "'it'\"'\"'s $HOME'"
    assert remote_word("$Pfoo") == "'$Pfoo'"


def test_prefix_is_literal_or_under_the_remote_home():
    assert prefix_expr("demo-cpu", envs_dir="/var/tmp/a b") == "'/var/tmp/a b/demo-cpu'"
    assert prefix_expr("demo-cpu") == '"$HOME"/.envport/envs/demo-cpu'
    assert prefix_expr("x", prefix="/opt/env") == "/opt/env"


def test_witness_payload_carries_every_script():
    data = base64.b64decode(witness_payload(str(WITNESS_DIR)))
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        names = sorted(tar.getnames())
    assert names == sorted(p.name for p in WITNESS_DIR.glob("*.py"))
    assert "dist.py" in names and "envport_sentinel.py" in names


def test_remote_script_sources_the_env_block_and_cleans_up():
    launcher = SshLauncher("somehost", ENV_NAME, envs_dir="/envs")
    inv = launcher.invocation("basic.py", ["--python", "3.11"], {"A": "x y"})
    script = shlex.split(inv.argv[-1])[-1]  # `bash -c SCRIPT`
    assert ". \"$P/.envport/env.sh\"" in script
    assert "trap 'rm -rf \"$D\"' EXIT" in script
    assert "export A='x y'" in script
    assert 'setsid "$P"/bin/python "$D"/basic.py --python 3.11 &' in script
    assert inv.cleanup and "kill -TERM" in inv.cleanup[0][-1]
    assert "bwrap" not in script  # no weights: nothing to bind


def test_remote_script_binds_the_weights_read_only_where_bwrap_works():
    launcher = SshLauncher("somehost", ENV_NAME, envs_dir="/envs", weight_env={"DEMO_WEIGHTS": f"{ENV_NAME}/tiny"})
    script = shlex.split(launcher.invocation("basic.py", [], {}).argv[-1])[-1]
    assert f'export DEMO_WEIGHTS="$W"/{ENV_NAME}/tiny' in script
    assert f'--ro-bind-try "$W"/{ENV_NAME}/tiny "$W"/{ENV_NAME}/tiny' in script
    # Where bwrap is absent or does not run: the witness as it is, told why the weights stay writable.
    assert 'export ENVPORT_WEIGHTS_WRITABLE="$why"; setsid "$P"/bin/python "$D"/basic.py &' in script


# --- against the real sshd -------------------------------------------------------------


def test_unreachable_host_is_refused_at_once(session_project):
    """Connection refused is a REFUSED ssh_unreachable naming the cause, not a hang until a timeout
    (bounded here by the subprocess timeout; how fast it is: bench/bench_refusals.py)."""
    for args in (("witness", ENV_NAME, "--target", "venv", "--host", UNREACHABLE, "--no-ledger"),
                 ("verify", ENV_NAME, "--target", "venv", "--host", UNREACHABLE),
                 ("build", ENV_NAME, "--target", "venv", "--host", UNREACHABLE)):
        proc = run_envport(*args, root=session_project, env=cli_env(), timeout=60)
        assert proc.returncode == 3, fail_with(proc, " ".join(args))
        assert "REFUSED" in proc.stdout and "ssh_unreachable" in proc.stdout, proc.stdout
        assert "Connection refused" in proc.stdout, proc.stdout


@pytest.mark.ssh
def test_missing_env_on_the_host_is_refused(ssh_host, session_project):
    site_host = SiteSshHost(ssh=ssh_host.alias, ssh_config=str(ssh_host.ssh_config))
    result = SshLauncher(site_host, "no-such-env", envs_dir="/var/tmp/envport-nowhere").preflight()
    assert result is not None and result.reason == "env_missing"
    assert "envport build no-such-env --target venv" in result.lines[0]


@pytest.mark.ssh
def test_build_over_ssh_then_verify_through_testinfra_ssh(ssh_venv, ssh_host):
    proc = run_envport("build", ENV_NAME, "--target", "venv", "--host", "test", "--json", root=ssh_venv.root,
                       env=cli_env(ENVPORT_ENVS_DIR=ssh_venv.envs_dir), timeout=300)
    assert proc.returncode == 0, fail_with(proc, "build again")
    step = json.loads(proc.stdout)["steps"][-1]
    assert step["verdict"] == "present" and step["data"]["prefix"] == ssh_venv.prefix

    proc = run_envport("verify", ENV_NAME, "--target", "venv", "--host", "test", "--json", root=ssh_venv.root,
                       env=cli_env(ENVPORT_ENVS_DIR=ssh_venv.envs_dir), timeout=300)
    assert proc.returncode == 0, fail_with(proc, "verify --host test")
    result = json.loads(proc.stdout)["steps"][0]
    assert result["verdict"] == "OK", result
    checks = {c["id"]: c["outcome"] for c in result["data"]["checks"]}
    for cid in ("pip[torch==2.13.0]", "pip[six==1.16.0]", "python[3.11]", "env[DEMO_GREETING]",
                "env[DEMO_WEIGHTS]", "file[/opt/demo/run.py]", "weight[tiny/tiny.f32]", "label[envport.hash]"):
        assert checks.get(cid) == "passed", (cid, checks)
    # The env folder is a link to its build (.NAME.builds/HASH-PID): verify names the build it checked.
    resolved = subprocess.run(ssh_host.argv(f"readlink -f {ssh_venv.prefix} {result['data']['prefix']}"),
                              capture_output=True, text=True, timeout=30).stdout.split()
    assert len(resolved) == 2 and resolved[0] == resolved[1], (ssh_venv.prefix, result["data"]["prefix"], resolved)
    assert result["data"]["ssh_host"] == "test"
    from envport.report import ledger as envport_ledger
    ledger = envport_ledger.read(ssh_venv.root, ENV_NAME)  # this user's state dir, not the checkout
    assert any(r["kind"] == "verify" and r.get("ssh_host") == "test" and r["verdict"] == "OK" for r in ledger)


@pytest.mark.ssh
def test_verify_over_ssh_names_a_broken_env_var(ssh_venv, ssh_host):
    """The env block is what is checked: change it on the host and the check names the variable."""
    env_sh = f"{ssh_venv.prefix}/.envport/env.sh"
    edit = f"cp {env_sh} {env_sh}.bak && sed -i 's/hello from demo-cpu/tampered/' {env_sh}"
    subprocess.run(ssh_host.argv(edit), check=True, timeout=30)
    try:
        proc = run_envport("verify", ENV_NAME, "--target", "venv", "--host", "test", root=ssh_venv.root,
                           env=cli_env(ENVPORT_ENVS_DIR=ssh_venv.envs_dir), timeout=300)
    finally:
        subprocess.run(ssh_host.argv(f"mv {env_sh}.bak {env_sh}"), check=True, timeout=30)
    assert proc.returncode == 1, fail_with(proc, "verify of a tampered env")
    assert "env[DEMO_GREETING]: DEMO_GREETING is b'tampered'" in proc.stdout, proc.stdout


@pytest.mark.ssh
def test_witnesses_run_on_the_host_and_leave_nothing(ssh_venv, ssh_host):
    needs_bwrap()  # the host is this machine: its bwrap binds the weights read-only there
    proc = run_envport("witness", ENV_NAME, "--target", "venv", "--host", "test", "--only",
                       "python,imports,weights,kernel,collectives", "--json", root=ssh_venv.root,
                       env=cli_env(ENVPORT_ENVS_DIR=ssh_venv.envs_dir), timeout=300)
    assert proc.returncode == 0, fail_with(proc, "witness --host test")
    out = json.loads(proc.stdout)
    verdicts = {s["step"]: s["verdict"] for s in out["steps"]}
    assert verdicts == {"python": "OK", "import torch": "OK", "import six": "OK", "weight tiny": "OK", "kernel": "OK",
                        "collectives (world 2)": "OK"}, out["steps"]
    # The weight read through $DEMO_WEIGHTS from the host's weights root, bound read-only there.
    weight = next(s for s in out["steps"] if s["step"] == "weight tiny")
    assert weight["data"]["read_only"] is True, weight
    assert f"/.envport/weights/{ENV_NAME}/tiny (read-only)" in weight["detail"], weight
    assert out["launcher"].startswith("ssh test ")
    # The env's own interpreter ran, with its env block sourced.
    python = next(s for s in out["steps"] if s["step"] == "python")
    assert ssh_venv.prefix in python["detail"]
    left = subprocess.run(ssh_host.argv('ls -d "${TMPDIR:-/tmp}"/envport-witness-*.* 2>/dev/null | wc -l'),
                          capture_output=True, text=True, timeout=30)
    assert left.stdout.strip() == "0", "witness scripts left on the host"


@pytest.mark.ssh
def test_a_write_under_the_weights_fails_on_the_host(ssh_venv, ssh_host):
    """From inside the witness run on the host, a write under $DEMO_WEIGHTS fails with EROFS (bwrap's bind)."""
    needs_bwrap()
    site_host = SiteSshHost(ssh=ssh_host.alias, ssh_config=str(ssh_host.ssh_config))
    launcher = SshLauncher(site_host, ENV_NAME, envs_dir=ssh_venv.envs_dir,
                           weight_env={"DEMO_WEIGHTS": f"{ENV_NAME}/tiny"})
    write = json.dumps({"cmd": 'touch "$DEMO_WEIGHTS/written-by-the-witness"', "expect": "Read-only file system"})
    result = launcher.run("basic.py", ["--cli", write], {}, deadline_s=120)
    (cli,) = [r for r in parse_sentinels(result.output) if r["check"] == "cli"]
    assert result.returncode == 0 and cli["ok"], result.output
    left = subprocess.run(ssh_host.argv(f'ls "$HOME/.envport/weights/{ENV_NAME}/tiny"'), capture_output=True,
                          text=True, timeout=30)
    assert left.returncode == 0 and "written-by-the-witness" not in left.stdout, left.stdout + left.stderr


def _marked_processes(ssh_host, marker: str) -> int:
    """How many processes on the host carry MARKER in their environment."""
    ps = subprocess.run(ssh_host.argv(f"grep -l {marker} /proc/[0-9]*/environ 2>/dev/null | wc -l"),
                        capture_output=True, text=True, timeout=30)
    return int(ps.stdout.strip() or 0)


@pytest.mark.ssh
def test_deadline_ends_the_remote_ranks(ssh_venv, ssh_host):
    """A hung rank past the launcher's deadline: the ssh client AND the remote process group end."""
    site_host = SiteSshHost(ssh=ssh_host.alias, ssh_config=str(ssh_host.ssh_config))
    # With a weight: the ranks run under bwrap (read-only weights), which forwards no signal itself.
    launcher = SshLauncher(site_host, ENV_NAME, envs_dir=ssh_venv.envs_dir,
                           weight_env={"DEMO_WEIGHTS": f"{ENV_NAME}/tiny"})
    marker = f"envport-deadline-{time.time_ns()}"
    # Watch the host while the witness runs: the ranks must have existed, or "none left" proves nothing.
    seen: list[int] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            seen.append(_marked_processes(ssh_host, marker))
            stop.wait(0.5)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        result = launcher.run("dist.py", ["--checks", "collectives", "--world-size", "2", "--launch", "spawn",
                                          "--deadline", "120"],
                              {"ENVPORT_WITNESS_FAULT": "hang:1", "ENVPORT_TEST_MARK": marker}, deadline_s=10)
    finally:
        stop.set()
        watcher.join(timeout=60)
    assert result.timed_out, result.output
    assert max(seen, default=0) >= 2, f"the remote ranks were never seen running (counts {seen})"
    deadline = time.monotonic() + 20
    while (left := _marked_processes(ssh_host, marker)) != 0 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert left == 0, f"{left} remote witness processes outlived the deadline"

"""Issue 21, the local host's trust boundaries: F2, F6, F8, F13, F14, F15, each attack run for real.

Another local user is played by uid 65534 through `setpriv` (this test runs as root in CI and says
so where it needs it); what that user plants lives under /var/tmp (world-writable and sticky, as on
any cluster node) and is removed afterwards.  The builds are real (`envport build --target venv`, the
rendered setup script), the parity run goes over the test sshd, the site profiles are loaded by the
real loader and rendered by the real renderers, the ledger is written by the real CLI.  No command
here changes the host outside /var/tmp paths it made and the test's tmp_path.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from envport.core.errors import EnvportError, SpecError
from envport.engines.ssh import prefix_expr, ssh_argv
from envport.plan.site import SshHost, load_site
from envport.recipe.identity import resolve
from envport.report import ledger
from envport.spec.loader import load_spec

from .support import as_json, cli_env, missing, run_envport, write_site, write_spec

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
NAME = "tiny-sec"


def as_other_user(script: str, *args: str) -> None:
    """Run bash SCRIPT as uid 65534 (another local user); needs root and setpriv."""
    if os.geteuid() != 0:
        missing("acting as another user (setpriv --reuid) needs root")
    if not shutil.which("setpriv"):
        missing("no setpriv (apt-get install util-linux)")
    proc = subprocess.run([*NOBODY, "bash", "-euc", script, "as-nobody", *args], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr


@pytest.fixture
def shared_tmp():
    """A fresh path under /var/tmp (1777, like a shared scratch), removed afterwards, whoever made it."""
    path = Path("/var/tmp") / f"envport-sec-{secrets.token_hex(6)}"
    yield path
    shutil.rmtree(path, ignore_errors=True)
    for stray in Path("/var/tmp").glob(f"{path.name}*"):
        if stray.is_dir() and not stray.is_symlink():
            shutil.rmtree(stray, ignore_errors=True)
        else:
            stray.unlink(missing_ok=True)


# A fake env as another user would plant it: the symlink setup-venv.sh makes, the recorded hash the
# spec has now, and a bin/python that leaves a mark when it is run (by root: that is the attack).
PLANT_ENV = r"""
d="$1"; name="$2"; hash="$3"; mark="$4"
mkdir -p -m 0755 "$d"
b="$d/.$name.builds/planted"
mkdir -p "$b/bin" "$b/.envport"
printf '#!/bin/sh\necho planted > "%s"\nexit 0\n' "$mark" > "$b/bin/python"
chmod 0755 "$b/bin/python"
printf '%s\n' "$hash" > "$b/.envport/hash"
: > "$b/.envport/dists"
ln -s "$b" "$d/$name"
"""


def venv_hash(root: Path, name: str) -> str:
    return resolve(load_spec(name, root), load_site(None, root), "venv").hash


# --- F2: the envs dir and its lock are the running user's own ------------------------------------------


def test_f2_an_envs_dir_another_user_made_is_refused_and_its_planted_python_never_runs(project, shared_tmp):
    write_spec(project, NAME)
    envs, mark = shared_tmp / "envs", Path(f"{shared_tmp}-ran")
    as_other_user(f"mkdir -m 0755 {shared_tmp}\n" + PLANT_ENV, str(envs), NAME, venv_hash(project, NAME), str(mark))
    proc = run_envport("build", NAME, "--target", "venv", "--json", root=project,
                       env=cli_env(ENVPORT_ENVS_DIR=str(envs)), timeout=120)
    step = as_json(proc)["steps"][-1]
    assert not mark.exists(), "root ran the python another user planted"
    assert proc.returncode == 3 and step["verdict"] == "REFUSED" and step["reason"] == "envs_dir_unsafe", step
    assert str(envs) in step["detail"] and "uid 65534" in step["detail"] and "0700" in step["detail"], step
    assert "present" not in proc.stdout + proc.stderr


@pytest.mark.parametrize("planted_by", ["another user, in a shared 1777 envs dir", "anyone, in a private dir"])
def test_f2_a_symlink_as_the_lock_is_never_followed(project, shared_tmp, tmp_path, planted_by):
    write_spec(project, NAME)
    victim = shared_tmp / "victim"  # what the link names: `exec 9>>` would create it as root
    if planted_by.startswith("another"):
        envs = shared_tmp / "envs"
        shared_tmp.mkdir(mode=0o755)
        os.chown(shared_tmp, 65534, 65534)
        envs.mkdir()
        os.chmod(envs, 0o1777)
        as_other_user('ln -s "$1" "$2"', str(victim), str(envs / f".{NAME}.lock"))
        expect = "writable by others"
    else:
        envs = tmp_path / "envs"
        envs.mkdir(mode=0o700)
        shared_tmp.mkdir(mode=0o755)
        (envs / f".{NAME}.lock").symlink_to(victim)
        expect = "is a symlink"
    proc = run_envport("build", NAME, "--target", "venv", "--json", root=project,
                       env=cli_env(ENVPORT_ENVS_DIR=str(envs)), timeout=120)
    step = as_json(proc)["steps"][-1]
    assert not victim.exists(), "the build followed the planted lock link"
    assert proc.returncode == 3 and step["reason"] == "envs_dir_unsafe" and expect in step["detail"], step


def test_f2_a_parent_another_user_can_rename_is_refused(project, shared_tmp):
    write_spec(project, NAME)
    as_other_user('mkdir -m 0777 "$1"', str(shared_tmp))  # not sticky: its owner (and anyone) can swap envs/
    proc = run_envport("build", NAME, "--target", "venv", "--json", root=project,
                       env=cli_env(ENVPORT_ENVS_DIR=str(shared_tmp / "envs")), timeout=120)
    step = as_json(proc)["steps"][-1]
    assert proc.returncode == 3 and step["reason"] == "envs_dir_unsafe", step
    assert f"{shared_tmp} (a parent of the envs dir" in step["detail"] and "uid 65534" in step["detail"], step


def test_f2_a_tools_dir_another_user_made_is_refused_and_its_planted_uv_never_runs(project, shared_tmp, tmp_path):
    from envport.plan.steps import UV_VERSION

    write_spec(project, NAME)
    site = write_site(project, "uv", installer="uv")
    mark = Path(f"{shared_tmp}-ran")
    as_other_user('mkdir -p -m 0755 "$1/uv-$2/bin"; printf \'#!/bin/sh\\necho planted > "%s"\\n\' "$3" > "$1/uv-$2/bin/uv"; '
                  'chmod 0755 "$1/uv-$2/bin/uv"', str(shared_tmp / "tools"), UV_VERSION, str(mark))
    proc = run_envport("build", NAME, "--target", "venv", "--site", site, "--json", root=project, timeout=300,
                       env=cli_env(ENVPORT_ENVS_DIR=str(tmp_path / "envs"), ENVPORT_TOOLS_DIR=str(shared_tmp / "tools")))
    step = as_json(proc)["steps"][-1]
    assert not mark.exists(), "root ran the uv another user planted"
    assert proc.returncode == 3 and step["reason"] == "tools_dir_unsafe" and "uid 65534" in step["detail"], step


def test_f2_a_new_envs_dir_is_made_0700(project, tmp_path):
    write_spec(project, NAME, pip_phases=[])
    envs = tmp_path / "deep" / "envs"
    proc = run_envport("build", NAME, "--target", "venv", "--json", root=project,
                       env=cli_env(ENVPORT_ENVS_DIR=str(envs)), timeout=300)
    assert as_json(proc)["steps"][-1]["verdict"] == "OK", proc.stdout + proc.stderr
    assert stat.S_IMODE(envs.stat().st_mode) == 0o700 and stat.S_IMODE(envs.parent.stat().st_mode) == 0o700


def test_f2_parity_over_ssh_uses_the_ssh_users_own_home_and_refuses_a_planted_env(project, shared_tmp, ssh_host):
    from envport.report.parity import SAME_MACHINE_SSH_ENVS_DIR

    # The same-machine default is under the SSH user's home on the host, never a fixed shared path.
    assert SAME_MACHINE_SSH_ENVS_DIR.startswith("~/")
    assert prefix_expr("x", envs_dir=SAME_MACHINE_SSH_ENVS_DIR) == '"$HOME"/.envport/ssh-envs/x'
    write_spec(project, NAME)
    envs, mark = shared_tmp / "envs", Path(f"{shared_tmp}-ran")
    as_other_user(f"mkdir -m 0755 {shared_tmp}\n" + PLANT_ENV, str(envs), NAME, venv_hash(project, NAME), str(mark))
    proc = run_envport("parity", NAME, "--target", "ssh", "--host", "test", "--no-ledger", "--json", root=project,
                       env=cli_env(ENVPORT_SSH_ENVS_DIR=str(envs)), timeout=300)
    out = proc.stdout + proc.stderr
    assert not mark.exists(), "root ran, over SSH, the python another user planted"
    assert "envs_dir_unsafe" in out and "uid 65534" in out, out
    assert '"present"' not in proc.stdout, proc.stdout


# --- F6: a site profile is validated like a spec ----------------------------------------------------


HOSTILE_SITES = {
    "base_images value": ({"base_images": {"envport/debian-bookworm:base": "debian:12\nRUN touch /pwned"}},
                          "base_images"),
    "base_images key": ({"base_images": {"x\nRUN touch /pwned": "debian:12"}}, "base_images"),
    "find_links": ({"pip": {"find_links": ["/wheels\nRUN touch /pwned"]}}, "pip.find_links[0]"),
    "index_url": ({"pip": {"index_url": "https://pypi.org/simple\nRUN touch /pwned"}}, "pip.index_url"),
    "extra_index_urls": ({"pip": {"extra_index_urls": ["not a url"]}}, "pip.extra_index_urls[0]"),
    "U+2028 in description": ({"description": "one\u2028RUN touch /pwned"}, "description"),
    "U+0085 in wheelhouse_dir": ({"wheelhouse_dir": ".cache/w\u0085x"}, "wheelhouse_dir"),
    "network": ({"network": "host\nRUN touch /pwned"}, "network"),
    "ssh destination": ({"hosts": {"h": {"ssh": "-oProxyCommand=touch /tmp/pwned"}}}, "hosts.h.ssh"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_SITES))
def test_f6_a_hostile_site_value_is_refused_naming_the_file_and_field(project, case):
    fields, field = HOSTILE_SITES[case]
    name = write_site(project, "hostile", **fields)
    with pytest.raises(SpecError) as caught:
        load_site(name, project)
    problems = caught.value.problems
    assert problems and all(p.file.endswith("sites/hostile.yaml") for p in problems), problems
    assert any(p.field.startswith(field) for p in problems), [(p.field, p.message) for p in problems]
    proc = run_envport("show", "demo-cpu", "--site", name, root=project, timeout=60)
    assert proc.returncode == 2 and "sites/hostile.yaml" in proc.stderr and "Traceback" not in proc.stderr, \
        proc.stderr


def test_f6_a_ca_bundle_that_is_not_certificates_is_refused_without_its_content(project):
    if not os.access("/etc/shadow", os.R_OK):
        missing("reading /etc/shadow (the file an attacker would name) needs root")
    name = write_site(project, "shadow", ca_bundle="/etc/shadow")
    proc = run_envport("show", "demo-cpu", "--site", name, root=project, timeout=60)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "sites/shadow.yaml: ca_bundle: /etc/shadow" in proc.stderr and "no PEM certificate" in proc.stderr
    for line in Path("/etc/shadow").read_text().splitlines():
        user = line.split(":", 1)[0]
        assert not line or line not in proc.stdout + proc.stderr
        assert len(user) < 4 or f"{user}:" not in proc.stdout + proc.stderr


def test_f6_only_the_certificates_of_a_bundle_reach_the_image(project, tmp_path):
    system = Path("/etc/ssl/certs/ca-certificates.crt")
    if not system.is_file():
        missing("no system CA bundle /etc/ssl/certs/ca-certificates.crt (apt-get install ca-certificates)")
    # The system bundle is certificates only: its bytes (and so every env hash) are unchanged.
    assert load_site(write_site(project, "sys", ca_bundle=str(system)), project).ca_bytes() == system.read_bytes()
    first = system.read_bytes().split(b"-----END CERTIFICATE-----\n", 1)[0] + b"-----END CERTIFICATE-----\n"
    mixed = tmp_path / "mixed.pem"
    mixed.write_bytes(b"# a comment\n" + first + b"-----BEGIN PRIVATE KEY-----\nc2VjcmV0\n-----END PRIVATE KEY-----\n")
    got = load_site(write_site(project, "mixed", ca_bundle=str(mixed)), project).ca_bytes()
    assert got == first
    bogus = tmp_path / "bogus.pem"
    bogus.write_bytes(b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
    with pytest.raises(EnvportError, match=r"sites/bogus.yaml: ca_bundle: .*certificate 1 of 1 is not a valid"):
        load_site(write_site(project, "bogus", ca_bundle=str(bogus)), project).ca_bytes()


# --- F8: the ledger's lock and a corrupt ledger ----------------------------------------------------------


def test_f8_a_symlink_as_the_ledger_lock_is_neither_followed_nor_truncated(tmp_path, monkeypatch):
    monkeypatch.setenv("ENVPORT_STATE_DIR", str(tmp_path / "state"))
    path = ledger.ledger_path(tmp_path, "x")
    path.parent.mkdir(parents=True)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    path.with_suffix(".lock").symlink_to(victim)
    with pytest.raises(EnvportError, match="is a symlink"):
        ledger.append(tmp_path, "x", {"kind": "test"})
    assert victim.read_text() == "precious\n"
    path.with_suffix(".lock").unlink()
    ledger.append(tmp_path, "x", {"kind": "test"})
    assert stat.S_IMODE(path.with_suffix(".lock").stat().st_mode) == 0o600


CORRUPT = {"not JSON": b'{"records": [', "a list": b"[]", "records not a list": b'{"records": 5}',
           "not UTF-8": b"\xff\xfe\x00", "nested past the recursion limit": b"[" * 200_000}


@pytest.mark.parametrize("case", sorted(CORRUPT))
def test_f8_a_corrupt_ledger_is_set_aside_and_a_new_one_started(project, tmp_path, case, monkeypatch):
    write_spec(project, NAME, weight_dirs={"w": {"path": "/weights/w"}})
    state = tmp_path / "state"
    env = cli_env(ENVPORT_STATE_DIR=str(state))
    monkeypatch.setenv("ENVPORT_STATE_DIR", str(state))
    path = ledger.ledger_path(project, NAME)  # where the CLI below records
    path.parent.mkdir(parents=True)
    path.write_bytes(CORRUPT[case])
    proc = run_envport("weights", "fetch", NAME, "--root", str(tmp_path / "w"), root=project, env=env, timeout=60)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    said = [ln for ln in proc.stderr.splitlines() if "set aside as" in ln]
    assert len(said) == 1 and str(path) in said[0], proc.stderr
    aside = [p for p in path.parent.iterdir() if p.name.startswith(f"{path.name}.corrupt-")]
    assert len(aside) == 1 and aside[0].read_bytes() == CORRUPT[case] and str(aside[0]) in said[0]
    assert [r["kind"] for r in json.loads(path.read_text())["records"]] == ["weights"]
    shown = run_envport("ledger", NAME, root=project, env=env, timeout=60)
    assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stderr


# --- F13: weights verify and symlinks, writable folders ---------------------------------------------------


def _weights_spec(project: Path, data: bytes) -> None:
    write_spec(project, NAME, weight_dirs={"w": {"path": "/weights/w", "files": [
        {"path": "model.bin", "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}]}})


def test_f13_a_weight_file_linking_out_of_its_dir_is_refused(project, tmp_path):
    data = b"weights " * 100
    _weights_spec(project, data)
    outside = tmp_path / "elsewhere.bin"
    outside.write_bytes(data)  # at the pin: only where it lives is wrong
    wdir = tmp_path / "root" / NAME / "w"
    wdir.mkdir(parents=True)
    (wdir / "model.bin").symlink_to(outside)
    proc = run_envport("weights", "verify", NAME, "--root", str(tmp_path / "root"), "--json", root=project,
                       timeout=60)
    step = as_json(proc)["steps"][-1]
    assert proc.returncode == 3 and step["verdict"] == "REFUSED", step
    assert any("is a symlink to" in ln and str(outside) in ln and "outside" in ln for ln in step["lines"]), step
    (wdir / "model.bin").unlink()
    (wdir / "model.bin").write_bytes(data)
    ok = run_envport("weights", "verify", NAME, "--root", str(tmp_path / "root"), "--json", root=project, timeout=60)
    assert as_json(ok)["steps"][-1]["verdict"] == "present", ok.stdout


def test_f13_a_weights_root_others_can_write_is_named_with_its_mode(project, tmp_path):
    data = b"w" * 64
    _weights_spec(project, data)
    root = tmp_path / "root"
    (root / NAME / "w").mkdir(parents=True)
    (root / NAME / "w" / "model.bin").write_bytes(data)
    os.chmod(root, 0o777)
    proc = run_envport("weights", "verify", NAME, "--root", str(root), root=project, timeout=60)
    assert proc.returncode == 0 and proc.stdout.startswith("present"), proc.stdout
    assert f"warning: {root} is writable by others (drwxrwxrwx)" in proc.stdout, proc.stdout
    assert str(root / NAME) + " is writable" not in proc.stdout  # only the folder that is


# --- F14: every configured secret is scrubbed -----------------------------------------------------------


def test_f14_a_non_gated_weights_token_is_scrubbed_from_output_and_ledger(project, tmp_path):
    token = f"tok_{secrets.token_hex(16)}"
    write_spec(project, NAME, weight_dirs={"w": {"path": "/weights/w", "auth_hint": "MY_WEIGHTS_TOKEN",
                                                 "source": 'echo "fetching with $MY_WEIGHTS_TOKEN"; exit 1',
                                                 "files": [{"path": "m.bin", "size": 1}]}})
    state = tmp_path / "state"
    proc = run_envport("weights", "fetch", NAME, "--root", str(tmp_path / "w"), root=project, timeout=60,
                       env=cli_env(MY_WEIGHTS_TOKEN=token, ENVPORT_STATE_DIR=str(state)))
    assert proc.returncode == 1 and "fetching with ***" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert token not in proc.stdout + proc.stderr
    recorded = b"".join(p.read_bytes() for p in state.rglob("*.json"))
    assert recorded and token.encode() not in recorded


def test_f14_a_token_a_build_step_prints_is_scrubbed(project, tmp_path):
    token = f"tok_{secrets.token_hex(16)}"
    write_spec(project, NAME, pip_phases=[], run_commands=['echo "leaking $MY_WEIGHTS_TOKEN"; exit 7'],
               weight_dirs={"w": {"path": "/weights/w", "auth_hint": "MY_WEIGHTS_TOKEN"}})
    proc = run_envport("build", NAME, "--target", "venv", root=project, timeout=300,
                       env=cli_env(MY_WEIGHTS_TOKEN=token, ENVPORT_ENVS_DIR=str(tmp_path / "envs"),
                                   ENVPORT_STATE_DIR=str(tmp_path / "state")))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "leaking ***" in out, out
    assert token not in out
    assert all(token.encode() not in p.read_bytes() for p in (tmp_path / "state").rglob("*.json"))


# --- F15: ssh never takes a destination as an option ----------------------------------------------------


def test_f15_ssh_argv_puts_the_destination_after_double_dash_and_refuses_a_dash():
    assert ssh_argv("envport-test")[-2:] == ["--", "envport-test"]
    assert ssh_argv(SshHost(ssh="user@host", ssh_config="/x"))[-2:] == ["--", "user@host"]
    for dest in ("-oProxyCommand=touch /tmp/x", "-F/dev/null", ""):
        with pytest.raises(EnvportError, match="ssh would read it as an option"):
            ssh_argv(dest)


@pytest.mark.parametrize("verb", ["build", "verify", "witness"])  # the builder, testinfra, the SSH launcher
def test_f15_a_dash_destination_never_runs_a_proxy_command(project, tmp_path, verb):
    if not shutil.which("ssh"):
        missing("no ssh client (apt-get install openssh-client)")
    write_spec(project, NAME)
    mark = tmp_path / "proxied"
    host = f"-oProxyCommand=touch {mark}"
    proc = run_envport(verb, NAME, "--target", "venv", "--host", host, root=project, timeout=60)
    assert not mark.exists(), "ssh ran the ProxyCommand the destination smuggled in"
    assert proc.returncode == 3 and "ssh would read it as an option" in proc.stdout + proc.stderr, \
        proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr

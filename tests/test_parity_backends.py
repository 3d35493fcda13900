"""`envport parity`: demo-cpu on docker, a venv here and a venv over SSH hold the same things.

Units cover the normalization and the diff; the real run builds (or finds
present) all three and compares them from inside; a package pip-installed
into one of them is then named and fails the run.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from envport.report.parity import Difference, TargetFacts, differences, parse_freeze, python_precision
from envport.spec.model import canonical_name as canonical
from envport.core.verdict import StepResult, Verdict

from .support import ENV_NAME, cli_env, fail_with, run_envport

INJECTED = ("iniconfig", "2.3.0")  # small, pure Python, on the local index; in none of the demo-cpu envs


def test_pep503_names_and_exclusions():
    freeze = ["Typing_Extensions==4.16.0", "pip==23.0.1", "setuptools==66.1.1", "wheel==0.42.0",
              "zope.interface==6.0", "torch @ file:///opt/wheels/torch-2.13.0%2Bcpu-cp311-cp311-linux.whl",
              "envport==0.1.0", "-e git+https://x/y#egg=z", "# comment"]
    got = parse_freeze(freeze, versions={"torch": "2.13.0+cpu"})
    assert got == {"typing-extensions": "4.16.0", "zope-interface": "6.0", "torch": "2.13.0+cpu"}
    assert canonical("Foo.Bar__baz") == "foo-bar-baz"


def test_python_is_compared_at_the_precision_the_spec_declares():
    assert python_precision("3.11", "3.11.7") == "3.11"
    assert python_precision("3.11.2", "3.11.7") == "3.11.7"


def _facts(target, python="3.11.7", packages=None, env=None):
    return TargetFacts(target, build=StepResult("build", Verdict.OK), python=python,
                       packages=packages or {"torch": "2.13.0+cpu"}, env=env or {"ENVPORT_NAME": "demo-cpu"})


def test_differences_name_what_differs_and_ignore_skipped_targets(session_project):
    from envport.report.parity import locked_packages
    from envport.spec.loader import load_spec

    loaded = load_spec(ENV_NAME, session_project)
    # demo-cpu has a lock: targets that agree must also hold exactly what it promises.
    lock = locked_packages(loaded)
    base = dict(lock) if lock is not None else {"torch": "2.13.0+cpu"}
    same = [_facts("docker", python="3.11.2", packages=base), _facts("venv", packages=base),
            TargetFacts("conda", skipped="no_conda: ...")]
    assert differences(loaded, same) == []
    other = [_facts("docker", packages=base), _facts("venv", packages={**base, "requests": "2.31.0"},
                                                     env={"ENVPORT_NAME": "demo-cpu", "OMP_NUM_THREADS": "2"})]
    diffs = differences(loaded, other)
    assert Difference("package", "requests", {"docker": None, "venv": "2.31.0"}) in diffs
    assert Difference("env", "OMP_NUM_THREADS", {"docker": None, "venv": "2"}) in diffs
    if lock is not None:  # both agree on a package the lock does not name: still a difference, from the lock
        agreeing = [_facts("docker", packages={**base, "requests": "2.31.0"}),
                    _facts("venv", packages={**base, "requests": "2.31.0"})]
        assert differences(loaded, agreeing) == [
            Difference("lock", "requests", {"lock": None, "docker": "2.31.0", "venv": "2.31.0"})]
    assert diffs[0].line() == "package requests: docker -, venv 2.31.0"


@pytest.mark.ssh
@pytest.mark.docker
def test_parity_passes_across_docker_local_venv_and_venv_over_ssh(demo_image, local_venv, ssh_venv,
                                                                   session_project):
    proc = run_envport("parity", ENV_NAME, "--json", root=session_project,
                       env=cli_env(ENVPORT_SSH_ENVS_DIR=ssh_venv.envs_dir), timeout=900)
    out = json.loads(proc.stdout) if proc.stdout.startswith("{") else None
    assert proc.returncode == 0 and out, fail_with(proc, "envport parity")
    compared = {t["target"]: t for t in out["targets"] if not t["skipped"]}
    assert set(compared) == {"docker", "apptainer", "venv", "venv@test"}, out["targets"]
    assert compared["docker"]["where"] == demo_image.tag
    assert compared["venv"]["where"] == local_venv.prefix and compared["venv@test"]["where"] == ssh_venv.prefix
    assert local_venv.prefix != ssh_venv.prefix  # built twice, really
    for t in compared.values():
        assert t["packages"]["torch"].startswith("2.13.0") and t["packages"]["six"] == "1.16.0"
        assert t["env"]["DEMO_GREETING"] == "hello from demo-cpu" and "ENVPORT_HASH" not in t["env"]
        assert "pip" not in t["packages"] and "setuptools" not in t["packages"]
    assert out["differences"] == [] and out["verdict"] == "OK"


@pytest.mark.ssh
@pytest.mark.docker
def test_an_injected_package_is_named_and_repaired_by_the_build(demo_image, local_venv, ssh_venv, ssh_host,
                                                               session_project):
    """A package installed by hand into the host env: parity's build step finds the env not `present`
    (its installed distributions differ from its build's record), names the package and rebuilds it,
    so the targets agree again; the env is never reported as the spec's with the extra package in it."""
    name, version = INJECTED
    pip = f"{ssh_venv.prefix}/bin/pip"
    installed = subprocess.run(ssh_host.argv(f"{pip} install -q --no-deps {name}=={version}"),
                               capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr
    proc = run_envport("parity", ENV_NAME, "--no-ledger", root=session_project,
                       env=cli_env(ENVPORT_SSH_ENVS_DIR=ssh_venv.envs_dir), timeout=900)
    assert f"changed since its build: {canonical(name)} {version} was added" in proc.stderr, proc.stderr
    still = subprocess.run(ssh_host.argv(f"{ssh_venv.prefix}/bin/python -m pip show -q {name}"),
                           capture_output=True, text=True, timeout=120)
    assert still.returncode != 0, f"{name} is still installed in {ssh_venv.prefix}"
    assert proc.returncode == 0, fail_with(proc, "parity after an injected package")
    assert f"OK parity {ENV_NAME}:" in proc.stdout, proc.stdout

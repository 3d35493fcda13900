"""Builds from a lock: ordered passes, and the same `pip freeze` as the lock on every backend, with pip and uv.

The collision test uses two tiny local wheels that ship the same file (no network); the demo-cpu tests
build the real env (torch from the host's pinned CPU wheel) as a venv here, over SSH and as a docker
image, and compare each env's `pip freeze` with what specs/demo-cpu.lock promises.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from envport.builders.lock import lock_spec, normalize_freeze
from envport.core.verdict import Verdict
from envport.plan.lock import load_for
from envport.plan.site import Site
from envport.spec.loader import load_spec
from tests.support import (BUILD_TIMEOUT, ENV_NAME, PY, as_json, cli_env, fail_with, run_envport, write_site,
                           write_spec)
from tests.tinywheels import local_phase, make_wheel

COLLIDING = "envport_collide/data.txt"
# How many .pyc files torch has in an env's venv (run inside the image or SIF).
COUNT_TORCH_PYCS = 'find "$VIRTUAL_ENV"/lib/python*/site-packages/torch -name "*.pyc" | wc -l'


def _collide_project(root: Path, first: str, second: str) -> Path:
    (root / "specs").mkdir(parents=True)
    (root / "sites").mkdir()
    make_wheel(root / "wheels", "envport-ca", "1.0", files={COLLIDING: "from A\n", "envport_ca.py": ""})
    make_wheel(root / "wheels", "envport-cb", "1.0", files={COLLIDING: "from B\n", "envport_cb.py": ""})
    write_spec(root, "collide", python=PY, env={}, pip_phases=[local_phase(root, f"{first}==1.0"),
                                                               local_phase(root, f"{second}==1.0")])
    result = lock_spec(load_spec("collide", root), Site(name="t"), root, lambda _: None)
    assert result.verdict is Verdict.OK, (result.detail, result.lines)
    return root


def _data_file(prefix: Path) -> str:
    found = sorted(prefix.glob(f"lib/python*/site-packages/{COLLIDING}"))
    assert len(found) == 1, found
    return found[0].read_text()


@pytest.mark.parametrize("first,second,left", [("envport-ca", "envport-cb", "from B\n"),
                                               ("envport-cb", "envport-ca", "from A\n")])
def test_two_ordered_passes_leave_what_the_second_pass_installed(tmp_path, first, second, left):
    root = _collide_project(tmp_path / "p", first, second)
    lock = load_for(load_spec("collide", root))
    assert [[d.name for d in p.dists] for p in lock.phases] == [[first], [second]]
    envs = tmp_path / "envs"
    proc = run_envport("build", "collide", "--target", "venv", "--json", root=root,
                       env=cli_env(ENVPORT_ENVS_DIR=str(envs)), timeout=300)
    assert proc.returncode == 0, fail_with(proc, "envport build collide --target venv")
    assert _data_file(envs / "collide") == left


def _freeze(python: str, prefix: list[str] | None = None) -> list[str]:
    proc = subprocess.run([*(prefix or []), python, "-m", "pip", "freeze"], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    return normalize_freeze(proc.stdout.splitlines())


def _lock_freeze(root: Path) -> list[str]:
    lock = load_for(load_spec(ENV_NAME, root))
    assert lock is not None, f"{root}/specs/{ENV_NAME}.lock is missing: run `envport lock {ENV_NAME}`"
    return normalize_freeze(lock.freeze())


def test_demo_venv_with_pip_freezes_to_the_lock(local_venv):
    assert _freeze(local_venv.python) == _lock_freeze(local_venv.root)


def test_demo_venv_with_uv_freezes_to_the_lock(project, tmp_path):
    site = write_site(project, "uv-site", installer="uv")
    envs = tmp_path / "envs"
    proc = run_envport("build", ENV_NAME, "--target", "venv", "--site", site, "--json", root=project,
                       env=cli_env(ENVPORT_ENVS_DIR=str(envs)), timeout=BUILD_TIMEOUT)
    assert proc.returncode == 0, fail_with(proc, "envport build --target venv --site uv-site")
    python = str(envs / ENV_NAME / "bin" / "python")
    assert _freeze(python) == _lock_freeze(project)
    # uv seeded the venv with ensurepip's own pip, the one `python -m venv` would have installed.
    seeded = subprocess.run([python, "-c", "import ensurepip, pip; print(ensurepip.version(), pip.__version__)"],
                            capture_output=True, text=True, timeout=120)
    bundled, installed = seeded.stdout.split()
    assert bundled == installed, seeded.stdout + seeded.stderr
    # uv itself stays out of the env: it lives beside the envs.
    assert not list((envs / ENV_NAME).glob("lib/python*/site-packages/uv"))


def test_demo_venv_over_ssh_freezes_to_the_lock(ssh_venv, ssh_host):
    assert _freeze(ssh_venv.python, ssh_host.argv()) == _lock_freeze(ssh_venv.root)


def test_demo_image_with_pip_freezes_to_the_lock(demo_image):
    assert _freeze("python", ["docker", "run", "--rm", demo_image.tag]) == _lock_freeze(demo_image.root)


def test_demo_image_with_uv_freezes_to_the_lock(demo_image, session_project):
    site = write_site(session_project, "uv-docker", installer="uv")
    proc = run_envport("build", ENV_NAME, "--target", "docker", "--site", site, "--json", root=session_project,
                       timeout=BUILD_TIMEOUT)
    assert proc.returncode == 0, fail_with(proc, "envport build --target docker --site uv-docker")
    tag = as_json(proc)["steps"][-1]["data"]["image"]
    assert tag != demo_image.tag  # the installer reaches the recipe, so it is another image
    assert _freeze("python", ["docker", "run", "--rm", tag]) == _lock_freeze(session_project)
    ls = subprocess.run(["docker", "run", "--rm", tag, "sh", "-c", "ls -A /opt/envport-tools; which uv || true"],
                        capture_output=True, text=True, timeout=120)
    assert ls.stdout.strip() == "", f"uv left in the image: {ls.stdout}"
    # uv's own default leaves bytecode to the first import; pip compiled torch's while installing.
    assert _torch_pycs(tag) == 0
    assert _torch_pycs(demo_image.tag) > 1000


def test_demo_sif_with_uv_freezes_to_the_lock(base_image, session_project):
    from envport.sif.gate import gate
    from envport.sif.run import ch_run_argv, ch_run_env, mounted
    from tests.sif_fixtures import build_sif, require_sif_tools

    require_sif_tools()
    # lz4: the squashfs of torch is the slow part of a SIF, and its compression is not what is tested here
    site = write_site(session_project, "uv-sif", installer="uv", apptainer={"compression": "lz4"})
    sif = build_sif(session_project, ENV_NAME, site)
    with mounted(gate(sif.path)) as mnt:
        def inside(*argv: str) -> str:
            proc = subprocess.run(ch_run_argv(str(mnt), argv), capture_output=True, text=True, timeout=300,
                                  env=ch_run_env())
            assert proc.returncode == 0, proc.stderr
            return proc.stdout

        assert normalize_freeze(inside("python", "-m", "pip", "freeze").splitlines()) == _lock_freeze(session_project)
        # uv was copied in for %post and removed; bytecode is left to the first import, as uv does.
        assert inside("sh", "-c", "ls -A /opt/envport-build 2>/dev/null; command -v uv || true").strip() == ""
        assert inside("sh", "-c", COUNT_TORCH_PYCS).strip() == "0"


def _torch_pycs(image: str) -> int:
    count = subprocess.run(["docker", "run", "--rm", image, "sh", "-c", COUNT_TORCH_PYCS], capture_output=True,
                           text=True, timeout=120)
    assert count.returncode == 0, count.stderr
    return int(count.stdout)


def test_no_lock_builds_unlocked_and_the_ledger_says_so(project, tmp_path):
    write_spec(project, "tiny6", python=PY)
    result = lock_spec(load_spec("tiny6", project), Site(name="t"), project, lambda _: None)
    assert result.verdict is Verdict.OK
    env = cli_env(ENVPORT_ENVS_DIR=str(tmp_path / "envs"), ENVPORT_STATE_DIR=str(tmp_path / "state"))
    hashes = {}
    for flags in ([], ["--no-lock"]):
        proc = run_envport("build", "tiny6", "--target", "venv", *flags, root=project, env=env, timeout=300)
        assert proc.returncode == 0, fail_with(proc, f"envport build {' '.join(flags)}")
        hashes[bool(flags)] = proc.stdout.strip().splitlines()[-1].split()[1]
    assert hashes[True] != hashes[False]  # unlocked is another env, under another name
    ledger = run_envport("ledger", "tiny6", "--json", root=project, env=env)
    assert '"off (--no-lock)"' in ledger.stdout and '"tiny6.lock"' in ledger.stdout, ledger.stdout + ledger.stderr


def test_demo_venv_over_ssh_with_uv_freezes_to_the_lock(project, ssh_host):
    import shlex

    site = write_site(project, "uv-ssh", installer="uv")
    made = subprocess.run(ssh_host.argv("mktemp -d /var/tmp/envport-ssh-envs-uv.XXXXXX"), capture_output=True,
                          text=True, timeout=60)
    assert made.returncode == 0 and made.stdout.strip(), made.stderr
    envs = made.stdout.strip()
    try:
        proc = run_envport("build", ENV_NAME, "--target", "venv", "--host", "test", "--site", site, "--json",
                           root=project, env=cli_env(ENVPORT_ENVS_DIR=envs), timeout=BUILD_TIMEOUT)
        assert proc.returncode == 0, fail_with(proc, "envport build --target venv --host test --site uv-ssh")
        assert _freeze(f"{envs}/{ENV_NAME}/bin/python", ssh_host.argv()) == _lock_freeze(project)
    finally:
        subprocess.run(ssh_host.argv(f"rm -rf {shlex.quote(envs)}"), capture_output=True, timeout=120)

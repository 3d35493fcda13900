"""Direct references (`name @ git+…@<commit>`, `name @ file:///…whl#sha256=…`): render, build, verify.

No network: the git repo is a local one made here (`git init` + a tiny
setuptools project, installed through `git+file://`), the wheel is written
here with its sha256.  The venv target is enough to prove build + verify
(verify's pin checks read the installed version and, for a git commit,
direct_url.json's commit_id); the builds go to a temporary ENVPORT_ENVS_DIR.
Building the git project needs setuptools in pip's isolated build env: the
host's pip configuration supplies it from its local index.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from envport.builders.lock import hash_mismatches, normalize_freeze
from envport.plan.lock import LockError, load_for, parse, write_text
from envport.report.parity import parse_freeze
from envport.spec.model import PipPhase, direct_ref, requirement_warnings
from envport.spec.loader import load_spec
from tests.support import PY, run_envport
from tests.tinywheels import make_wheel

BUILD_TIMEOUT = 600
GIT_ENV = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.org"}


def make_git_project(root: Path) -> str:
    """A one-module setuptools project committed to a local git repo; returns the commit sha."""
    root.mkdir(parents=True)
    (root / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=61"]\nbuild-backend = "setuptools.build_meta"\n\n'
        '[project]\nname = "tinygit"\nversion = "0.3"\n\n[tool.setuptools]\npy-modules = ["tinygit"]\n')
    (root / "tinygit.py").write_text("VALUE = 'from git'\n")
    for argv in (["git", "init", "-q", "-b", "main"], ["git", "add", "."], ["git", "commit", "-q", "-m", "one"]):
        subprocess.run(argv, cwd=root, check=True, env=GIT_ENV)
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, check=True, capture_output=True,
                          text=True).stdout.strip()


def tiny_wheel(dest_dir: Path) -> Path:
    return make_wheel(dest_dir, "tinywheel", "0.2", files={"tinywheel.py": "VALUE = 'from a wheel'\n"})


def test_direct_references_validate_and_a_branch_ref_warns():
    sha = "0123456789abcdef0123456789abcdef01234567"
    for text in (f"openfold @ git+https://github.com/aqlaboratory/openfold@{sha}",
                 "w @ https://example.org/w-1.0-py3-none-any.whl#sha256=" + "a" * 64):
        assert PipPhase(packages=[text]).packages == [text]
    assert direct_ref(f"a @ git+https://x/a.git@{sha}") == ("git", f"git+https://x/a.git@{sha}", sha)
    with pytest.raises(ValueError, match="must end in #sha256="):
        PipPhase(packages=["w @ https://example.org/w-1.0-py3-none-any.whl"])
    with pytest.raises(ValueError, match="direct reference must be"):
        PipPhase(packages=["w @ ftp://example.org/w.whl"])
    with pytest.raises(ValueError, match="git\\+file://localhost/PATH"):
        PipPhase(packages=[f"a @ git+file:///srv/a@{sha}"])


def test_branch_ref_warning_names_the_risk(tmp_path: Path):
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "b.yaml").write_text(
        'name: b\nbase: debian:bookworm-slim\npython: "3.11"\n'
        'pip_phases:\n  - ["tool @ git+https://github.com/example/tool@main", "x @ git+https://github.com/e/x"]\n')
    warnings = requirement_warnings(load_spec("b", tmp_path).spec)
    assert [w[0] for w in warnings] == ["pip_phases[0].packages[0]", "pip_phases[0].packages[1]"]
    assert "ref 'main' is not a full commit sha" in warnings[0][1]
    assert "no ref (the default branch)" in warnings[1][1]
    assert "the content hash does not" in warnings[0][1]


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git to make the local repository")
def test_direct_references_render_build_and_verify(tmp_path: Path):
    sha = make_git_project(tmp_path / "repo")
    wheel = tiny_wheel(tmp_path)
    wheel_sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    git_req = f"tinygit @ git+file://localhost{tmp_path / 'repo'}@{sha}"
    wheel_req = f"tinywheel @ file://{wheel}#sha256={wheel_sha}"
    project = tmp_path / "project"
    (project / "specs").mkdir(parents=True)
    (project / "specs" / "refs.yaml").write_text(
        f'name: refs\nbase: debian:bookworm-slim\npython: "3.11"\n'
        f'pip_phases:\n  - ["{git_req}"]\n  - ["{wheel_req}"]\n'
        f'witnesses:\n  imports: [tinygit, tinywheel]\n')
    env = {**os.environ, "ENVPORT_ENVS_DIR": str(tmp_path / "envs"), "ENVPORT_STATE_DIR": str(tmp_path / "state")}

    render = run_envport("render", "refs", root=project, env=env)
    assert render.returncode == 0, render.stdout + render.stderr
    images = project / "images" / "refs"
    for recipe in ("Dockerfile", "refs.def", "setup-venv.sh", "setup-conda.sh"):
        text = (images / recipe).read_text()
        # Every renderer passes the requirement as one shell-quoted word.
        assert f"'{git_req}'" in text, recipe
        assert f"'{wheel_req}'" in text, recipe

    build = run_envport("build", "refs", "--target", "venv", root=project, env=env)
    assert build.returncode == 0, build.stdout + build.stderr
    verify = run_envport("verify", "refs", "--target", "venv", root=project, env=env)
    out = verify.stdout + verify.stderr
    assert verify.returncode == 0, out
    assert f"pip[tinygit@{sha}]" in out, out
    assert "pip[tinywheel==0.2]" in out, out

    # The pin check can fail: the same project at another commit, installed over the built one, is named.
    (tmp_path / "repo" / "tinygit.py").write_text("VALUE = 'moved'\n")
    subprocess.run(["git", "commit", "-qam", "two"], cwd=tmp_path / "repo", check=True, env=GIT_ENV)
    other = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path / "repo", check=True, capture_output=True,
                           text=True).stdout.strip()
    [python] = [p for p in (tmp_path / "envs").rglob("bin/python") if (p.parent / "pip").exists()]
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall",
                    f"tinygit @ git+file://localhost{tmp_path / 'repo'}@{other}"], check=True, timeout=BUILD_TIMEOUT)
    moved = run_envport("verify", "refs", "--target", "venv", root=project, env=env)
    out = moved.stdout + moved.stderr
    assert moved.returncode != 0, out
    assert f"tinygit 0.3 was installed from commit {other}, the spec pins {sha}" in out, out


def test_validate_prints_the_branch_warning_and_passes(tmp_path: Path):
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "b.yaml").write_text(
        'name: b\nbase: debian:bookworm-slim\npython: "3.11"\n'
        'pip_phases:\n  - ["tool @ git+https://github.com/example/tool@main"]\n')
    proc = run_envport("validate", "b", root=tmp_path, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr
    assert "WARNING  " in proc.stderr and "ref 'main' is not a full commit sha" in proc.stderr


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git to make the local repository")
def test_lock_of_a_git_reference_is_refused_naming_why(tmp_path: Path):
    # pip cannot hash a VCS checkout (--require-hashes refuses it), so there is no digest to lock; the lock
    # says so, with the fix, before writing anything.
    req = f"tinygit @ git+file://localhost{tmp_path / 'repo'}@{make_git_project(tmp_path / 'repo')}"
    project = _wheel_project(tmp_path, req)
    proc = run_envport("lock", "refs", root=project, env={**os.environ, "ENVPORT_STATE_DIR": str(tmp_path / "state")})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 3, out
    assert "REFUSED  lock refs [unlockable]: phase 1: tinygit comes from a VCS checkout" in out, out
    assert "pip cannot hash a checkout" in out and "build a wheel at that commit" in out, out
    assert not (project / "specs" / "refs.lock").exists()


def _wheel_project(tmp_path: Path, req: str) -> Path:
    project = tmp_path / "project"
    (project / "specs").mkdir(parents=True)
    (project / "specs" / "refs.yaml").write_text(
        f'name: refs\nbase: debian:bookworm-slim\npython: "{PY}"\npip_phases:\n  - ["{req}"]\n')
    return project


def _locked_wheel_project(tmp_path: Path) -> tuple[Path, Path, str, dict]:
    """A spec whose one phase is `tinywheel @ file:///…whl#sha256=…`, locked: (project, wheel, url, env)."""
    wheel = tiny_wheel(tmp_path)
    url = f"file://{wheel}#sha256={hashlib.sha256(wheel.read_bytes()).hexdigest()}"
    project = _wheel_project(tmp_path, f"tinywheel @ {url}")
    env = {**os.environ, "ENVPORT_ENVS_DIR": str(tmp_path / "envs"), "ENVPORT_STATE_DIR": str(tmp_path / "state")}
    proc = run_envport("lock", "refs", root=project, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return project, wheel, url, env


def test_a_wheel_reference_locks_builds_verifies_and_freezes_to_the_lock(tmp_path: Path):
    project, wheel, url, env = _locked_wheel_project(tmp_path)
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    # The entry keeps the spec's own URL beside name, version, file and digest; the locked line installs from it.
    text = (project / "specs" / "refs.lock").read_text()
    assert (f'name = "tinywheel"\nversion = "0.2"\nurl = "{url}"\nfile = "{wheel.name}"\nsha256 = "{sha}"\n'
            in text), text
    lock = load_for(load_spec("refs", project))
    [dist] = lock.final().values()
    assert dist.url == url and dist.sha256 == sha
    assert lock.phases[0].requirements_text() == f"tinywheel @ {url} --hash=sha256:{sha}\n"
    assert parse(write_text(lock, "specs/refs.yaml"), project / "specs" / "refs.lock") == lock
    check = run_envport("lock", "--check", "refs", root=project, env=env)
    assert check.returncode == 0, check.stdout + check.stderr

    build = run_envport("build", "refs", "--target", "venv", root=project, env=env)
    assert build.returncode == 0, build.stdout + build.stderr
    [python] = [p for p in (tmp_path / "envs").rglob("bin/python") if (p.parent / "pip").exists()]
    # Built from the lock: the phase's requirements file in the env is the locked line.
    assert (python.parent.parent / ".envport" / "locks" / "pip-1.txt").read_text() == \
        f"tinywheel @ {url} --hash=sha256:{sha}\n"
    verify = run_envport("verify", "refs", "--target", "venv", root=project, env=env)
    out = verify.stdout + verify.stderr
    assert verify.returncode == 0, out
    assert "pip[tinywheel==0.2]" in out, out

    # pip freeze prints `tinywheel @ URL`; read with the installed version (as parity does), it is the lock.
    frozen = subprocess.run([str(python), "-m", "pip", "freeze"], capture_output=True, text=True, check=True).stdout
    assert f"tinywheel @ {url.split('#')[0]}" in frozen, frozen
    listed = json.loads(subprocess.run([str(python), "-m", "pip", "list", "--format=json"], capture_output=True,
                                       text=True, check=True).stdout)
    got = parse_freeze(frozen.splitlines(), {p["name"]: p["version"] for p in listed})
    assert normalize_freeze([f"{n}=={v}" for n, v in got.items()]) == normalize_freeze(lock.freeze()) \
        == ["tinywheel==0.2"]


def test_a_swapped_wheel_at_the_referenced_path_fails_naming_it(tmp_path: Path):
    project, wheel, _, env = _locked_wheel_project(tmp_path)
    want = hashlib.sha256(wheel.read_bytes()).hexdigest()
    with zipfile.ZipFile(wheel, "a") as zf:  # same path, same name, other bytes
        zf.writestr("extra.txt", "swapped\n")
    got = hashlib.sha256(wheel.read_bytes()).hexdigest()
    build = run_envport("build", "refs", "--target", "venv", root=project, env=env)
    out = build.stdout + build.stderr
    assert build.returncode == 1, out
    assert (f"FAILED   build refs (venv) [hash_mismatch]: {wheel.name}: sha256 {got}, the lock says {want}"
            in build.stdout), out
    assert not list((tmp_path / "envs").glob("refs/lib/python*/site-packages/tinywheel.py"))


def test_a_lock_entry_url_is_checked_and_pip_direct_mismatch_output_is_read(tmp_path: Path):
    sha = "a" * 64
    entry = (f'format = 1\nenv = "x"\npython = "{PY}"\nplatform = "p"\ninputs = "i"\n[[phase]]\nindex = 1\n'
             f'packages = []\n[[phase.dists]]\nname = "w"\nversion = "1"\nurl = URL\nfile = "w-1-py3-none-any.whl"\n'
             f'sha256 = "{sha}"\n')
    with pytest.raises(LockError, match=r"dists\[1\]\.url: expected an https:// or file:// URL"):
        parse(entry.replace("URL", '"git+https://h/w@x"'), tmp_path / "x.lock")
    with pytest.raises(LockError, match=r"dists\[1\]\.url"):
        parse(entry.replace("URL", '"file:///w.whl --index-url=http://evil"'), tmp_path / "x.lock")
    ok = parse(entry.replace("URL", f'"https://h/w-1-py3-none-any.whl#sha256={sha}"'), tmp_path / "x.lock")
    assert ok.phases[0].dists[0].requirement() == f"w @ https://h/w-1-py3-none-any.whl#sha256={sha} --hash=sha256:{sha}"
    lines = ["ERROR: THESE PACKAGES DO NOT MATCH THE HASHES FROM THE REQUIREMENTS FILE.",
             f"    w@ file:///d/w-1-py3-none-any.whl#sha256={sha} from file:///d/w-1-py3-none-any.whl#sha256={sha} "
             "(from -r req.txt (line 1)):",
             f"        Expected sha256 {sha}", f"        Expected     or {sha}", f"             Got        {'b' * 64}"]
    assert hash_mismatches(lines) == [f"w-1-py3-none-any.whl: sha256 {'b' * 64}, the lock says {sha}"]

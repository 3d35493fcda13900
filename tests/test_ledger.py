"""The ledger: kept in the user's state dir (never the checkout), locked appends that lose nothing,
and the doc regenerated on purpose by `envport ledger NAME --write-docs`, deterministically."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
from pathlib import Path

import pytest

from envport.report import ledger

from .support import REPO, run_envport

H1, H2 = "a" * 64, "b" * 64


@pytest.fixture
def state(tmp_path, monkeypatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv(ledger.STATE_DIR_VAR, str(d))
    return d


def _append_many(root, n):
    for i in range(n):
        ledger.append(root, "env1", {"kind": "verify", "target": "docker", "hash": H1, "verdict": "OK", "i": i})


def test_concurrent_appends_lose_nothing(tmp_path, state):
    root = tmp_path / "proj"
    procs = [multiprocessing.Process(target=_append_many, args=(root, 15)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    records = json.loads(ledger.ledger_path(root, "env1").read_text())["records"]
    assert len(records) == 60
    assert all(r["key"] == f"env:env1@{H1[:12]}" and r["host"] and r["when"] for r in records)


def test_the_ledger_lives_in_the_state_dir_keyed_by_project(tmp_path, state, monkeypatch):
    a, b = tmp_path / "one" / "proj", tmp_path / "two" / "proj"
    ledger.append(a, "env1", {"kind": "build", "hash": H1, "verdict": "OK"})
    path = ledger.ledger_path(a, "env1")
    assert state in path.parents and path.is_file()
    assert ledger.read(b, "env1") == []  # another checkout of the same name is another project
    assert not a.exists()  # nothing written into the project
    # Precedence: $ENVPORT_STATE_DIR, then the site's ledger_dir, then $XDG_STATE_HOME/envport.
    assert ledger.state_dir("/site/ledgers") == state
    monkeypatch.delenv(ledger.STATE_DIR_VAR)
    assert ledger.state_dir("/site/ledgers") == Path("/site/ledgers")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert ledger.state_dir() == tmp_path / "xdg" / "envport"
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert ledger.state_dir() == tmp_path / "home" / ".local" / "state" / "envport"


def _sample(root):
    ledger.append(root, "env1", {"kind": "build", "target": "docker", "hash": H1, "verdict": "OK",
                                 "image": "envport/env1:aaaaaaaaaaaa", "resources": {"cpus": 2},
                                 "weights": {"hf": "/weights/hf"}, "sm_range": ["sm_80", "sm_90"]})
    ledger.append(root, "env1", {"kind": "witness", "target": "docker", "hash": H1, "verdict": "OK",
                                 "summary": "8 OK", "image": "envport/env1:aaaaaaaaaaaa"})
    ledger.append(root, "env1", {"kind": "build", "target": "venv", "hash": H2, "verdict": "REFUSED",
                                 "summary": "no python3.11"})
    ledger.append(root, "env1", {"kind": "verify", "target": "venv", "hash": H2, "verdict": "FAILED",
                                 "summary": "1 failed, 7 passed"})


def test_doc_has_one_block_per_hash_with_what_was_done(tmp_path, state):
    _sample(tmp_path)
    assert not ledger.doc_path(tmp_path, "env1").exists()  # appends never write the doc
    doc = ledger.write_doc(tmp_path, "env1", ledger.read(tmp_path, "env1")).read_text()
    first, second = doc.split("### env: env1@")[1:]
    assert first.startswith(H2[:12])  # the newest env first
    assert "how: not built on this host" in first and "validated: never" in first
    assert "last failure:" in first and "1 failed, 7 passed" in first
    assert second.startswith(H1[:12])
    assert "how: docker: image envport/env1:aaaaaaaaaaaa" in second
    assert 'tier: {"cpus": 2}' in second and "weights: hf=/weights/hf" in second
    assert "sm_range: sm_80..sm_90" in second and "(witness on docker" in second and "8 OK" in second


def test_a_later_run_of_an_older_env_does_not_move_its_block(tmp_path, state):
    _sample(tmp_path)
    before = ledger.render_doc("env1", ledger.read(tmp_path, "env1"))
    ledger.append(tmp_path, "env1", {"kind": "witness", "target": "docker", "hash": H1, "verdict": "OK",
                                     "summary": "9 OK", "image": "envport/env1:aaaaaaaaaaaa"})
    after = ledger.render_doc("env1", ledger.read(tmp_path, "env1"))
    order = [b[:12] for b in after.split("### env: env1@")[1:]]
    assert order == [b[:12] for b in before.split("### env: env1@")[1:]] == [H2[:12], H1[:12]]
    assert "9 OK" in after and "9 OK" not in before


def test_ledger_command_prints_records_and_writes_the_doc_only_when_asked(tmp_path, state):
    root = tmp_path / "proj"
    (root / "specs").mkdir(parents=True)
    _sample(root)
    env = {**os.environ, ledger.STATE_DIR_VAR: str(state)}
    proc = run_envport("ledger", "env1", root=root, env=env, timeout=60, check=True)
    assert f"({len(ledger.read(root, 'env1'))} record(s))" in proc.stdout and "1 failed, 7 passed" in proc.stdout
    assert not (root / "docs").exists()
    out = json.loads(run_envport("ledger", "env1", "--json", root=root, env=env, timeout=60, check=True).stdout)
    assert out["command"] == "ledger" and out["exit_code"] == 0 and len(out["records"]) == 4
    run_envport("ledger", "env1", "--write-docs", root=root, env=env, timeout=60, check=True)
    doc = (root / "docs" / "envs" / "env1.md").read_bytes()
    run_envport("ledger", "env1", "--write-docs", root=root, env=env, timeout=60, check=True)
    assert (root / "docs" / "envs" / "env1.md").read_bytes() == doc  # deterministic


def test_the_checkout_holds_no_ledger():
    tracked = subprocess.run(["git", "ls-files", "images"], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.split()
    assert not [p for p in tracked if p.endswith(("ledger.json", "ledger.lock"))], tracked


def test_a_real_build_verify_and_witness_leave_the_checkout_clean(tmp_path):
    """Issue: every build, verify and witness appended to the committed images/<name>/ledger.json, so a
    checkout was dirty after any local run.  The real CLI, a real venv (small local wheels), the default
    state dir ($XDG_STATE_HOME/envport): `git status` of the project stays empty, the records are there."""
    import shutil

    from .tinywheels import ShellProject, make_wheelhouse, spec_data

    proj = ShellProject(tmp_path / "proj", tmp_path / "envs", make_wheelhouse(tmp_path / "wheels"))
    (proj.root / "specs").mkdir(parents=True)
    shutil.copytree(REPO / "sites", proj.root / "sites")
    shutil.copy2(REPO / ".gitignore", proj.root / ".gitignore")
    proj.write(spec_data("tiny", [["alpha==1.0"]], env={"GREETING": "hi"}))
    env = proj.env(XDG_STATE_HOME=str(tmp_path / "xdg"))
    env.pop(ledger.STATE_DIR_VAR, None)
    run_envport("render", "tiny", root=proj.root, env=env, timeout=120, check=True)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "x"]):
        subprocess.run([*git, *args], cwd=proj.root, check=True, capture_output=True)
    assert (proj.root / "images" / "tiny" / "Dockerfile").is_file()
    for args in (("build", "tiny", "--target", "venv"), ("verify", "tiny", "--target", "venv"),
                 ("witness", "tiny", "--target", "venv", "--only", "python")):
        run_envport(*args, root=proj.root, env=env, timeout=300, check=True)
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=proj.root,
                            capture_output=True, text=True, check=True).stdout
    assert status == "", status
    path = tmp_path / "xdg" / "envport" / ledger.LEDGER_SUBDIR / ledger.project_key(proj.root) / "tiny.json"
    records = json.loads(path.read_text())["records"]
    assert [(r["kind"], r["target"], r["verdict"]) for r in records] == [
        ("build", "venv", "OK"), ("verify", "venv", "OK"), ("witness", "venv", "OK")], records


def test_a_site_profile_names_where_its_ledgers_live(tmp_path, monkeypatch):
    from envport.core.verdict import StepResult, Verdict
    from envport.plan.site import load_site
    from envport.spec.model import Spec

    monkeypatch.delenv(ledger.STATE_DIR_VAR, raising=False)
    root = tmp_path / "proj"
    (root / "sites").mkdir(parents=True)
    (root / "specs").mkdir()
    (root / "sites" / "cluster.yaml").write_text(f"name: cluster\nledger_dir: {tmp_path / 'shared-ledgers'}\n")
    site = load_site("cluster", root)
    spec = Spec(name="env1", base="debian:bookworm-slim", python="3.11")
    ledger.record(root, spec, kind="build", target="venv", hash_=H1, result=StepResult("build", Verdict.OK, "x"),
                  site=site)
    path = ledger.ledger_path(root, "env1", site.ledger_dir)
    assert (tmp_path / "shared-ledgers") in path.parents and path.is_file()
    env = {k: v for k, v in os.environ.items() if k != ledger.STATE_DIR_VAR}
    out = json.loads(run_envport("ledger", "env1", "--site", "cluster", "--json", root=root, env=env, timeout=60,
                                 check=True).stdout)
    assert out["ledger"] == str(path) and [r["kind"] for r in out["records"]] == ["build"]

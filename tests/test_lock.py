"""specs/<name>.lock: the file, `envport lock` on tiny local wheels (no network), `--check`, and every
way a lock can be wrong (stale, another python or platform, a swapped wheel).

The wheels are made here (a wheel is a zip with METADATA, WHEEL and RECORD) and served from a
find-links dir with a file:// index of their own, so the real resolver (pip in a scratch venv with
the spec's python) runs without any network.
"""

from __future__ import annotations

import os
import hashlib
import json
from pathlib import Path

import pytest

from envport.builders.lock import check_spec, hash_mismatches, lock_spec, normalize_freeze
from envport.builders.wheelhouse import ensure_wheelhouse
from envport.core.verdict import Verdict
from envport.plan.lock import (LockError, lock_path, load_for, parse, problems, stale, this_platform,
                               write_text)
from envport.plan.site import Site
from envport.plan.steps import PipStep, make_plan
from envport.recipe.identity import content_hash
from envport.spec.loader import load_spec
from tests.support import PY, cli_env, run_envport, write_spec
from tests.tinywheels import local_phase, make_wheel

@pytest.fixture
def tiny(tmp_path):
    """A project with one spec of two phases of local wheels: a (pulls b) then c."""
    (tmp_path / "specs").mkdir()
    (tmp_path / "sites").mkdir()
    wheels = tmp_path / "wheels"
    make_wheel(wheels, "envport-ta", "1.0", files={"envport_ta/__init__.py": "A = 1\n"})
    make_wheel(wheels, "envport-tb", "2.0", files={"envport_tb/__init__.py": "B = 2\n"})
    make_wheel(wheels, "envport-tc", "3.0", files={"envport_tc/__init__.py": "C = 3\n"})
    write_spec(tmp_path, "tiny", python=PY,
               pip_phases=[local_phase(tmp_path, "envport-ta==1.0", "envport-tb==2.0"),
                           local_phase(tmp_path, "envport-tc==3.0")])
    return tmp_path


def _lock(root: Path, name: str = "tiny"):
    loaded = load_spec(name, root)
    result = lock_spec(loaded, Site(name="t"), root, lambda _: None)
    assert result.verdict is Verdict.OK, (result.detail, result.lines)
    return load_spec(name, root)


def test_lock_records_each_phase_and_round_trips_byte_for_byte(tiny):
    loaded = _lock(tiny)
    path = lock_path(loaded)
    text = path.read_text()
    lock = load_for(loaded)
    assert [p.index for p in lock.phases] == [1, 2]
    assert [d.name for d in lock.phases[0].dists] == ["envport-ta", "envport-tb"]
    assert [d.name for d in lock.phases[1].dists] == ["envport-tc"]
    wheel = tiny / "wheels" / lock.phases[1].dists[0].file
    assert lock.phases[1].dists[0].sha256 == hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert lock.python == PY and lock.platform == this_platform()
    # No index URL and no local path: where files come from is the site's.
    assert "file://" not in text and str(tiny) not in text
    assert write_text(lock, "specs/tiny.yaml") == text
    # Locking again over the same resolution writes nothing new.
    again = lock_spec(loaded, Site(name="t"), tiny, lambda _: None)
    assert again.verdict is Verdict.OK and again.data["changed"] is False
    assert lock.freeze() == ["envport-ta==1.0", "envport-tb==2.0", "envport-tc==3.0"]


def test_the_lock_shapes_the_plan_and_feeds_the_hash(tiny):
    before = content_hash(load_spec("tiny", tiny))
    loaded = _lock(tiny)
    steps = [s for s in make_plan(loaded).steps if isinstance(s, PipStep)]
    assert [len(s.locked) for s in steps] == [2, 1]
    assert steps[0].pip_args()[-4:] == ["--no-deps", "--require-hashes", "-r", "/opt/envport/locks/pip-1.txt"]
    assert "envport-tc==3.0 --hash=sha256:" in steps[1].requirements_text()
    assert content_hash(loaded) != before
    unlocked = [s for s in make_plan(loaded, locked=False).steps if isinstance(s, PipStep)]
    assert all(not s.locked for s in unlocked)
    assert content_hash(loaded, Site(name="t", lock=False)) != content_hash(loaded, Site(name="t"))


def test_an_edited_phase_is_stale_for_check_render_check_and_build(tiny):
    _lock(tiny)
    assert run_envport("lock", "--check", "tiny", root=tiny).returncode == 0
    spec = tiny / "specs" / "tiny.yaml"
    spec.write_text(spec.read_text().replace("envport-tc==3.0", "envport-tc==3.1"))
    loaded = load_spec("tiny", tiny)
    assert stale(loaded).reason == "lock_stale"
    result = check_spec(loaded)
    assert result.verdict is Verdict.FAILED and result.reason == "lock_stale"
    assert "phase 2 was ['envport-tc==3.0'] and is now ['envport-tc==3.1']" in result.detail
    # A stale lock never shapes the plan.
    assert all(not s.locked for s in make_plan(loaded).steps if isinstance(s, PipStep))

    check = run_envport("lock", "--check", "tiny", root=tiny)
    assert check.returncode == 1 and "lock_stale" in check.stdout, check.stdout + check.stderr
    run_envport("render", "tiny", root=tiny, check=True)
    render = run_envport("render", "--check", "tiny", root=tiny)
    assert render.returncode == 1 and "tiny.lock [lock_stale]" in render.stderr, render.stdout + render.stderr
    build = run_envport("build", "tiny", "--target", "venv", root=tiny, timeout=120)
    assert build.returncode == 3, build.stdout + build.stderr
    assert "REFUSED" in build.stdout and "lock_stale" in build.stdout and "envport lock tiny" in build.stdout
    # `up` applies the same gate at its build step, before anything is built.
    up = run_envport("up", "tiny", "--target", "venv", "--json", root=tiny, timeout=120)
    steps = {s["step"]: s for s in json.loads(up.stdout)["steps"]}
    assert up.returncode == 3, up.stdout + up.stderr
    assert steps["build"]["verdict"] == "REFUSED" and steps["build"]["reason"] == "lock_stale", steps["build"]


def test_no_lock_names_the_same_env_in_build_up_verify_and_witness(tiny, tmp_path):
    """`--no-lock` is another env; every command that finds a built env must find that one."""
    _lock(tiny)
    env = cli_env(ENVPORT_ENVS_DIR=str(tmp_path / "envs"), ENVPORT_STATE_DIR=str(tmp_path / "state"))
    build = run_envport("build", "tiny", "--target", "venv", "--no-lock", root=tiny, env=env, timeout=300)
    assert build.returncode == 0, build.stdout + build.stderr
    ref = build.stdout.strip().splitlines()[-1].split()[1]
    up = run_envport("up", "tiny", "--target", "venv", "--no-lock", "--json", root=tiny, env=env, timeout=300)
    out = json.loads(up.stdout)
    assert ref == f"tiny@{out['hash'][:12]}"
    assert {s["step"]: s for s in out["steps"]}["build"]["verdict"] == "present", out["steps"]
    locked = run_envport("up", "tiny", "--target", "venv", "--json", root=tiny, env=env, timeout=300)
    assert json.loads(locked.stdout)["hash"][:12] != ref.split("@")[1]  # without --no-lock: the locked env
    for cmd in ("verify", "witness"):
        proc = run_envport(cmd, "tiny", "--target", "venv", "--no-lock", "--json", root=tiny, env=env, timeout=300)
        hashes = [r["hash"] for r in _ledger(tiny, env) if r.get("kind") == cmd]
        assert hashes and hashes[-1][:12] == ref.split("@")[1], (cmd, proc.stdout, proc.stderr)


def _ledger(root: Path, env: dict) -> list[dict]:
    proc = run_envport("ledger", "tiny", "--json", root=root, env=env)
    return json.loads(proc.stdout).get("records", [])


def test_a_lock_for_another_python_or_platform_is_refused(tiny):
    loaded = _lock(tiny)
    path = lock_path(loaded)
    text = path.read_text()
    path.write_text(text.replace(f'platform = "{this_platform()}"', 'platform = "macosx-14.0-arm64"'))
    found = problems(load_for(loaded), loaded)
    assert [p.reason for p in found] == ["lock_platform"] and "envport lock tiny" in found[0].message
    build = run_envport("build", "tiny", "--target", "venv", root=tiny, timeout=120)
    assert build.returncode == 3 and "lock_platform" in build.stdout, build.stdout + build.stderr

    path.write_text(text.replace(f'python = "{PY}"', 'python = "3.9"'))
    found = problems(load_for(loaded), loaded)
    assert [p.reason for p in found] == ["lock_python"]
    build = run_envport("build", "tiny", "--target", "venv", root=tiny, timeout=120)
    assert build.returncode == 3 and "lock_python" in build.stdout, build.stdout + build.stderr


def test_a_malformed_lock_names_the_file_and_field(tmp_path):
    path = tmp_path / "x.lock"
    with pytest.raises(LockError, match=r"x.lock: phase\[1\]\.dists\[1\]\.sha256: expected 64 lowercase hex"):
        parse('format = 1\nenv = "x"\npython = "3.11"\nplatform = "p"\ninputs = "i"\n'
              '[[phase]]\nindex = 1\npackages = ["a==1"]\n[[phase.dists]]\nname = "a"\nversion = "1"\n'
              'file = "a-1-py3-none-any.whl"\nsha256 = "zz"\n', path)
    with pytest.raises(LockError, match="format: expected 1"):
        parse('format = 7\n', path)


def test_a_swapped_wheel_in_the_wheelhouse_fails_naming_it_with_both_digests(tiny):
    loaded = _lock(tiny)
    site = Site(name="t", wheelhouse=True, wheelhouse_dir="wh")
    first = ensure_wheelhouse(loaded, site, tiny, lambda _: None)
    assert first.verdict is Verdict.OK, (first.detail, first.lines)
    dest = tiny / "wh" / "tiny"
    lock = load_for(loaded)
    assert sorted(p.name for p in dest.iterdir() if not p.name.startswith(".")) == sorted(lock.files())
    assert ensure_wheelhouse(loaded, site, tiny, lambda _: None).verdict is Verdict.PRESENT

    victim = lock.phases[1].dists[0]
    impostor = make_wheel(tiny / "other", "envport-tc", "3.0", files={"envport_tc/__init__.py": "C = 'not three'\n"})
    (dest / victim.file).write_bytes(impostor.read_bytes())
    swapped = ensure_wheelhouse(loaded, site, tiny, lambda _: None)
    assert swapped.verdict is Verdict.FAILED and swapped.reason == "hash_mismatch"
    got = hashlib.sha256(impostor.read_bytes()).hexdigest()
    assert swapped.lines == [f"{dest / victim.file}: sha256 {got}, the lock says {victim.sha256}"]


def test_installer_output_names_the_file_and_both_digests():
    want, got = "a" * 64, "b" * 64
    pip = ["ERROR: THESE PACKAGES DO NOT MATCH THE HASHES FROM THE REQUIREMENTS FILE.",
           "    six==1.16.0 from file:///wh/six-1.16.0-py2.py3-none-any.whl:",
           f"        Expected sha256 {want}", f"             Got        {got}"]
    assert hash_mismatches(pip) == [f"six-1.16.0-py2.py3-none-any.whl: sha256 {got}, the lock says {want}"]
    uv = ["error: Failed to read `six==1.16.0`", "  Caused by: Hash mismatch for `six==1.16.0`", "",
          "Expected:", f"  sha256:{want}", "", "Computed:", f"  sha256:{got}"]
    assert hash_mismatches(uv) == [f"six==1.16.0: sha256 {got}, the lock says {want}"]
    assert hash_mismatches(["ERROR: No matching distribution found for six==9"]) == []


def test_freeze_comparison_ignores_case_separators_and_the_venv_seed():
    assert normalize_freeze(["Typing_Extensions==4.1", "pip==23.2", "six==1.16.0"]) == \
        ["six==1.16.0", "typing-extensions==4.1"]


def test_parity_fails_targets_that_agree_with_each_other_but_not_with_the_lock(tiny):
    from envport.report.parity import TargetFacts, differences

    loaded = _lock(tiny)
    good = {"envport-ta": "1.0", "envport-tb": "2.0", "envport-tc": "3.0"}
    facts = [TargetFacts(t, build=check_spec(loaded), python=PY, packages=dict(good)) for t in ("docker", "venv")]
    assert differences(loaded, facts) == []
    for f in facts:
        f.packages["envport-tc"] = "3.1"
    assert [d.line() for d in differences(loaded, facts)] == ["lock envport-tc: lock 3.0, docker 3.1, venv 3.1"]


def _swap_tc(root: Path) -> tuple[str, str, str]:
    """Replace envport-tc's wheel in the find-links dir by another build of it: (file, locked, found)."""
    lock = load_for(load_spec("tiny", root))
    victim = lock.phases[1].dists[0]
    impostor = make_wheel(root / "other", "envport-tc", "3.0", files={"envport_tc/__init__.py": "C = 'not three'\n"})
    (root / "wheels" / victim.file).write_bytes(impostor.read_bytes())
    return victim.file, victim.sha256, hashlib.sha256(impostor.read_bytes()).hexdigest()


def test_a_venv_build_with_a_swapped_wheel_fails_naming_it(tiny, tmp_path):
    _lock(tiny)
    fname, want, got = _swap_tc(tiny)
    envs = tmp_path / "envs"
    proc = run_envport("build", "tiny", "--target", "venv", root=tiny, timeout=300,
                       env={**os.environ, "ENVPORT_ENVS_DIR": str(envs)})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"FAILED   build tiny (venv) [hash_mismatch]: {fname}: sha256 {got}, the lock says {want}" in proc.stdout
    # Phase 2 installed nothing, and the env that failed was not swapped in.
    assert not list(envs.glob("tiny/lib/python*/site-packages/envport_tc"))


def test_a_docker_build_with_a_swapped_wheel_fails_before_building(tiny, base_image):
    _lock(tiny)
    (tiny / "sites" / "wh.yaml").write_text("name: wh\nnetwork: host\nwheelhouse: true\nwheelhouse_dir: wh\n"
                                            "registry: false\n")
    loaded = load_spec("tiny", tiny)
    first = ensure_wheelhouse(loaded, Site(name="wh", wheelhouse=True, wheelhouse_dir="wh"), tiny, lambda _: None)
    assert first.verdict is Verdict.OK, first.lines
    lock = load_for(loaded)
    victim = lock.phases[1].dists[0]
    impostor = make_wheel(tiny / "other", "envport-tc", "3.0", files={"envport_tc/__init__.py": "C = 'not three'\n"})
    (tiny / "wh" / "tiny" / victim.file).write_bytes(impostor.read_bytes())
    proc = run_envport("build", "tiny", "--target", "docker", "--site", "wh", root=tiny, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAILED   wheelhouse [hash_mismatch]" in proc.stdout and victim.file in proc.stdout
    assert victim.sha256 in proc.stdout and hashlib.sha256(impostor.read_bytes()).hexdigest() in proc.stdout


def _final(root: Path, name: str = "tiny") -> dict[str, str]:
    return {n: d.version for n, d in load_for(load_spec(name, root)).final().items()}


def test_an_edit_moves_only_what_it_needs_and_upgrades_move_on_request(tmp_path):
    """Issue 39: re-locking after an edit to the last phase keeps an untouched phase's unpinned dependency at
    its locked version although a newer one is out (before: every phase re-resolved, so it moved and every
    later phase's layer rebuilt); --upgrade-package NAME and --upgrade let it move; an edit the locked
    versions cannot satisfy resolves without them for what it names, and says so."""
    (tmp_path / "specs").mkdir()
    (tmp_path / "sites").mkdir()
    wheels = tmp_path / "wheels"
    make_wheel(wheels, "envport-ua", "1.0", requires=["envport-ub"])  # phase 1's unpinned dependency: ub
    make_wheel(wheels, "envport-ub", "2.0")
    make_wheel(wheels, "envport-uc", "3.0")
    phases = lambda *last: [local_phase(tmp_path, "envport-ua==1.0"), local_phase(tmp_path, *last)]  # noqa: E731
    write_spec(tmp_path, "tiny", python=PY, pip_phases=phases("envport-uc==3.0"))
    _lock(tmp_path)
    assert _final(tmp_path)["envport-ub"] == "2.0"
    make_wheel(wheels, "envport-ub", "2.1")  # a newer ub is released
    make_wheel(wheels, "envport-uc", "3.1")
    write_spec(tmp_path, "tiny", python=PY, pip_phases=phases("envport-uc==3.1"))  # the last phase edited
    loaded = load_spec("tiny", tmp_path)
    result = lock_spec(loaded, Site(name="t"), tmp_path, lambda _: None)
    assert result.verdict is Verdict.OK, (result.detail, result.lines)
    assert _final(tmp_path) == {"envport-ua": "1.0", "envport-ub": "2.0", "envport-uc": "3.1"}
    assert [ln for ln in result.lines if "envport-ub" in ln] == [], result.lines  # ub did not move
    # --upgrade-package lets ub move, and the verdict says it did.
    result = lock_spec(load_spec("tiny", tmp_path), Site(name="t"), tmp_path, lambda _: None,
                       upgrade_packages=("envport_UB",))
    assert _final(tmp_path)["envport-ub"] == "2.1" and any("envport-ub" in ln for ln in result.lines), result.lines
    # An edit the lock's versions cannot satisfy: resolved without them for what the phase names.
    write_spec(tmp_path, "tiny", python=PY, pip_phases=[local_phase(tmp_path, "envport-ua==1.0", "envport-ub<2.1"),
                                                         local_phase(tmp_path, "envport-uc==3.1")])
    result = lock_spec(load_spec("tiny", tmp_path), Site(name="t"), tmp_path, lambda _: None)
    assert _final(tmp_path)["envport-ub"] == "2.0"
    assert any("phase 1: the lock before's versions do not satisfy it" in ln for ln in result.lines), result.lines
    # The CLI's --upgrade: every phase afresh (ub stays capped by the spec, uc already the newest).
    proc = run_envport("lock", "tiny", "--upgrade", "--json", root=tmp_path, env=cli_env())
    assert proc.returncode == 0 and json.loads(proc.stdout)["steps"][0]["data"]["preferred"] == "none (--upgrade)"

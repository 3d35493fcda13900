"""`envport weights verify|fetch`: pinned files checked deep (a progress line while a large one is hashed),
fetched only by the spec's own `source`, never deleted, a gated weight's token passed to the command and
written nowhere.

Real files and real `source` commands (demo-cpu's seeded weight script, small shell commands) in a
throwaway project and weights root; no mocks.
"""

from __future__ import annotations

import hashlib
import os
import secrets

import pytest

from .support import as_json, cli_env, run_envport, write_spec

PIN = {"path": "tiny.f32", "size": 4096, "sha256": "36713b232535566428d6c2454bff50fa500ac74102796bc95415b3e2aa51a740"}


def _spec(project, name="wtest", **weight):
    w = {"path": "/weights/tiny", "env": "DEMO_WEIGHTS", "source": "python3 files/demo_weight.py", "files": [PIN]}
    w.update(weight)
    write_spec(project, name, weight_dirs={"tiny": w})
    return name


@pytest.fixture
def wroot(tmp_path):
    return tmp_path / "weights-root"


def _weights(project, wroot, *args, env=None):
    env = {**cli_env(), **(env or {})}
    return run_envport("weights", *args, "--root", str(wroot), "--json", root=project, env=env, timeout=300)


def _step(proc) -> dict:
    return as_json(proc)["steps"][0]


def test_absent_then_fetched_and_verified(project, wroot):
    name = _spec(project)
    proc = _weights(project, wroot, "verify", name)
    assert proc.returncode == 3 and _step(proc)["reason"] == "weights_missing", proc.stdout
    assert f"{wroot}/{name}/tiny/tiny.f32 is absent" in _step(proc)["lines"][0]

    proc = _weights(project, wroot, "fetch", name)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    step = _step(proc)
    assert step["verdict"] == "OK" and "fetched" in step["detail"], step
    data = (wroot / name / "tiny" / "tiny.f32").read_bytes()
    assert len(data) == PIN["size"] and hashlib.sha256(data).hexdigest() == PIN["sha256"]

    proc = _weights(project, wroot, "verify", name)
    assert proc.returncode == 0 and _step(proc)["verdict"] == "present", proc.stdout
    # fetch on a verified weight does not run the command again
    proc = _weights(project, wroot, "fetch", name)
    assert proc.returncode == 0 and _step(proc)["verdict"] == "present"
    assert "running" not in proc.stderr


def test_truncated_is_named_with_both_digests_left_in_place_and_refused(project, wroot):
    name = _spec(project)
    assert _weights(project, wroot, "fetch", name).returncode == 0
    path = wroot / name / "tiny" / "tiny.f32"
    with open(path, "r+b") as f:
        f.truncate(1000)
    truncated = path.read_bytes()
    digest = hashlib.sha256(truncated).hexdigest()
    proc = _weights(project, wroot, "fetch", name)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    step = _step(proc)
    assert step["verdict"] == "REFUSED" and step["reason"] == "weights_off_pin"
    named = step["lines"][0]
    assert str(path) in named and digest in named and PIN["sha256"] in named and "1000 bytes" in named, named
    assert any("left in place" in ln and "remove" in ln for ln in step["lines"]), step["lines"]
    # Left in place, byte for byte: the downloader did not run over the evidence.
    assert path.read_bytes() == truncated
    assert "running" not in proc.stderr


def test_source_exit_3_is_refused_with_its_own_words(project, wroot):
    words = "the licence for this checkpoint is not accepted: run `tool accept-licence` first"
    name = _spec(project, source=f"echo {words!r} >&2; exit 3")
    proc = _weights(project, wroot, "fetch", name)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    step = _step(proc)
    assert step["reason"] == "weights_fetch_refused" and words in step["lines"], step


def test_source_failing_otherwise_is_failed_with_its_tail(project, wroot):
    name = _spec(project, source="echo 'mirror answered 503' >&2; exit 7")
    proc = _weights(project, wroot, "fetch", name)
    assert proc.returncode == 1, proc.stdout
    step = _step(proc)
    assert step["verdict"] == "FAILED" and step["reason"] == "weights_fetch_failed"
    assert "exited 7" in step["detail"] and "mirror answered 503" in step["lines"]


def test_source_writing_the_wrong_bytes_is_refused_after_fetching(project, wroot):
    name = _spec(project, source='printf short > "$DEMO_WEIGHTS/tiny.f32"')
    proc = _weights(project, wroot, "fetch", name)
    assert proc.returncode == 3 and _step(proc)["reason"] == "weights_off_pin", proc.stdout
    assert (wroot / name / "tiny" / "tiny.f32").read_bytes() == b"short"


def test_source_runs_in_the_specs_folder_with_the_weight_dir_variables(project, wroot):
    name = _spec(project, files=[{"path": "where.txt"}],
                 source='printf "%s|%s|%s" "$PWD" "$DEMO_WEIGHTS" "$ENVPORT_WEIGHT_DIR" > "$DEMO_WEIGHTS/where.txt"')
    proc = _weights(project, wroot, "fetch", name)
    # Fetched, but a file without a sha256 pin is never certified: REFUSED, with its digest to pin.
    assert proc.returncode == 3 and _step(proc)["reason"] == "weights_off_pin", proc.stdout
    assert any("pins no sha256" in ln for ln in _step(proc)["lines"]), _step(proc)["lines"]
    cwd, var, wdir = (wroot / name / "tiny" / "where.txt").read_text().split("|")
    assert cwd == str(project / "specs") and var == wdir == str(wroot / name / "tiny")


def test_gated_weight_without_its_token_is_refused(project, wroot):
    name = _spec(project, gated=True, auth_hint="ENVPORT_TEST_TOKEN")
    env = cli_env()
    env.pop("ENVPORT_TEST_TOKEN", None)
    proc = run_envport("weights", "fetch", name, "--root", str(wroot), "--json", root=project, env=env)
    assert proc.returncode == 3 and _step(proc)["reason"] == "weights_token_missing", proc.stdout
    assert "ENVPORT_TEST_TOKEN" in _step(proc)["lines"][0]


def test_gated_token_reaches_the_command_and_nothing_envport_writes(project, wroot):
    token = f"hf_{secrets.token_hex(20)}"
    # The command checks it got this very token (by its digest: the spec must not hold the token itself),
    # then, as a chatty downloader would, prints it: envport must not repeat it.
    digest = hashlib.sha256(token.encode()).hexdigest()
    source = (f'test "$(printf %s "$ENVPORT_TEST_TOKEN" | sha256sum | cut -c1-64)" = {digest} || exit 9; '
              'echo "using token $ENVPORT_TEST_TOKEN"; python3 files/demo_weight.py')
    name = _spec(project, gated=True, auth_hint="ENVPORT_TEST_TOKEN", source=source)
    state = project / "state"
    proc = _weights(project, wroot, "fetch", name,
                    env={"ENVPORT_TEST_TOKEN": token, "ENVPORT_STATE_DIR": str(state)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "using token ***" in proc.stderr
    assert token not in proc.stdout and token not in proc.stderr
    written = [p for p in state.rglob("*") if p.is_file()]
    assert written, "the fetch was not recorded"
    for p in written + [project / "specs" / f"{name}.yaml"]:
        assert token.encode() not in p.read_bytes(), p
    assert os.environ.get("ENVPORT_TEST_TOKEN") != token


def test_a_large_file_prints_a_progress_line_while_it_is_hashed(tmp_path, monkeypatch):
    # The threshold and chunk made small (the real ones: 256 MiB and 4 MiB), the hashing itself real.
    from envport.builders import weights

    monkeypatch.setattr(weights, "PROGRESS_BYTES", 2**20)
    monkeypatch.setattr(weights, "CHUNK", 2**19)
    big, small = tmp_path / "big.bin", tmp_path / "small.bin"
    big.write_bytes(os.urandom(3 * 2**20))
    small.write_bytes(os.urandom(2**19))
    said: list[str] = []
    assert weights.sha256_file(big, said.append, "tiny/big.bin") == hashlib.sha256(big.read_bytes()).hexdigest()
    assert said == [f"envport: [weights] hashing tiny/big.bin: {n}/3 MiB" for n in (1, 2, 3)], said
    said.clear()
    weights.sha256_file(small, said.append, "tiny/small.bin")
    assert said == []

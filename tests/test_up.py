"""`envport up`: preflight -> build -> weights -> verify -> witness, for real.

- a small env (six and a pinned weight) as a venv from nothing: every step OK, the weight fetched and
  read through its env var from a read-only bind (bwrap; a write there fails with EROFS); a second run is
  present/OK throughout;
- the same kind of env with a gated weight through docker with the token set: every step OK, the
  witness reads the weight from a read-only mount, and the token is in no layer, history, label,
  config, recipe, ledger, report or output (scanned as tests/test_secrets.py does);
- the same small env as a SIF (envport's .def builder) from nothing: every step OK, the witness reads the
  weight from a read-only bind at the spec's path; a second run is present/OK throughout;
- a FAILED witness is diagnosed (layer and fix), and a host-caused one is recorded for the env.
"""

from __future__ import annotations

import io
import json
import secrets
import subprocess
import tarfile
from pathlib import Path

import yaml

from .sif_fixtures import require_sif_tools, sif_env
from .support import LOCAL_ENVS_DIR, REPO, as_json, cli_env, needs_bwrap, run_envport, unique, write_spec

PIN = {"path": "tiny.f32", "size": 4096, "sha256": "36713b232535566428d6c2454bff50fa500ac74102796bc95415b3e2aa51a740"}


# A CLI witness that writes under the weight's folder: it passes only where the write fails with EROFS.
WRITE_UNDER_WEIGHTS = {"cmd": 'touch "$DEMO_WEIGHTS/written-by-the-witness"', "expect": "Read-only file system"}


def _small(project, name, witnesses=None, **weight):
    w = {"path": "/weights/tiny", "env": "DEMO_WEIGHTS", "source": "python3 files/demo_weight.py", "files": [PIN]}
    w.update(weight)
    write_spec(project, name, weight_dirs={"tiny": w}, witnesses=witnesses or {"imports": ["six"]},
               env={"TINY_GREETING": f"hello {secrets.token_hex(4)}"})


def _up(project, name, target, env, timeout=900):
    proc = run_envport("up", name, "--target", target, "--json", root=project, env=env, timeout=timeout)
    return proc, as_json(proc)


def _verdicts(out) -> dict:
    return {s["step"]: s["verdict"] for s in out["steps"]}


def _from_nothing_then_present(project, name, target, env) -> dict:
    """Two `up` runs: every step OK from nothing (the weight fetched), then present/OK throughout. Returns the
    first run's witness weight checks."""
    proc, out = _up(project, name, target, env)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert _verdicts(out) == {"preflight": "OK", "build": "OK", "weights": "OK", "verify": "OK",
                              "witness": "OK"}, out["steps"]
    assert "fetched" in next(s for s in out["steps"] if s["step"] == "weights")["detail"]
    seen = next(s for s in out["steps"] if s["step"] == "witness")["data"]["weights"]

    proc, again = _up(project, name, target, env)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert _verdicts(again) == {"preflight": "OK", "build": "present", "weights": "present", "verify": "OK",
                                "witness": "OK"}, again["steps"]
    return {"build": next(s for s in out["steps"] if s["step"] == "build"), "weights": seen}


def test_up_venv_from_nothing_then_everything_present(project, tmp_path):
    name = unique("up-venv")
    # The witness reads the weight through its variable from a read-only bind (bwrap), and its write there fails.
    needs_bwrap()
    _small(project, name, witnesses={"imports": ["six"], "cli": [WRITE_UNDER_WEIGHTS]})
    env = cli_env(ENVPORT_ENVS_DIR=str(tmp_path / "envs"), ENVPORT_WEIGHTS_DIR=str(tmp_path / "w"))
    seen = _from_nothing_then_present(project, name, "venv", env)["weights"]
    assert seen and f"$DEMO_WEIGHTS={tmp_path / 'w'}/{name}/tiny" in seen[0]["detail"], seen
    assert seen[0]["read_only"] is True and "(read-only)" in seen[0]["detail"], seen
    assert not (tmp_path / "w" / name / "tiny" / "written-by-the-witness").exists()
    # The whole run is in the ledger, step by step.
    from envport.report import ledger

    ups = [r for r in ledger.read(project, name) if r["kind"] == "up"]
    assert len(ups) == 2 and [s["verdict"] for s in ups[-1]["steps"]] == ["OK", "present", "present", "OK", "OK"]


def test_up_apptainer_from_nothing_then_everything_present(project, tmp_path, base_image):
    require_sif_tools()
    name = unique("up-sif")
    _small(project, name)
    env = sif_env(ENVPORT_WEIGHTS_DIR=str(tmp_path / "w"), ENVPORT_STATE_DIR=str(tmp_path / "state"))
    first = _from_nothing_then_present(project, name, "apptainer", env)
    sif = Path(first["build"]["data"]["sif"])
    assert sif.is_file() and sif.is_relative_to(project), first["build"]
    seen = first["weights"]
    assert seen and seen[0]["read_only"] is True and "$DEMO_WEIGHTS=/weights/tiny" in seen[0]["detail"], seen

    # --attest: the verify step's and the witness step's runs, one signed statement each, in the SIF.
    from envport.sif.provenance.statement import WITNESS_PREDICATE

    from .test_sif_sign import new_key

    (tmp_path / "keys").mkdir()
    priv, pub = new_key(tmp_path / "keys", "ed25519")
    proc = run_envport("up", name, "--target", "apptainer", "--attest", str(priv), "--json", root=project, env=env,
                       timeout=900)
    out = as_json(proc)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    steps = {s["step"]: s for s in out["steps"]}
    for step in ("verify", "witness"):
        assert steps[step]["verdict"] == "OK" and "; attested: " in steps[step]["detail"], steps[step]
        assert steps[step]["data"]["attested"]["verdict"] == "OK", steps[step]
    inspected = as_json(run_envport("inspect", str(sif), "--key", str(pub), "--json", root=project, env=env,
                                    timeout=300))
    witnessed = [s for s in inspected["statements"] if s["predicate_type"] == WITNESS_PREDICATE]
    assert len(witnessed) == 2 and all(s["verdict"] == "trusted" for s in witnessed), inspected["statements"]
    assert any(s["witnessed"].get("imports") is True for s in witnessed), witnessed


def test_up_attest_is_for_a_sif_target_and_said_before_anything_runs(project, tmp_path):
    priv = tmp_path / "key.pem"
    priv.write_text("not a key")
    proc = run_envport("up", "demo-cpu", "--target", "venv", "--attest", str(priv), root=project,
                       env=cli_env(ENVPORT_ENVS_DIR=str(tmp_path / "envs")), timeout=120)
    assert proc.returncode == 2 and "--attest is for --target apptainer" in proc.stderr, proc.stdout + proc.stderr
    assert not (tmp_path / "envs").exists()   # refused before the preflight, nothing built


def test_up_docker_gated_weight_read_only_and_the_token_nowhere(project, tmp_path, docker_client, base_image,
                                                                 throwaway_images):
    name = unique("up-gated")
    throwaway_images.append(name)
    token = f"hf_{secrets.token_hex(20)}"
    needle = token.encode()
    source = 'test -n "$ENVPORT_TEST_HF_TOKEN" || exit 9; echo "token $ENVPORT_TEST_HF_TOKEN ok"; ' \
             'python3 files/demo_weight.py'
    _small(project, name, gated=True, auth_hint="ENVPORT_TEST_HF_TOKEN", source=source)
    state = tmp_path / "state"
    env = cli_env(ENVPORT_WEIGHTS_DIR=str(tmp_path / "w"), ENVPORT_STATE_DIR=str(state),
                  ENVPORT_TEST_HF_TOKEN=token, HF_TOKEN=token)
    proc, out = _up(project, name, "docker", env)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert _verdicts(out) == {"preflight": "OK", "build": "OK", "weights": "OK", "verify": "OK",
                              "witness": "OK"}, out["steps"]
    seen = next(s for s in out["steps"] if s["step"] == "witness")["data"]["weights"]
    assert seen[0]["read_only"] is True and "$DEMO_WEIGHTS=/weights/tiny" in seen[0]["detail"], seen
    assert needle not in proc.stdout.encode() and needle not in proc.stderr.encode()
    assert "token *** ok" in proc.stderr

    image = out["steps"][1]["data"]["image"]
    saved = subprocess.run(["docker", "save", image], capture_output=True, timeout=300)
    assert saved.returncode == 0, saved.stderr
    with tarfile.open(fileobj=io.BytesIO(saved.stdout)) as tar:
        for member in tar.getmembers():
            if member.isfile():
                data = tar.extractfile(member).read()
                assert needle not in data, f"token in {member.name} of `docker save`"
                if member.name.endswith("layer.tar"):
                    with tarfile.open(fileobj=io.BytesIO(data)) as layer:
                        for f in layer.getmembers():
                            if f.isfile():
                                assert needle not in layer.extractfile(f).read(), f"token in {f.name}"
    history = subprocess.run(["docker", "history", "--no-trunc", image], capture_output=True, timeout=60)
    assert history.returncode == 0 and needle not in history.stdout
    assert needle not in json.dumps(docker_client.api.inspect_image(image)).encode()
    for path in [*state.rglob("*"), *(project / "images").rglob("*"), *(project / "reports").rglob("*"),
                 *(project / "specs").rglob("*"), *(project / "docs").rglob("*")]:
        if path.is_file():
            assert needle not in path.read_bytes(), f"token in {path}"
    assert any(p.is_file() for p in state.rglob("*")), "nothing was recorded"


def _failing_demo(project, cmd: str):
    """demo-cpu with one extra CLI witness and no torch.distributed ones: the same env (witnesses are not
    in its hash), so the session's demo-cpu venv is `present`."""
    spec = yaml.safe_load((REPO / "specs" / "demo-cpu.yaml").read_text())
    spec["witnesses"] = {"imports": ["six"], "cli": [{"cmd": cmd, "expect": "^never printed$"}]}
    (project / "specs" / "demo-cpu.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))


def test_up_diagnoses_a_host_failure_and_records_it_for_the_env(project, local_venv, tmp_path, monkeypatch):
    _failing_demo(project, "python -c 'import torch; torch.zeros(1).cuda()'")
    state = tmp_path / "state"
    env = cli_env(ENVPORT_ENVS_DIR=LOCAL_ENVS_DIR, ENVPORT_STATE_DIR=str(state))
    proc, out = _up(project, "demo-cpu", "venv", env)
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    v = _verdicts(out)
    assert v["build"] == "present" and v["verify"] == "OK" and v["witness"] == "FAILED", out["steps"]
    witness = next(s for s in out["steps"] if s["step"] == "witness")
    d = witness["data"]["diagnosis"]
    assert d["id"] == "torch_cuda_on_cpu_host" and d["layer"] == "host" and d["fix"], d
    assert "Torch not compiled with CUDA enabled" in d["line"]
    assert any(ln.startswith("diagnosis [torch_cuda_on_cpu_host] layer host") for ln in witness["lines"])
    from envport.report import ledger

    monkeypatch.setenv("ENVPORT_STATE_DIR", str(state))
    gotchas = [r for r in ledger.read(project, "demo-cpu") if r["kind"] == "gotcha"]
    assert gotchas and gotchas[-1]["diagnosis"] == "torch_cuda_on_cpu_host" and gotchas[-1]["fix"] == d["fix"]


def test_up_diagnoses_a_spec_failure_without_blaming_the_host(project, local_venv, tmp_path):
    _failing_demo(project, "python -c 'import dateutil'")
    env = cli_env(ENVPORT_ENVS_DIR=LOCAL_ENVS_DIR, ENVPORT_STATE_DIR=str(tmp_path / "state"))
    proc, out = _up(project, "demo-cpu", "venv", env)
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    witness = next(s for s in out["steps"] if s["step"] == "witness")
    d = witness["data"]["diagnosis"]
    assert (d["id"], d["layer"], d["host"]) == ("module_not_in_spec", "spec", False), d


def test_the_env_doc_shows_each_host_gotcha_once_with_its_fix():
    from envport.report.ledger import render_doc

    h = "a" * 64
    rec = {"kind": "gotcha", "target": "venv", "hash": h, "verdict": "FAILED", "when": "2026-12-01T08:00:00+00:00",
           "host": "node1", "diagnosis": "torch_cuda_on_cpu_host", "fix": "run on a GPU node",
           "symptom": "AssertionError: Torch not compiled with CUDA enabled"}
    doc = render_doc("demo-cpu", [rec, {**rec, "when": "2026-12-02T08:00:00+00:00"}])
    gotchas = [ln for ln in doc.splitlines() if ln.startswith("gotcha: ")]
    assert gotchas == ["gotcha: 2026-12-02 venv at node1: AssertionError: Torch not compiled with CUDA enabled "
                       "[torch_cuda_on_cpu_host] -> run on a GPU node"], doc

"""Every `--json` output has one top-level shape (docs/cli.md): command, exit_code, steps, problems,
then the command's own keys; an invalid spec under --json is still JSON, with the problems (exit 2)."""

from __future__ import annotations

import json
import os

import pytest

from .support import run_envport

ENVELOPE = ("command", "exit_code", "steps", "problems")
PROBLEM_KEYS = {"file", "line", "field", "message", "fix"}
STEP_KEYS = {"step", "verdict", "detail", "reason", "lines", "seconds", "data"}


def envelope_of(proc, command: str) -> dict:
    try:
        data = json.loads(proc.stdout)
    except ValueError:
        raise AssertionError(f"not JSON (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}") from None
    assert set(ENVELOPE) <= set(data), list(data)
    assert data["command"] == command and data["exit_code"] == proc.returncode
    assert isinstance(data["steps"], list) and isinstance(data["problems"], list)
    for p in data["problems"]:
        assert set(p) == PROBLEM_KEYS, p
    return data


def test_validate_json_lists_each_spec_as_a_step(project):
    proc = run_envport("validate", "--all", "--json", root=project, timeout=120)
    data = envelope_of(proc, "validate")
    assert proc.returncode == 0 and data["problems"] == []
    names = sorted(p.stem for p in (project / "specs").glob("*.yaml"))
    assert [s["data"]["env"] for s in data["steps"]] == names
    assert all(set(s) == STEP_KEYS and s["verdict"] == "OK" and len(s["data"]["hash"]) == 64 for s in data["steps"])


def test_an_invalid_spec_under_json_is_json_with_every_problem(project):
    bad = project / "specs" / "broken.yaml"
    bad.write_text("name: broken\nbase: debian:bookworm-slim\npython: 3.10\nenv: {MODE: 0755}\npip_phase: []\n")
    proc = run_envport("validate", "--all", "--json", root=project, timeout=120)
    data = envelope_of(proc, "validate")
    assert proc.returncode == 2
    assert {(p["line"], p["field"]) for p in data["problems"]} == {(3, "python"), (4, "env.MODE"), (5, "pip_phase")}
    assert {p["file"] for p in data["problems"]} == {str(bad)}
    assert next(p for p in data["problems"] if p["field"] == "env.MODE")["fix"] == "quote it: '0755'"
    assert "did you mean 'pip_phases'?" in next(p["message"] for p in data["problems"] if p["field"] == "pip_phase")
    # The valid specs beside it were still checked, and are listed.
    assert "demo-cpu" in {s["data"]["env"] for s in data["steps"]}
    # render refuses the same way, writing nothing.
    proc = run_envport("render", "broken", "--json", root=project, timeout=120)
    assert envelope_of(proc, "render")["problems"] and proc.returncode == 2
    assert not (project / "images" / "broken").exists()


def test_a_usage_error_under_json_is_json(project):
    proc = run_envport("ledger", "Not A Name", "--json", root=project, timeout=60)
    data = envelope_of(proc, "ledger")
    assert proc.returncode == 2 and "not an env name" in data["problems"][0]["message"]
    proc = run_envport("validate", "no-such-spec", "--json", root=project, timeout=60)
    data = envelope_of(proc, "validate")
    assert proc.returncode == 2
    assert data["problems"] == [{"file": str(project / "specs" / "no-such-spec.yaml"), "line": None, "field": "",
                                 "message": "file not found", "fix": "check the name or path"}]


def test_render_json_writes_then_checks(project):
    proc = run_envport("render", "demo-cpu", "--json", root=project, timeout=120)
    data = envelope_of(proc, "render")
    assert proc.returncode == 0 and [s["step"] for s in data["steps"]] == ["render demo-cpu"]
    proc = run_envport("render", "demo-cpu", "--check", "--json", root=project, timeout=120)
    assert envelope_of(proc, "render")["steps"][0]["verdict"] == "OK" and proc.returncode == 0
    (project / "images" / "demo-cpu" / "Dockerfile").write_text("FROM scratch\n")
    proc = run_envport("render", "demo-cpu", "--check", "--json", root=project, timeout=120)
    step = envelope_of(proc, "render")["steps"][0]
    assert proc.returncode == 1 and step["verdict"] == "FAILED" and step["lines"] == ["images/demo-cpu/Dockerfile"]


@pytest.mark.parametrize("args, command", [
    (("show", "demo-cpu", "--json"), "show"),
    (("doctor", "--json", "--no-torch"), "doctor"),
    (("slurm", "clusters", "--json"), "slurm clusters"),
    (("ledger", "demo-cpu", "--json"), "ledger"),
    (("witness", "demo-cpu", "--target", "venv", "--only", "python", "--no-ledger", "--json"), "witness"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_every_command_shares_the_envelope(project, tmp_path, args, command):
    env = {**os.environ, "ENVPORT_ENVS_DIR": str(tmp_path / "no-envs")}  # witness: REFUSED env_missing
    proc = run_envport(*args, root=project, env=env, timeout=300)
    data = envelope_of(proc, command)
    if command == "witness":
        assert proc.returncode == 3 and data["steps"][0]["reason"] == "env_missing"


def test_the_envelope_is_documented():
    from .support import REPO
    cli = (REPO / "docs" / "cli.md").read_text()
    assert '"command"' in cli and '"exit_code"' in cli and '"steps"' in cli and '"problems"' in cli


def test_a_spec_problem_in_any_command_under_json_is_the_envelope(project):
    (project / "specs" / "typo.yaml").write_text("name: typo\nbase: debian:bookworm-slim\npython: '3.11'\n"
                                                 "witnesess: {kernel: true}\n")
    for args, command in ((("build", "typo", "--target", "venv", "--json"), "build"),
                          (("show", "typo", "--json"), "show"),
                          (("verify", "typo", "--target", "venv", "--json"), "verify")):
        proc = run_envport(*args, root=project, timeout=120)
        data = envelope_of(proc, command)
        assert proc.returncode == 2 and data["steps"] == []
        [p] = data["problems"]
        assert (p["line"], p["field"]) == (4, "witnesess") and "did you mean 'witnesses'?" in p["message"]

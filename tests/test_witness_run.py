"""Witness orchestration and `envport witness`: plans, refusals, results, table, ledger."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from envport.witness.launchers.local import LocalLauncher
from envport.spec.model import Spec
from envport.core.verdict import EXIT_NO_ACCELERATOR, NO_ACCELERATOR_REASON, Verdict, exit_code
from envport.witness.plan import WitnessOptions, plan
from envport.witness.run import run_witnesses
from .support import run_envport, torch_python

HERE = "%d.%d" % sys.version_info[:2]


def make_spec(**kw) -> Spec:
    data = {"name": "wit", "base": "debian:bookworm", "python": HERE}
    data.update(kw)
    return Spec(**data)


def test_gpu_spec_without_gpu_is_refused_with_exit_5():
    # No nvidia-smi GPU and an env whose python has no torch: the torch probe answers with its error.
    spec = make_spec(resources={"gpus": 1}, witnesses={"imports": ["json"], "kernel": True})
    results = run_witnesses(spec, LocalLauncher(sys.executable), WitnessOptions(host_gpus=0))
    assert [r.verdict for r in results] == [Verdict.REFUSED]
    assert results[0].reason == NO_ACCELERATOR_REASON
    assert results[0].detail.endswith("(nvidia-smi lists 0, the env's torch did not answer)")
    assert exit_code(results) == EXIT_NO_ACCELERATOR == 5


def test_device_cuda_makes_a_gpu_required():
    spec = make_spec(witnesses={"kernel": True})
    results = run_witnesses(spec, LocalLauncher(sys.executable), WitnessOptions(device="cuda", host_gpus=0,
                                                                                torch_gpus=0))
    assert results[0].reason == NO_ACCELERATOR_REASON and exit_code(results) == 5


def test_missing_interpreter_is_refused(tmp_path):
    spec = make_spec(witnesses={"imports": ["json"]})
    results = run_witnesses(spec, LocalLauncher(tmp_path / "bin" / "python"), WitnessOptions())
    assert results[0].verdict is Verdict.REFUSED and results[0].reason == "env_missing"
    assert exit_code(results) == 3


def test_plan_groups_dist_checks_by_world_size():
    same = plan(make_spec(witnesses={"collectives": {"world_size": 4}, "dtensor": {"mesh": [2, 2]}}),
                WitnessOptions())
    assert [(c.script, c.checks) for c in same] == [("basic.py", ["python"]),
                                                     ("dist.py", ["collectives", "dtensor"])]
    split = plan(make_spec(witnesses={"collectives": {"world_size": 2}, "dtensor": {"mesh": [2, 2]}}),
                 WitnessOptions(only=["collectives", "dtensor"]))
    assert [(c.world, c.checks) for c in split] == [(2, ["collectives"]), (4, ["dtensor"])]
    override = plan(make_spec(witnesses={"collectives": {"world_size": 2}}),
                    WitnessOptions(only=["collectives"], world_size=3))
    assert override[0].world == 3 and "--world-size" in override[0].args


def test_plan_without_a_census_keeps_the_gpu_specs_full_worlds():
    # A caller planning for an allocation it asked for (no census): NCCL at the spec's world, gloo too.
    calls = plan(make_spec(resources={"gpus": 2}, witnesses={"kernel": True, "collectives": {"world_size": 2}}),
                 WitnessOptions(only=["kernel", "collectives"]))
    assert [(c.script, c.backend, c.world, c.args[c.args.index("--device") + 1]) for c in calls] == [
        ("kernel.py", "", 0, "cuda"), ("dist.py", "gloo", 2, "cpu"), ("dist.py", "nccl", 2, "cuda")]


def test_a_witness_that_dies_before_reporting_fails_with_its_output():
    # /bin/sh cannot run a Python file: no sentinel line comes back.
    spec = make_spec(witnesses={"imports": ["json"]})
    results = run_witnesses(spec, LocalLauncher("/bin/sh"), WitnessOptions())
    assert {r.verdict for r in results} == {Verdict.FAILED}
    assert "before reporting" in results[0].detail and results[0].lines


def test_basic_checks_through_the_local_launcher():
    spec = make_spec(witnesses={"imports": ["json", "no_such_mod_y"],
                                "cli": [{"cmd": "echo envport-ok", "expect": "envport-ok"}]})
    results = {r.step: r for r in run_witnesses(spec, LocalLauncher(sys.executable), WitnessOptions())}
    assert results["python"].verdict is Verdict.OK
    assert results["import json"].verdict is Verdict.OK
    assert results["import no_such_mod_y"].verdict is Verdict.FAILED
    assert "ModuleNotFoundError" in results["import no_such_mod_y"].detail
    assert results["cli echo envport-ok"].verdict is Verdict.OK


SPEC_YAML = """\
name: wit-cpu
base: debian:bookworm
python: "{py}"
pip_phases:
  - ["torch==2.13.0"]
env:
  WIT_GREETING: "hello witness"
witnesses:
  imports: [torch]
  cli:
    - {{cmd: "python -c 'import os; print(os.environ[\\"WIT_GREETING\\"])'", expect: "^hello witness$"}}
  kernel: true
  collectives: {{world_size: 2}}
resources: {{cpus: 2, mem_gib: 4, gpus: 0}}
"""


@pytest.fixture
def wit_project(project: Path) -> Path:
    (project / "specs" / "wit-cpu.yaml").write_text(SPEC_YAML.format(py="3.11"))
    return project


def test_cli_venv_target_json_and_ledger(wit_project):
    proc = run_envport("witness", "wit-cpu", "--target", "venv", "--python", torch_python(), "--json",
                       root=wit_project, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(proc.stdout)
    steps = {s["step"]: s for s in data["steps"]}
    assert set(steps) == {"python", "import torch", next(k for k in steps if k.startswith("cli ")),
                          "kernel", "collectives (world 2)"}
    assert all(s["verdict"] == "OK" for s in steps.values()), steps
    from envport.report import ledger
    rec = ledger.read(wit_project, "wit-cpu")[-1]
    assert rec["kind"] == "witness" and rec["target"] == "venv" and rec["verdict"] == "OK"
    assert rec["hash"] == data["hash"]
    assert [(s["step"], s["verdict"]) for s in rec["steps"]] == [(s["step"], s["verdict"]) for s in data["steps"]]
    # Nothing is written into the project as a side effect; the doc is regenerated on purpose.
    assert not (wit_project / "docs" / "envs" / "wit-cpu.md").exists()
    assert not (wit_project / "images" / "wit-cpu" / "ledger.json").exists()
    run_envport("ledger", "wit-cpu", "--write-docs", root=wit_project, check=True, timeout=60)
    doc = (wit_project / "docs" / "envs" / "wit-cpu.md").read_text()
    assert "validated:" in doc and "witness on venv" in doc


def test_cli_default_venv_location_and_table(wit_project, tmp_path):
    envs = tmp_path / "envs"
    env = {**os.environ, "ENVPORT_ENVS_DIR": str(envs)}
    proc = run_envport("witness", "wit-cpu", "--target", "venv", "--only", "python", "--no-ledger",
                       root=wit_project, env=env, timeout=120)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "env_missing" in proc.stdout and str(envs / "wit-cpu" / "bin" / "python") in proc.stdout
    # The whole env dir, so bin/python still finds its pyvenv.cfg and site-packages.
    envs.mkdir()
    os.symlink(Path(torch_python()).parent.parent, envs / "wit-cpu")
    proc = run_envport("witness", "wit-cpu", "--target", "venv", "--only", "python,imports", "--no-ledger",
                       root=wit_project, env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[1].split()[:3] == ["VERDICT", "TIME", "CHECK"]
    assert any(ln.startswith("OK") and "python" in ln for ln in lines)
    assert lines[-1].startswith("OK: wit-cpu witnesses on venv")
    from envport.report import ledger
    assert not ledger.ledger_path(wit_project, "wit-cpu").exists()


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this host has a GPU")
def test_cli_gpu_spec_on_this_host_exits_5(wit_project):
    proc = run_envport("witness", "cuda-torch", "--target", "venv", "--python", sys.executable, "--no-ledger",
                       root=wit_project, timeout=120)
    assert proc.returncode == 5, proc.stdout + proc.stderr
    assert "REFUSED" in proc.stdout and NO_ACCELERATOR_REASON in proc.stdout


def test_cli_rejects_unknown_check(wit_project):
    proc = run_envport("witness", "wit-cpu", "--target", "venv", "--only", "bogus", root=wit_project, timeout=120)
    assert proc.returncode == 2 and "unknown check" in proc.stderr

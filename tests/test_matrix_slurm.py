"""`envport matrix --run --slurm CLUSTER`: the runnable pairs as one Slurm job array (flow/matrix_slurm.py).

- pure: the split under MaxArraySize, --jobs shared out as the arrays' throttles, the rendered array
  script (directives from the cluster profile, one case branch per pair, `bash -n` clean), and how a
  task's end becomes its pair's verdict: up's own JSON, else TIMEOUT / a lost node / cancelled / no
  result, each named with its reason and log tail, and a failure (never all skips) in the JUnit;
- real, on the CI's two-node Slurm (.ci/services/slurm-multi.sh, profile `multi`): the venv pairs of
  four tiny specs (one with an injected witness failure) run as ONE array over both nodes (sacct -c
  shows its tasks on node1 and node2), the failure is named, and the JUnit equals, pair for pair and
  step for step, what `matrix --run` reports for the same specs on this host (verdicts, not times).
  pip reaches no network from the nodes' namespaces: both runs install from a local wheelhouse
  (tests/tinywheels.py), with this machine's pip configuration left out.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from envport.engines.slurm import ArrayTask
from envport.flow import matrix_slurm as array
from envport.plan.cluster import ClusterProfile
from envport.report.matrix import Judged, Pair, PairRun, junit_xml, summary_md

from .support import REPO, fail_with, run_envport, unique, write_spec
from .tinywheels import make_wheelhouse, pip_env


# --- the split and the throttle ------------------------------------------------------------


@pytest.mark.parametrize("n, size, want", [
    (0, 1001, []),
    (4, 1001, [(0, 4)]),
    (1001, 1001, [(0, 1001)]),
    (1002, 1001, [(0, 1001), (1001, 1002)]),
    (2500, 1001, [(0, 1001), (1001, 2002), (2002, 2500)]),
    (5, 2, [(0, 2), (2, 4), (4, 5)]),
    (7, None, [(0, 7)]),  # scontrol did not say: one array, sbatch names the limit if there is one
])
def test_split_keeps_every_array_below_max_array_size(n, size, want):
    got = array.split(n, size)
    assert [(r.start, r.stop) for r in got] == want
    assert sum(len(r) for r in got) == n
    assert all(len(r) <= (size or n) for r in got)  # indices 0..len-1 < MaxArraySize


@pytest.mark.parametrize("jobs, arrays, want", [(4, 1, [4]), (4, 3, [2, 1, 1]), (2, 3, [1, 1, 1]), (1, 1, [1])])
def test_jobs_are_shared_out_as_the_arrays_throttles(jobs, arrays, want):
    assert array.throttles(jobs, arrays) == want


# --- the array script ----------------------------------------------------------------------------


def _profile(**fields) -> ClusterProfile:
    return ClusterProfile(**{"name": "c1", "partition": "short", "account": "proj-7", "time": "00:20:00",
                             "cpus": 2, "slurm_conf": "/etc/slurm-x/slurm.conf", "envs_dir": "/shared/envs",
                             "activation": ["module load python/3.11"], **fields})


def _tasks(n: int, target: str = "venv") -> list[array.Task]:
    return [array.Task(PairRun(Judged(Pair(f"e{i}", target))), f"abc123def456-e{i}-{target}",
                       ["/usr/bin/python3", "-m", "envport", "-C", "/p q", "up", f"e{i}", "--target", target, "--json"],
                       {"ENVPORT_ENVS_DIR": "/x y"} if i == 1 else {}) for i in range(n)]


def test_the_array_script_asks_for_one_task_per_pair_with_the_profiles_partition_account_and_time(tmp_path):
    tasks = _tasks(5)
    arrays = array.plan_arrays(tasks, 3, 4, tmp_path)
    assert [len(a.tasks) for a in arrays] == [3, 2] and [a.throttle for a in arrays] == [2, 2]
    assert [(t.index, t.result.name) for t in tasks] == [
        (0, "abc123def456-e0-venv.json"), (1, "abc123def456-e1-venv.json"), (2, "abc123def456-e2-venv.json"),
        (0, "abc123def456-e3-venv.json"), (1, "abc123def456-e4-venv.json")]
    assert tasks[4].log == tmp_path / "array2-1.log"
    text = array.render(arrays[0], 2, _profile(), tmp_path)
    for line in ("#SBATCH --array=0-2%2", "#SBATCH --partition=short", "#SBATCH --account=proj-7",
                 "#SBATCH --time=00:20:00", "#SBATCH --cpus-per-task=2", "#SBATCH --ntasks=1",
                 f"#SBATCH --output={tmp_path}/array1-%a.log", "export SLURM_CONF=/etc/slurm-x/slurm.conf",
                 "export ENVPORT_ENVS_DIR=/shared/envs", "module load python/3.11",
                 "set -- /usr/bin/python3 -m envport -C '/p q' up e0 --target venv --json",
                 "    export ENVPORT_ENVS_DIR='/x y'", f"result={tmp_path}/results/abc123def456-e2-venv.json"):
        assert line in text, (line, text)
    assert "e3" not in text  # the second array's pairs are the second script's
    check = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    if shutil.which("shellcheck"):
        sc = subprocess.run(["shellcheck", "-s", "bash", "-"], input=text, capture_output=True, text=True)
        assert sc.returncode == 0, sc.stdout


def test_the_array_script_runs_its_task_and_leaves_ups_json_under_the_hash(tmp_path):
    """The script itself, run by bash as Slurm would run task 1 (no Slurm needed): the pair's argv runs,
    its stdout becomes the result file, its exit code the task's."""
    tasks = _tasks(2)
    tasks[1].argv = ["bash", "-c", 'echo "{\\"exit_code\\": 1, \\"steps\\": [], \\"d\\": \\"$ENVPORT_ENVS_DIR\\"}"; '
                     "echo progress >&2; exit 1"]
    (a,) = array.plan_arrays(tasks, None, 1, tmp_path)
    (tmp_path / "results").mkdir()
    script = tmp_path / "a.sbatch"
    script.write_text(array.render(a, 1, _profile(activation=[], slurm_conf=None, envs_dir=None), tmp_path))
    ran = subprocess.run(["bash", str(script)], env={"PATH": "/usr/bin:/bin", "SLURM_ARRAY_TASK_ID": "1",
                                                     "SLURM_JOB_ID": "77"}, capture_output=True, text=True)
    assert ran.returncode == 1, ran.stderr
    assert json.loads(tasks[1].result.read_text()) == {"exit_code": 1, "steps": [], "d": "/x y"}
    assert "envport-slurm: end e1 venv rc=1" in ran.stdout and "progress" in ran.stderr
    stray = subprocess.run(["bash", str(script)], env={"PATH": "/usr/bin:/bin", "SLURM_ARRAY_TASK_ID": "9"},
                           capture_output=True, text=True)
    assert stray.returncode == 2 and "no pair for array task 9" in stray.stdout


# --- a task's end as its pair's verdict ----------------------------------------------------------


def _ended(state: str, exit_code: str = "0:0", nodes: str = "node2", **task_fields) -> array.Task:
    (task,) = _tasks(1)
    task.array, task.log = "41", Path("/jobs/array1-0.log")
    task.slurm = ArrayTask(0, "44", state, "", nodes, exit_code)
    for k, v in task_fields.items():
        setattr(task, k, v)
    return task


UP_OK = json.dumps({"exit_code": 0, "steps": [{"step": s, "verdict": "OK", "detail": "", "seconds": 1.0}
                                                for s in ("preflight", "build", "weights", "verify", "witness")]})


def test_a_task_with_ups_json_is_judged_by_its_steps():
    task = _ended("COMPLETED")
    array.settle(task, UP_OK, "", _profile(), [])
    r = task.run
    assert (r.verdict, r.exit_code, r.error) == ("OK", 0, "")
    assert r.ran_on == "Slurm job 41_0 on node2" and r.slurm["job_id"] == "44"


@pytest.mark.parametrize("state, fields, failed_nodes, verdict, reason, says", [
    ("TIMEOUT", {}, [], "FAILED", "slurm_timeout", "Slurm task 41_0 TIMEOUT ExitCode=0:15 on node2: ran past the "
     "cluster profile's time 00:20:00; log /jobs/array1-0.log"),
    ("NODE_FAIL", {}, ["node2: Not responding (down)"], "FAILED", "node_lost",
     "its node was lost (node2: Not responding (down))"),
    ("FAILED", {}, [], "FAILED", "no_result", "`envport up` left no result"),
    ("CANCELLED", {"cancelled_by_us": "deadline"}, [], "FAILED", "slurm_cancelled",
     "cancelled by envport (deadline) before `envport up` ended"),
    ("CANCELLED", {"cancelled_by_us": "pending"}, [], "REFUSED", "pending_timeout",
     "still PENDING after the cluster profile's max_pending 600s"),
])
def test_a_task_that_left_no_json_is_named_with_its_reason(state, fields, failed_nodes, verdict, reason, says):
    task = _ended(state, "0:15", **fields)
    array.settle(task, None, "envport: [up] build\nKilled\nenvport-slurm: begin x\n", _profile(), failed_nodes)
    r = task.run
    assert r.verdict == verdict and r.reason == reason and says in r.error, r.error
    assert r.detail.endswith(f"[{reason}]") and r.lines == ["envport: [up] build", "Killed"]
    # The JUnit fails the pair at its first unreported step with the reason and log tail; the rest are skips.
    cases = ET.fromstring(junit_xml([r])).findall("testcase")
    failure = cases[0].find("failure")
    assert failure is not None and failure.get("type") == verdict and f"[{reason}]" in failure.get("message")
    assert failure.text == "envport: [up] build\nKilled"
    assert all(c.find("skipped") is not None for c in cases[1:])
    assert f"| e0 venv | {verdict} |" in summary_md([r])


def test_an_unreadable_result_is_no_result_not_a_pass():
    task = _ended("COMPLETED")
    array.settle(task, '{"exit_code": 0', "", _profile(), [])  # cut mid-write
    assert task.run.verdict == "FAILED" and "left an empty or unreadable result" in task.run.error


# --- the real thing, on the two-node cluster -------------------------------------------------------


def _outcomes(path: Path) -> list[tuple[str, str, str]]:
    """(pair, step, outcome) of every JUnit case: the failure's type, skipped, or passed; no times."""
    out = []
    for case in ET.parse(path).getroot().findall("testcase"):
        failure = case.find("failure")
        kind = failure.get("type") if failure is not None else "skipped" if case.find("skipped") is not None \
            else "passed"
        out.append((case.get("classname"), case.get("name"), kind))
    return out


def _matrix(project: Path, names: list[str], out: Path, env: dict, *extra: str) -> tuple[dict, str]:
    proc = run_envport("matrix", "--run", "--env", ",".join(names), "--target", "venv", "--jobs", "4",
                       "--junit", str(out / "m.xml"), "--summary", str(out / "m.md"), "--json", *extra,
                       root=project, env=env, timeout=900)
    assert proc.returncode == 1, fail_with(proc, "envport matrix --run " + " ".join(extra))  # one pair fails
    return json.loads(proc.stdout), proc.stderr


@pytest.mark.slow
def test_the_venv_pairs_run_as_one_array_over_both_nodes_and_report_as_the_local_run(slurm_multi, project,
                                                                                    tmp_path):
    wheels = make_wheelhouse(tmp_path / "wheels")
    names = [unique("arr") for _ in range(4)]
    for name in names:
        write_spec(project, name, pip_phases=[["alpha==1.0"]], witnesses={"imports": ["alpha"]})
    bad = names[2]  # the injected failure: a witness import no phase installs
    write_spec(project, bad, pip_phases=[["alpha==1.0"]], witnesses={"imports": ["alpha", "no_such_module_x"]})

    # On the cluster: envs in a folder the nodes share with this host; the submitting shell's environment
    # (the wheelhouse-only pip settings) reaches every task through sbatch.
    slurm_dir, local_dir = tmp_path / "out-slurm", tmp_path / "out-local"
    slurm_dir.mkdir(), local_dir.mkdir()
    out, err = _matrix(project, names, slurm_dir, pip_env(wheels, tmp_path / "envs-slurm"), "--slurm", "multi")
    steps = {s["step"]: s for s in out["steps"]}
    tasks = {label: s["data"]["slurm"] for label, s in steps.items()}
    arrays = {t["array"] for t in tasks.values()}
    assert len(arrays) == 1, tasks  # ONE array
    assert err.count("slurm: submitted array ") == 1 and "(4 pair(s), at most 4 at once)" in err, err
    assert "(4 of 4 pair(s) done)" in err and f"[{names[0]} venv] envport: [up] witness" in err
    # The failure is named, with its pair and reason; the others still report OK.
    assert steps[f"{bad} venv"]["verdict"] == "FAILED", steps[f"{bad} venv"]
    assert "no_such_module_x" in steps[f"{bad} venv"]["detail"]
    assert all(steps[f"{n} venv"]["verdict"] == "OK" for n in names if n != bad), out
    table = (slurm_dir / "m.md").read_text()
    assert f"| {bad} venv | FAILED |" in table and "no_such_module_x" in table and " on node" in table, table
    # sacct (the job-completion file) shows the array's tasks, by their own job ids, on both nodes.
    ids = sorted(t["job_id"] for t in tasks.values())
    acct = subprocess.run(["sacct", "-c", "-j", ",".join(ids), "-n", "-P", "-o", "jobid,state,nodelist"],
                          capture_output=True, text=True, timeout=60, env=slurm_multi.env())
    rows = {line.split("|")[0]: line.split("|") for line in acct.stdout.splitlines()}
    assert set(rows) == set(ids), acct.stdout + acct.stderr
    assert {r[2] for r in rows.values()} == {"node1", "node2"}, rows
    assert rows[tasks[f"{bad} venv"]["job_id"]][1] == "FAILED", rows

    # The same specs on this host: the JUnit equals, pair for pair and step for step.
    _matrix(project, names, local_dir, pip_env(wheels, tmp_path / "envs-local"))
    on_slurm, here = _outcomes(slurm_dir / "m.xml"), _outcomes(local_dir / "m.xml")
    assert on_slurm == here
    assert (f"matrix.{bad}-venv", "witness", "FAILED") in here and len(here) == 20
    print(table)


def test_slurm_without_run_is_a_usage_error(project):
    proc = run_envport("matrix", "--slurm", "multi", root=project, timeout=120)
    assert proc.returncode == 2 and "add --run" in proc.stderr, fail_with(proc, "matrix --slurm")


def test_the_packaged_template_is_the_one_in_slurm():
    assert (REPO / "slurm" / array.TEMPLATE).is_file()


# --- what Slurm says, parsed (outputs captured from the two-node cluster, slurm-wlm 22.05) ------------


def _answers(monkeypatch, table: dict):
    from envport.engines import slurm as client

    def fake(argv, timeout=30):
        key = " ".join(argv[:3])
        return table[key]

    monkeypatch.setattr(client, "_run", fake)
    return client


def test_max_array_size_is_read_from_scontrol_show_config(monkeypatch):
    client = _answers(monkeypatch, {"scontrol show config": (0, "MaxArraySize            = 1001\n"
                                                             "MaxJobCount             = 100000\n", "")})
    assert client.max_array_size() == 1001
    client = _answers(monkeypatch, {"scontrol show config": (1, "", "slurm_load_ctl_conf error")})
    assert client.max_array_size() is None


def test_the_queue_and_the_final_states_of_an_array_task_by_task(monkeypatch):
    queue = "1|25|PENDING|JobArrayTaskLimit|\n2|25|PENDING|JobArrayTaskLimit|\n0|26|RUNNING|None|node1\n"
    final = ("JobId=26 ArrayJobId=25 ArrayTaskId=0 JobName=envport-matrix JobState=COMPLETED Reason=None "
             "ExitCode=0:0 NodeList=node1 BatchHost=node1\n"
             "JobId=27 ArrayJobId=25 ArrayTaskId=1 JobName=envport-matrix JobState=TIMEOUT Reason=TimeLimit "
             "ExitCode=0:15 NodeList=node2 BatchHost=node2\n"
             "JobId=25 ArrayJobId=25 ArrayTaskId=2-3%1 JobState=PENDING Reason=JobArrayTaskLimit NodeList=(null)\n")
    client = _answers(monkeypatch, {"squeue -h -r": (0, queue, ""), "scontrol show job": (0, final, ""),
                                    "sacct -c -j": (0, "28|FAILED|1:0|node2\n", "")})
    got = client.array_queue("25")
    assert {i: (t.job_id, t.state, t.reason, t.nodes) for i, t in got.items()} == {
        1: ("25", "PENDING", "JobArrayTaskLimit", ""), 2: ("25", "PENDING", "JobArrayTaskLimit", ""),
        0: ("26", "RUNNING", "None", "node1")}
    ended = client.array_final("25")
    assert set(ended) == {0, 1}  # the pending range is no task's end
    assert (ended[1].job_id, ended[1].state, ended[1].exit_code, ended[1].nodes) == ("27", "TIMEOUT", "0:15", "node2")
    (acct,) = client.sacct_tasks(["28"]).values()
    assert (acct.state, acct.exit_code, acct.nodes) == ("FAILED", "1:0", "node2")
    # Once Slurm forgot the whole array, squeue says so: nothing is queued (not "squeue did not answer").
    client = _answers(monkeypatch, {"squeue -h -r": (1, "", "slurm_load_jobs error: Invalid job id specified")})
    assert client.array_queue("25") == {}
    client = _answers(monkeypatch, {"squeue -h -r": (124, "", "squeue did not answer within 30s")})
    assert client.array_queue("25") is None


def test_follow_names_each_end_as_it_comes_and_gather_settles_every_pair(monkeypatch, tmp_path):
    """The follow loop over a scripted Slurm: task 0 completes (scontrol), task 1's node is lost and Slurm
    has forgotten it (sacct -c by its own job id); every state change and the count done are printed."""
    from envport.engines import slurm as client

    tasks = _tasks(2)
    (a,) = array.plan_arrays(tasks, None, 2, tmp_path)
    a.job_id = "50"
    for t in tasks:
        t.array, t.follower = "50", client.LogFollower(t.log)
    (tmp_path / "results").mkdir()
    tasks[0].result.write_text(UP_OK)
    tasks[1].log.write_text("envport: [up] build\n")
    polls = iter([
        {0: ArrayTask(0, "51", "RUNNING", "None", "node1"), 1: ArrayTask(1, "50", "RUNNING", "None", "node2")},
        {1: ArrayTask(1, "50", "RUNNING", "None", "node2")},
        {},
    ])
    monkeypatch.setattr(client, "array_queue", lambda _id: next(polls))
    monkeypatch.setattr(client, "array_final", lambda _id: {0: ArrayTask(0, "51", "COMPLETED", "None", "node1", "0:0")})
    monkeypatch.setattr(client, "sacct_tasks", lambda ids: {"50": ArrayTask(-1, "50", "NODE_FAIL", "", "node2", "0:0")})
    monkeypatch.setattr(client, "node_reasons", lambda nodes: [f"{nodes}: Not responding (down)"])
    said: list[str] = []
    array.follow([a], _profile(), said.append, poll_s=0)
    array.gather([a], _profile())
    assert "slurm: [e0 venv] task 50_0 RUNNING on node1" in said
    assert "slurm: [e0 venv] COMPLETED on node1 (1 of 2 pair(s) done)" in said
    assert "slurm: [e1 venv] NODE_FAIL on node2 (2 of 2 pair(s) done)" in said
    assert "[e1 venv] envport: [up] build" in said  # the task's own progress, prefixed with its pair
    ok, lost = tasks[0].run, tasks[1].run
    assert ok.verdict == "OK" and ok.ran_on == "Slurm job 50_0 on node1"
    assert lost.verdict == "FAILED" and lost.reason == "node_lost" and "node2: Not responding (down)" in lost.error


def test_an_array_still_pending_past_max_pending_is_cancelled_and_its_pairs_refused(monkeypatch, tmp_path):
    from envport.engines import slurm as client

    tasks = _tasks(2)
    (a,) = array.plan_arrays(tasks, None, 2, tmp_path)
    a.job_id = "60"
    for t in tasks:
        t.array = "60"
    cancelled = []
    monkeypatch.setattr(client, "array_queue", lambda _id: {i: ArrayTask(i, "60", "PENDING", "Resources") for i in (0, 1)})
    monkeypatch.setattr(client, "array_final", lambda _id: {})
    monkeypatch.setattr(client, "cancel", cancelled.append)
    said: list[str] = []
    profile = _profile(max_pending=0.05)
    array.follow([a], profile, said.append, poll_s=0.02)
    array.gather([a], profile)
    assert cancelled == ["60"]
    assert any("array 60 still PENDING after" in s and "Reason=Resources); cancelling it" in s for s in said), said
    for t in tasks:
        assert t.run.verdict == "REFUSED" and t.run.reason == "pending_timeout" and t.run.exit_code == 3
        assert "Slurm Reason=Resources" in t.run.error

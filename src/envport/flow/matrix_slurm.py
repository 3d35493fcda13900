"""`envport matrix --run --slurm CLUSTER`: the runnable pairs as Slurm job arrays, followed, then gathered.

    runnable pairs --plan_tasks--> one Task per pair: its `envport up` argv and its result file, named by the
                                   env's hash (results/<hash12>-<pair key>.json)
        --split (MaxArraySize)--> arrays of at most MaxArraySize tasks (one, unless the matrix outgrows it)
        --render + sbatch --array=0-N%K--> each task runs `envport up ... --json` on the node it lands on
        --follow (squeue -r; scontrol show job; sacct -c)--> each task's end: state, exit code, node
        --settle--> the pair's PairRun: up's own steps from its result file, else why there is none
                    (TIMEOUT, a lost node, cancelled, no JSON), with the task's log tail

The result is the same PairRun list `matrix --run` fills on this host, so the JUnit XML and the summary
are written by the same report/matrix.py functions. Every wait has a limit: a whole array still PENDING
after the profile's max_pending is cancelled (REFUSED, Slurm's Reason named), and one still running past
its waves x the profile's time (plus a margin) is cancelled, its unfinished tasks named.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import time
from pathlib import Path
from typing import Optional

from envport.core.progress import Progress, quiet, tail
from envport.engines import slurm as client
from envport.engines.slurm import ArrayTask, LogFollower, MARKER
from envport.plan.cluster import ClusterProfile

TEMPLATE = "matrix-array.sbatch.j2"
# Slurm states that mean the task's run was cut short, and the reason token the pair then carries.
CUT_SHORT = {"TIMEOUT": "slurm_timeout", "NODE_FAIL": "node_lost", "BOOT_FAIL": "node_lost",
             "PREEMPTED": "slurm_cancelled", "CANCELLED": "slurm_cancelled", "DEADLINE": "slurm_timeout",
             "OUT_OF_MEMORY": "slurm_oom"}


# --- planning (pure) -------------------------------------------------------------------


@dataclasses.dataclass
class Task:
    """One pair as one array task."""

    run: object  # report.matrix.PairRun, filled when the task is settled
    key: str  # <hash12>-<pair key>: the result file's stem
    argv: list[str]  # `envport up ... --json`, run on the node
    env: dict[str, str]  # what the pair's run needs beyond the submitting shell's environment
    result: Path = Path()
    log: Path = Path()
    index: int = 0  # SLURM_ARRAY_TASK_ID
    array: str = ""  # the array's job id, once submitted
    slurm: Optional[ArrayTask] = None  # the last Slurm said about it
    done: bool = False
    cancelled_by_us: str = ""  # "pending" | "deadline" | "interrupt"
    follower: Optional[LogFollower] = None
    started: Optional[float] = None  # monotonic: first seen running
    ended: Optional[float] = None  # monotonic: seen gone from the queue

    @property
    def label(self) -> str:
        return self.run.judged.pair.label


@dataclasses.dataclass
class Array:
    number: int  # 1..n, in submission order
    tasks: list[Task]
    throttle: int
    script: Path
    job_id: str = ""


def split(n: int, max_array_size: Optional[int]) -> list[range]:
    """Task numbers 0..N-1 cut into the fewest arrays whose indices stay below MAX_ARRAY_SIZE (Slurm accepts
    indices 0..MaxArraySize-1); one array when the size is unknown."""
    if n <= 0:
        return []
    size = n if not max_array_size or max_array_size < 1 else max_array_size
    return [range(start, min(start + size, n)) for start in range(0, n, size)]


def throttles(jobs: int, arrays: int) -> list[int]:
    """--jobs shared out over the arrays (each at least 1): together they never run more than --jobs
    tasks at once, unless there are more arrays than --jobs."""
    base, extra = divmod(max(jobs, 1), max(arrays, 1))
    return [max(base + (1 if i < extra else 0), 1) for i in range(arrays)]


def directives(array: Array, profile: ClusterProfile, job_dir: Path) -> list[tuple[str, Optional[str]]]:
    """The #SBATCH lines of one array: one task per pair, the profile's partition, account, time and size."""
    out: list[tuple[str, Optional[str]]] = [
        ("--job-name", "envport-matrix"),
        ("--array", f"0-{len(array.tasks) - 1}%{array.throttle}"),
        ("--output", str(job_dir / f"array{array.number}-%a.log")),
        ("--ntasks", "1"),
        ("--cpus-per-task", str(profile.cpus)),
        ("--time", profile.time),
    ]
    for flag, value in (("--partition", profile.partition), ("--account", profile.account),
                        ("--gres", profile.gres), ("--mem", profile.mem), ("--constraint", profile.constraint)):
        if value:
            out.append((flag, value))
    return out


def plan_arrays(tasks: list[Task], max_array_size: Optional[int], jobs: int, job_dir: Path) -> list[Array]:
    """The tasks cut into arrays, each task given its index, result file and log."""
    ranges = split(len(tasks), max_array_size)
    arrays = []
    for number, (part, throttle) in enumerate(zip(ranges, throttles(jobs, len(ranges))), start=1):
        mine = [tasks[i] for i in part]
        for index, task in enumerate(mine):
            task.index = index
            task.result = job_dir / "results" / f"{task.key}.json"
            task.log = job_dir / f"array{number}-{index}.log"
        arrays.append(Array(number, mine, throttle, job_dir / f"array{number}.sbatch"))
    return arrays


def render(array: Array, count: int, profile: ClusterProfile, job_dir: Path) -> str:
    tasks = [{"label": t.label, "result": str(t.result), "env": sorted(t.env.items()), "argv": shlex.join(t.argv)}
             for t in array.tasks]
    return client.sbatch_jinja().get_template(TEMPLATE).render(
        cluster=profile.name, number=array.number, arrays=count, results_dir=str(job_dir / "results"),
        directives=directives(array, profile, job_dir), slurm_conf=profile.slurm_conf, tmp_dir=profile.tmp_dir,
        envs_dir=profile.envs_dir, activation=profile.activation, tasks=tasks)


def run_limit_s(profile: ClusterProfile, array: Array) -> float:
    """How long an array may run: its waves (tasks / throttle, rounded up) of the profile's time, plus margin."""
    waves = -(-len(array.tasks) // array.throttle)
    return waves * profile.time_s + client.RUN_MARGIN_S


# --- settling one task (pure) ------------------------------------------------------------


def settle(task: Task, result_text: Optional[str], log_text: str, profile: ClusterProfile,
           failed_nodes: list[str]) -> None:
    """Fill the task's PairRun: up's own steps where its JSON came back, else the reason Slurm gives."""
    r, s = task.run, task.slurm or ArrayTask(task.index)
    r.ran_on = f"Slurm job {task.array}_{task.index}" + (f" on {s.nodes}" if s.nodes else "")
    r.slurm = {"array": task.array, "index": task.index, "job_id": s.job_id, "state": s.state,
               "exit_code": s.exit_code, "nodes": s.nodes, "log": str(task.log), "result": str(task.result)}
    if task.started is not None and task.ended is not None:
        r.seconds = task.ended - task.started
    data = _up_json(result_text)
    if data is not None:
        r.exit_code, r.steps = int(data.get("exit_code", 1)), data.get("steps") or []
        return
    r.exit_code = 3 if task.cancelled_by_us == "pending" else 1
    r.reason = "pending_timeout" if task.cancelled_by_us == "pending" else CUT_SHORT.get(s.state, "no_result")
    r.error = why_no_result(task, s, profile, failed_nodes, result_text is not None)
    r.lines = tail("\n".join(ln for ln in log_text.splitlines() if not ln.startswith(MARKER)), 20)


def _up_json(text: Optional[str]) -> Optional[dict]:
    try:
        data = json.loads(text) if text else None
    except ValueError:
        return None
    return data if isinstance(data, dict) and isinstance(data.get("steps"), list) else None


def why_no_result(task: Task, s: ArrayTask, profile: ClusterProfile, failed_nodes: list[str],
                  empty: bool) -> str:
    """One line: what became of a task that left no JSON, in Slurm's words and ours."""
    what = f"Slurm task {task.array}_{task.index} {s.state}" + (f" ExitCode={s.exit_code}" if s.exit_code else "")
    where = f" on {s.nodes}" if s.nodes else ""
    if task.cancelled_by_us == "pending":
        return (f"{what}: still PENDING after the cluster profile's max_pending {profile.max_pending:.0f}s "
                f"(Slurm Reason={s.reason or 'unknown'}); cancelled")
    if task.cancelled_by_us:
        return f"{what}{where}: cancelled by envport ({task.cancelled_by_us}) before `envport up` ended"
    if s.state == "TIMEOUT":
        return f"{what}{where}: ran past the cluster profile's time {profile.time}; log {task.log}"
    if s.state in ("NODE_FAIL", "BOOT_FAIL"):
        down = ", ".join(failed_nodes) or "see `sinfo -R`"
        return f"{what}{where}: its node was lost ({down}); log {task.log}"
    said = "left an empty or unreadable result" if empty else "left no result"
    return f"{what}{where}: `envport up` {said}; log {task.log}"


# --- submitting and following (asks Slurm) --------------------------------------------------


def submit_all(arrays: list[Array], profile: ClusterProfile, job_dir: Path, progress: Progress) -> str:
    """Write and submit every array; "" or sbatch's complaint (the arrays submitted so far are cancelled)."""
    (job_dir / "results").mkdir(parents=True, exist_ok=True)
    for array in arrays:
        array.script.write_text(render(array, len(arrays), profile, job_dir), encoding="utf-8")
        job_id, why = client.submit(array.script)
        if job_id is None:
            for done in arrays:
                if done.job_id:
                    client.cancel(done.job_id)
            return why
        array.job_id = job_id
        for task in array.tasks:
            task.array, task.follower = job_id, LogFollower(task.log)
        progress(f"slurm: submitted array {job_id} ({len(array.tasks)} pair(s), at most {array.throttle} at once) "
                 f"to cluster {profile.name}: {array.script}")
    return ""


def follow(arrays: list[Array], profile: ClusterProfile, progress: Progress = quiet,
           poll_s: float = client.POLL_S) -> None:
    """Poll every array until each task ended; print each task's state changes and its run's progress lines,
    and the count of tasks done. Cancels what pends past max_pending or runs past its limit."""
    total = sum(len(a.tasks) for a in arrays)
    t0 = time.monotonic()
    started: dict[str, float] = {}
    try:
        while True:
            for array in arrays:
                _poll(array, progress, total, arrays)
                if any(t.slurm and t.slurm.state != "PENDING" for t in array.tasks):
                    started.setdefault(array.job_id, time.monotonic())
            if all(t.done for a in arrays for t in a.tasks):
                break
            _enforce_limits(arrays, profile, t0, started, progress)
            time.sleep(poll_s)
    except KeyboardInterrupt:
        progress("slurm: interrupted; cancelling the matrix's arrays")
        _cancel(arrays, "interrupt")
        raise


def _done_count(arrays: list[Array]) -> int:
    return sum(t.done for a in arrays for t in a.tasks)


def _poll(array: Array, progress: Progress, total: int, arrays: list[Array]) -> None:
    open_tasks = [t for t in array.tasks if not t.done]
    if not open_tasks:
        return
    queue = client.array_queue(array.job_id)
    if queue is None:  # squeue did not answer: ask again next round
        return
    final: Optional[dict[int, ArrayTask]] = None
    for task in open_tasks:
        _stream(task, progress)
        seen = queue.get(task.index)
        if seen is not None:
            _update(task, seen, progress)
            continue
        if final is None:
            final = client.array_final(array.job_id)
        _finish(task, final.get(task.index))
        _stream(task, progress)
        progress(f"slurm: [{task.label}] {task.slurm.state}" + (f" on {task.slurm.nodes}" if task.slurm.nodes else "")
                 + f" ({_done_count(arrays)} of {total} pair(s) done)")


def _update(task: Task, seen: ArrayTask, progress: Progress) -> None:
    before = task.slurm
    if seen.state == "PENDING" and before and before.state != "PENDING":
        seen.job_id = before.job_id  # requeued: keep the task's own id, not the array's a pending one shows
    task.slurm = seen
    if seen.state != "PENDING" and task.started is None:
        task.started = time.monotonic()
    if before is None or (before.state, before.nodes) != (seen.state, seen.nodes):
        how = f" (Reason={seen.reason})" if seen.state == "PENDING" else f" on {seen.nodes}" if seen.nodes else ""
        progress(f"slurm: [{task.label}] task {task.array}_{task.index} {seen.state}{how}")


def _finish(task: Task, final: Optional[ArrayTask]) -> None:
    """The task left the queue: its end from scontrol, else from sacct -c by its own job id."""
    known = task.slurm or ArrayTask(task.index)
    # A pending task shows the array's id; once it ran, its own (the array's last task keeps the array's).
    if final is None and known.job_id and known.state != "PENDING":
        final = client.sacct_tasks([known.job_id]).get(known.job_id)
    if final is None:
        final = dataclasses.replace(known, state=known.state if known.state in client.DONE_STATES else "UNKNOWN")
    final.index = task.index
    final.nodes = final.nodes or known.nodes
    task.slurm, task.done, task.ended = final, True, time.monotonic()


def _stream(task: Task, progress: Progress) -> None:
    """The task's new log lines, prefixed with its pair (as `matrix --run` prints a local pair's)."""
    for line in task.follower.new_lines() if task.follower else []:
        progress(f"[{task.label}] {line[len(MARKER):] if line.startswith(MARKER) else line}")


def _enforce_limits(arrays: list[Array], profile: ClusterProfile, t0: float, started: dict[str, float],
                    progress: Progress) -> None:
    now = time.monotonic()
    for array in arrays:
        open_tasks = [t for t in array.tasks if not t.done]
        if not open_tasks:
            continue
        if array.job_id not in started and now - t0 > profile.max_pending:
            reason = next((t.slurm.reason for t in open_tasks if t.slurm and t.slurm.reason), "unknown")
            progress(f"slurm: array {array.job_id} still PENDING after {now - t0:.0f}s (max_pending "
                     f"{profile.max_pending:.0f}s, Reason={reason}); cancelling it")
            _cancel([array], "pending")
        elif array.job_id in started and now - started[array.job_id] > run_limit_s(profile, array):
            progress(f"slurm: array {array.job_id} ran past {run_limit_s(profile, array):.0f}s; cancelling "
                     f"its {len(open_tasks)} unfinished task(s)")
            _cancel([array], "deadline")


def _cancel(arrays: list[Array], why: str) -> None:
    for array in arrays:
        if not array.job_id or all(t.done for t in array.tasks):
            continue
        client.cancel(array.job_id)
        final = client.array_final(array.job_id)
        for task in array.tasks:
            if not task.done:
                task.cancelled_by_us = why
                _finish(task, final.get(task.index))


def gather(arrays: list[Array], profile: ClusterProfile) -> None:
    """Settle every task from its result file and its log."""
    for array in arrays:
        for task in array.tasks:
            failed = client.node_reasons(task.slurm.nodes) if task.slurm and task.slurm.state == "NODE_FAIL" \
                and task.slurm.nodes else []
            settle(task, _read(task.result), _read(task.log) or "", profile, failed)


def _read(path: Path) -> Optional[str]:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None

"""The Slurm client: submit, squeue, scontrol, sacct, scancel, sinfo, and following a job's log.

Every command goes through core/proc with a timeout (a hung slurmctld answers
nothing); every wait has a limit: `srun -n 4` on a 2-CPU node pends forever.
"""

from __future__ import annotations

import dataclasses
import re
import time
from pathlib import Path
from typing import Optional, Sequence

import jinja2

from envport.core.progress import Progress, quiet
from envport.core.proc import run
from envport.plan.cluster import ClusterProfile

POLL_S = 1.0
# Past the job's own time limit, how long to keep polling before cancelling it ourselves.
RUN_MARGIN_S = 120.0
# The prefix of the progress lines a job's script writes to its log (witness.sbatch.j2, sif-build.sbatch.j2).
MARKER = "envport-slurm: "
# Job states after which Slurm will not run the job (any more).
DONE_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
               "BOOT_FAIL", "DEADLINE", "REVOKED", "SPECIAL_EXIT"}


def templates_dir() -> Path:
    from importlib.resources import files

    return Path(str(files("envport.slurm_files")))


def sbatch_jinja() -> jinja2.Environment:
    # The renderers' environment (StrictUndefined, the shell-quoting filter, the `{##` comments
    # that leave bash's ${#a[@]} alone), reading the sbatch templates from slurm/.
    from envport.renderers import ENV

    return ENV.overlay(loader=jinja2.FileSystemLoader(str(templates_dir())))


@dataclasses.dataclass
class JobOutcome:
    job_id: str
    state: str = "UNKNOWN"  # Slurm's JobState at the end
    exit_code: str = ""  # Slurm's ExitCode, "rc:signal"
    reason: str = ""  # Slurm's Reason (PENDING: why it waits)
    nodes: str = ""
    pending_s: float = 0.0
    running_s: float = 0.0
    cancelled_by_us: str = ""  # "pending" | "deadline" | "interrupt"
    source: str = ""  # where the final state came from: scontrol | sacct -c | squeue
    failed_nodes: list[str] = dataclasses.field(default_factory=list)  # NODE_FAIL: "node2: Not responding (down)"

    @property
    def exit_status(self) -> Optional[int]:
        try:
            return int(self.exit_code.split(":")[0])
        except (ValueError, IndexError):
            return None


def _run(argv: Sequence[str], timeout: float = 30) -> tuple[int, str, str]:
    """(rc, stdout, stderr) of a Slurm client command; 127/124 when it is missing or hangs."""
    ran = run(argv, timeout=timeout)
    if ran.returncode is None:
        return (124 if "did not answer" in ran.why else 127), "", ran.why
    return ran.returncode, ran.stdout, ran.stderr


def submit(script: Path) -> tuple[Optional[str], str]:
    """(job id, "") or (None, sbatch's complaint)."""
    rc, out, err = _run(["sbatch", "--parsable", str(script)], timeout=60)
    if rc != 0:
        return None, (err or out).strip() or f"sbatch exited {rc}"
    return out.strip().split(";")[0], ""


def squeue_state(job_id: str) -> Optional[tuple[str, str, str]]:
    """(state, reason, nodes) while the job is queued or running; None once it left the queue."""
    rc, out, _ = _run(["squeue", "-h", "-j", job_id, "-o", "%T|%r|%N"])
    line = out.strip().splitlines()[0] if rc == 0 and out.strip() else ""
    if not line:
        return None
    state, reason, nodes = (line.split("|") + ["", "", ""])[:3]
    return state, reason, nodes


def scontrol_job(job_id: str) -> dict[str, str]:
    """JobState, Reason, ExitCode, NodeList from `scontrol show job -o ID` ({} once Slurm forgot the job)."""
    rc, out, _ = _run(["scontrol", "show", "job", "-o", job_id])
    if rc != 0 or not out.strip():
        return {}
    # Values such as JobName or Command may hold spaces: pick the keys we need, each one word.
    return {k: m.group(1) for k in ("JobState", "Reason", "ExitCode", "NodeList")
            if (m := re.search(rf"(?:^|\s){k}=(\S+)", out))}


def sacct_job(job_id: str) -> dict[str, str]:
    """State and ExitCode from the job-completion file (`sacct -c`, no database needed)."""
    rc, out, _ = _run(["sacct", "-c", "-j", job_id, "-n", "-P", "-o", "jobid,state,exitcode"])
    for line in out.splitlines() if rc == 0 else []:
        parts = line.split("|")
        if len(parts) >= 3 and parts[0].split(".")[0] == job_id:
            return {"JobState": parts[1].split()[0], "ExitCode": parts[2]}
    return {}


def final_state(job_id: str, limit_s: float = 20.0) -> tuple[dict[str, str], str]:
    """The job's final JobState/ExitCode: scontrol while Slurm knows it, else sacct -c."""
    end = time.monotonic() + limit_s
    while True:
        info = scontrol_job(job_id)
        if info.get("JobState") in DONE_STATES:
            return info, "scontrol"
        if not info:
            acct = sacct_job(job_id)
            if acct.get("JobState") in DONE_STATES:
                return acct, "sacct -c"
        if time.monotonic() >= end:
            return info or sacct_job(job_id), "scontrol" if info else "sacct -c"
        time.sleep(0.5)


def cancel(job_id: str, limit_s: float = 60.0) -> None:
    """scancel, then wait (bounded) until the job has left the queue."""
    _run(["scancel", job_id])
    end = time.monotonic() + limit_s
    while time.monotonic() < end and squeue_state(job_id) is not None:
        time.sleep(0.5)


class LogFollower:
    """New complete lines of a log file that grows (Slurm writes it on the node)."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0
        self.partial = ""

    def new_lines(self) -> list[str]:
        try:
            with open(self.path, "r", encoding="utf-8", errors="replace") as fh:
                fh.seek(self.offset)
                chunk = fh.read()
                self.offset = fh.tell()
        except OSError:
            return []
        text = self.partial + chunk
        lines = text.split("\n")
        self.partial = lines.pop()
        return lines


def wait_for(job_id: str, profile: ClusterProfile, log: Optional[Path] = None, progress: Progress = quiet,
             poll_s: float = POLL_S, run_limit_s: Optional[float] = None) -> JobOutcome:
    """Poll until the job ends; cancel it when it pends past max_pending or runs past its limit."""
    out = JobOutcome(job_id)
    follower = LogFollower(log) if log else None
    limit = run_limit_s if run_limit_s is not None else profile.time_s + RUN_MARGIN_S
    t0 = time.monotonic()
    started: Optional[float] = None
    last_seen = ""
    try:
        while True:
            now = time.monotonic()
            q = squeue_state(job_id)
            if q is None:
                break
            state, reason, nodes = q
            seen = f"{state}|{reason if state == 'PENDING' else ''}"
            if seen != last_seen:
                progress(f"slurm: job {job_id} {state}" + (f" (Reason={reason})" if state == "PENDING" else "")
                         + (f" on {nodes}" if state == "RUNNING" and nodes else ""))
                last_seen = seen
            if state == "PENDING":
                out.reason = reason
                out.pending_s = now - t0
                if out.pending_s > profile.max_pending:
                    progress(f"slurm: job {job_id} still PENDING after {out.pending_s:.0f}s "
                             f"(max_pending {profile.max_pending:.0f}s, Reason={reason}); cancelling")
                    out.cancelled_by_us = "pending"
                    cancel(job_id)
                    break
            else:
                if started is None:
                    started = now
                    out.pending_s = now - t0
                out.nodes = nodes or out.nodes
                if now - started > limit:
                    progress(f"slurm: job {job_id} ran past {limit:.0f}s; cancelling")
                    out.cancelled_by_us = "deadline"
                    cancel(job_id)
                    break
            if follower:
                for line in follower.new_lines():
                    if line.startswith(MARKER):
                        progress(f"slurm: job {job_id}: {line[len(MARKER):]}")
            time.sleep(poll_s)
    except KeyboardInterrupt:
        out.cancelled_by_us = "interrupt"
        progress(f"slurm: interrupted; cancelling job {job_id}")
        cancel(job_id)
        raise
    finally:
        if started is not None:
            out.running_s = time.monotonic() - started
    if follower:
        for line in follower.new_lines():
            if line.startswith(MARKER):
                progress(f"slurm: job {job_id}: {line[len(MARKER):]}")
    info, source = final_state(job_id)
    out.state = info.get("JobState", "UNKNOWN")
    out.exit_code = info.get("ExitCode", "")
    out.source = source
    if info.get("Reason") and info.get("Reason") not in ("None", "(null)") and out.cancelled_by_us != "pending":
        out.reason = info["Reason"]
    out.nodes = info.get("NodeList", out.nodes) if info.get("NodeList") not in (None, "(null)") else out.nodes
    if out.state == "NODE_FAIL" and out.nodes:
        out.failed_nodes = node_reasons(out.nodes)
    return out


def node_reasons(nodelist: str) -> list[str]:
    """'node2: Not responding (down)' for each node of NODELIST that Slurm holds down, drained or failed."""
    rc, out, _ = _run(["sinfo", "-R", "-h", "-N", "-n", nodelist, "-o", "%N|%T|%E"])
    rows = []
    for line in out.splitlines() if rc == 0 else []:
        node, state, reason = (line.split("|", 2) + ["", ""])[:3]
        if node:
            rows.append(f"{node}: {reason.strip() or 'no reason given'} ({state.strip()})")
    return sorted(set(rows))


# --- job arrays (`envport matrix --run --slurm`) ------------------------------------


def max_array_size() -> Optional[int]:
    """The cluster's MaxArraySize (`scontrol show config`): an array's indices must stay below it. None when
    scontrol does not say (then one array is tried, and sbatch's own complaint names the limit)."""
    rc, out, _ = _run(["scontrol", "show", "config"])
    m = re.search(r"^MaxArraySize\s*=\s*(\d+)\s*$", out, re.M) if rc == 0 else None
    return int(m.group(1)) if m else None


@dataclasses.dataclass
class ArrayTask:
    """One task of a job array as Slurm reports it."""

    index: int  # SLURM_ARRAY_TASK_ID
    job_id: str = ""  # the task's own job id: `sacct -c` knows it by this one only
    state: str = "PENDING"
    reason: str = ""
    nodes: str = ""
    exit_code: str = ""  # "rc:signal" once it ended


def array_queue(array_id: str) -> Optional[dict[int, ArrayTask]]:
    """The array's tasks still queued or running, one line each (`squeue -r`); None when squeue did not answer
    (a hiccup of slurmctld is not "every task left the queue")."""
    rc, out, err = _run(["squeue", "-h", "-r", "-j", array_id, "-o", "%K|%A|%T|%r|%N"])
    if rc != 0:
        # squeue exits 1 with "Invalid job id" once Slurm forgot the whole array: nothing queued.
        return {} if "Invalid job id" in out + err else None
    tasks: dict[int, ArrayTask] = {}
    for line in out.splitlines():
        index, job_id, state, reason, nodes = (line.split("|") + [""] * 5)[:5]
        if index.isdigit():
            tasks[int(index)] = ArrayTask(int(index), job_id, state, reason, nodes)
    return tasks


def array_final(array_id: str) -> dict[int, ArrayTask]:
    """Every task Slurm still remembers (`scontrol show job -o ARRAY`: one line per task; a range of pending
    tasks is one line with a range, left out here)."""
    rc, out, _ = _run(["scontrol", "show", "job", "-o", array_id])
    tasks: dict[int, ArrayTask] = {}
    for line in out.splitlines() if rc == 0 else []:
        fields = {k: m.group(1) for k in ("JobId", "ArrayTaskId", "JobState", "Reason", "ExitCode", "NodeList")
                  if (m := re.search(rf"(?:^|\s){k}=(\S+)", line))}
        if fields.get("ArrayTaskId", "").isdigit():
            i = int(fields["ArrayTaskId"])
            nodes = fields.get("NodeList", "")
            tasks[i] = ArrayTask(i, fields.get("JobId", ""), fields.get("JobState", "UNKNOWN"),
                                 fields.get("Reason", ""), "" if nodes == "(null)" else nodes,
                                 fields.get("ExitCode", ""))
    return tasks


def sacct_tasks(job_ids: Sequence[str]) -> dict[str, ArrayTask]:
    """State, ExitCode and NodeList of finished jobs by their own ids, from the job-completion file (`sacct -c`):
    what is left once slurmctld forgot an array (its MinJobAge)."""
    if not job_ids:
        return {}
    rc, out, _ = _run(["sacct", "-c", "-j", ",".join(job_ids), "-n", "-P", "-o", "jobid,state,exitcode,nodelist"])
    found: dict[str, ArrayTask] = {}
    for line in out.splitlines() if rc == 0 else []:
        parts = line.split("|")
        if len(parts) >= 4 and parts[0] in job_ids:
            found[parts[0]] = ArrayTask(-1, parts[0], parts[1].split()[0] if parts[1] else "UNKNOWN", "",
                                        parts[3], parts[2])
    return found

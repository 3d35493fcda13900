"""Run an env's witnesses as a Slurm batch job and read the verdicts back.

    profile (slurm/clusters/<c>.yaml) + spec + target
        --render--> job folder: job.sbatch, witnesses/ (copied), job.log (Slurm writes it)
        --sbatch --parsable--> job id
        --poll (squeue; scontrol show job; sacct -c without a database)--> final state, ExitCode
        --read job.log--> one StepResult per check (the same sentinel lines as a local run)

Verdicts: OK; FAILED with the log tail and Slurm's JobState/ExitCode; REFUSED
when the job could not start: sbatch rejected it, or it was still PENDING
after the profile's `max_pending` (then it is cancelled and Slurm's Reason is
named).  Every wait has a limit: `srun -n 4` on a 2-CPU node pends forever.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import os
import re
import shlex
import shutil
import time
import uuid
from pathlib import Path
from typing import Optional

from envport.core.layout import env_prefix
from envport.sif.run import SWEEP_FN
from envport.engines.slurm import POLL_S, JobOutcome, sbatch_jinja, submit, wait_for
from envport.plan.cluster import ClusterProfile
from envport.witness.launchers.base import WITNESS_DIR, LaunchResult, Launcher
from envport.witness.launchers.srun import MASTER_ADDR_FN, SrunLauncher
from envport.core.progress import Progress, quiet, tail
from envport.core.verdict import NO_ACCELERATOR_REASON, StepResult, Verdict
from envport.witness.judge import call_results


# --- rendering -----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TaskEnv:
    """How one task of a witness job reaches the env on the node it lands on: the launcher srun runs the witness
    through (a container's, a SIF's, the env's python) and the shell lines before it (a venv's activation)."""

    inner: Launcher
    prelude: tuple[str, ...] = ()


@dataclasses.dataclass
class JobSpec:
    """Everything one witness job needs; `render` turns it into the batch script."""

    loaded: object  # loader.Loaded
    identity: object  # recipe.identity.Identity: the env this job proves, as the site built it
    profile: ClusterProfile
    target: str  # the target's name, for the script's header and the ledger
    calls: list  # witness.plan.WitnessCall, in order
    job_dir: Path
    env: dict  # witness env additions (PYTHONUNBUFFERED, a test fault)
    image: Optional[str] = None  # docker
    sif: Optional[str] = None  # apptainer: the SIF, on a path the nodes see
    prefix: Optional[str] = None  # venv: the env on the nodes
    docker_bin: str = "docker"
    python: str = "python3"  # docker: the interpreter inside the image
    nodes: Optional[int] = None  # sbatch --nodes (None: Slurm picks)
    ntasks_per_node: Optional[int] = None  # sbatch --ntasks-per-node
    task: Optional[TaskEnv] = None  # how a task reaches the env on its node: the target's (slurm_task)

    @property
    def script_path(self) -> Path:
        return self.job_dir / "job.sbatch"

    @property
    def log_path(self) -> Path:
        return self.job_dir / "job.log"

    @property
    def witness_dir(self) -> Path:
        return self.job_dir / "witnesses"

    @property
    def ntasks(self) -> int:
        if self.nodes and self.ntasks_per_node:
            return self.nodes * self.ntasks_per_node
        return max([c.world for c in self.calls if c.world] + [1])

    @property
    def job_name(self) -> str:
        return f"envport-{self.loaded.spec.name}"


def default_prefix(name: str, profile: ClusterProfile) -> str:
    return str(env_prefix(name, profile.envs_dir))


def srun_launcher(job: JobSpec) -> SrunLauncher:
    """The launcher each witness call of the batch script uses (inside the allocation): srun around the way the
    job's target reaches its env on a node (`Target.slurm_task`)."""
    if job.task is None:
        raise ValueError(f"job {job.job_name}: no task launcher (the target's slurm_task was not asked)")
    return SrunLauncher(job.task.inner, job.loaded.spec.name, in_allocation=True, prelude=job.task.prelude,
                        run_token=job.job_dir.name)


def wants_gpus(profile: ClusterProfile) -> bool:
    """The job's tasks get the node's GPUs when the profile asks Slurm for some (gres gpu:N)."""
    return bool(profile.gres and "gpu" in profile.gres)


def node_cpu_limit(partition: Optional[str]) -> Optional[int]:
    from envport.witness.launchers.srun import node_cpus

    return node_cpus(partition)


def directives(job: JobSpec, node_cpus: Optional[int] = None) -> list[tuple[str, Optional[str]]]:
    p = job.profile
    out: list[tuple[str, Optional[str]]] = [
        ("--job-name", job.job_name),
        ("--output", str(job.log_path)),
        ("--ntasks", str(job.ntasks)),
        ("--cpus-per-task", str(p.cpus)),
        ("--time", p.time),
    ]
    if job.nodes:
        out.append(("--nodes", str(job.nodes)))
    if job.ntasks_per_node:
        out.append(("--ntasks-per-node", str(job.ntasks_per_node)))
    for flag, value in (("--partition", p.partition), ("--account", p.account), ("--gres", p.gres),
                        ("--mem", p.mem), ("--constraint", p.constraint)):
        if value:
            out.append((flag, value))
    # More tasks than a node has CPUs would pend forever (Reason=PartitionConfig): overcommit
    # them.  A single task wider than a node stays as asked: it pends, and max_pending refuses it
    # (with --overcommit sbatch would reject it outright; measured on slurm-wlm 22.05).
    per_node = job.ntasks_per_node or (-(-job.ntasks // job.nodes) if job.nodes else job.ntasks)
    if node_cpus and p.cpus <= node_cpus < per_node * p.cpus:
        out.append(("--overcommit", None))
    return out


def _shell_line(argv: list[str], task_script: str) -> str:
    """argv as one quoted shell line, the per-task wrapper replaced by "$ENVPORT_TASK" (defined once)."""
    i = argv.index(task_script)
    return " ".join([shlex.join(argv[:i]), '"$ENVPORT_TASK"', shlex.join(argv[i + 1:])])


def render(job: JobSpec, node_cpus: Optional[int] = None) -> str:
    launcher = srun_launcher(job)
    task_script = launcher.task_script(job.env)
    calls = []
    for call in job.calls:
        args = list(call.args)
        if call.script == "dist.py":
            args += ["--launch", "external"]
        argv = launcher.command(call.script, args, job.env)
        calls.append({"label": call.label, "checks": call.checks, "command": _shell_line(argv, task_script)})
    return sbatch_jinja().get_template("witness.sbatch.j2").render(
        name=job.loaded.spec.name, hash12=job.identity.hash12, target=job.target, cluster=job.profile.name,
        script_path=str(job.script_path), log_path=str(job.log_path), witness_dir=str(job.witness_dir),
        directives=directives(job, node_cpus), tmp_dir=job.profile.tmp_dir,
        activation=job.profile.activation, docker=launcher.is_docker, docker_bin=job.docker_bin,
        slurm_conf=job.profile.slurm_conf, master_addr_fn=MASTER_ADDR_FN,
        docker_master_addr=job.profile.docker_master_addr if launcher.is_docker else None,
        sif_sweep_fn=SWEEP_FN, sif_sweep=launcher.inner.sweep_line(),
        task_script=task_script, calls=calls,
    )


def refusal(job: JobSpec, opts, target_refusal: Optional[StepResult] = None) -> Optional[StepResult]:
    """Why this job cannot run on its cluster (checked before anything is submitted), or None. TARGET_REFUSAL is
    the target's own answer for this cluster (`Target.slurm_refusal`: a runtime its nodes lack)."""
    from envport.witness.plan import requires_gpu

    profile, spec = job.profile, job.loaded.spec
    if not job.calls:
        return StepResult("witness", Verdict.SKIPPED, "the spec declares no witnesses (or --check left none)")
    if target_refusal is not None:
        return target_refusal
    if requires_gpu(spec, opts) and not (profile.gres and "gpu" in profile.gres):
        return StepResult("slurm", Verdict.REFUSED, f"the spec asks for {spec.resources.gpus} GPU(s); cluster "
                          f"{profile.name} requests none (gres)", reason=NO_ACCELERATOR_REASON,
                          lines=["fix: use a GPU cluster profile (gres: gpu:N)"])
    if shutil.which("sbatch") is None:
        return StepResult("slurm", Verdict.REFUSED, "no sbatch on PATH", reason="no_slurm",
                          lines=["fix: run on a Slurm login node (Debian: apt-get install slurm-client)"])
    return None


def new_job_dir(profile: ClusterProfile, name: str) -> Path:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path(os.path.expanduser(profile.cache_dir)) / "jobs" / f"{name}-{stamp}-{uuid.uuid4().hex[:6]}"


def write_job(job: JobSpec, text: str) -> None:
    job.job_dir.mkdir(parents=True, exist_ok=True)
    shutil.copytree(WITNESS_DIR, job.witness_dir, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
                    dirs_exist_ok=True)
    job.script_path.write_text(text, encoding="utf-8")
    job.script_path.chmod(0o755)


# --- reading the log back --------------------------------------------------------


@dataclasses.dataclass
class Segment:
    label: str
    lines: list[str]
    rc: Optional[int] = None
    seconds: float = 0.0
    ended: bool = False


_BEGIN = re.compile(r"^envport-slurm: begin (.+)$")
_END = re.compile(r"^envport-slurm: end (.+) rc=(-?\d+) seconds=(\d+)$")


def split_log(text: str) -> dict[str, Segment]:
    """The log cut into one segment per witness call (between its begin/end markers)."""
    segments: dict[str, Segment] = {}
    current: Optional[Segment] = None
    for line in text.splitlines():
        m = _BEGIN.match(line)
        if m:
            current = segments[m.group(1)] = Segment(m.group(1), [])
            continue
        m = _END.match(line)
        if m and current is not None and m.group(1) == current.label:
            current.rc, current.seconds, current.ended = int(m.group(2)), float(m.group(3)), True
            current = None
            continue
        if current is not None:
            current.lines.append(line)
    return segments


def job_results(job: JobSpec, outcome: JobOutcome, log_text: str) -> list[StepResult]:
    spec = job.loaded.spec
    segments = split_log(log_text)
    results: list[StepResult] = []
    what = f"JobState={outcome.state} ExitCode={outcome.exit_code or '?'}"
    for call in job.calls:
        seg = segments.get(call.label)
        if seg is None:
            results += [StepResult(_step_name(call, c), Verdict.FAILED,
                                   f"not run: the job ended ({what}) before this witness started")
                        for c in call.checks]
            continue
        launched = LaunchResult(argv=["srun", call.script],
                                returncode=seg.rc if seg.ended else outcome.exit_status,
                                output="\n".join(seg.lines) + "\n", seconds=seg.seconds)
        got = call_results(spec, call, launched)
        if not seg.ended:  # scancel, the time limit, a node failure: say so before the witness's own words
            for r in got:
                if r.verdict is Verdict.FAILED:
                    r.detail = f"the job ended ({outcome.state}) while this witness ran: {r.detail}"
        results += got
    job_step = f"slurm job {outcome.job_id}"
    ok = outcome.state == "COMPLETED" and outcome.exit_status == 0
    secs = outcome.pending_s + outcome.running_s
    where = f" on {outcome.nodes}" if outcome.nodes else ""
    if ok:
        results.append(StepResult(job_step, Verdict.OK, f"{what}{where} (pending {outcome.pending_s:.0f}s, "
                                  f"ran {outcome.running_s:.1f}s)", seconds=secs))
    else:
        why = {"deadline": f"; cancelled by envport after {outcome.running_s:.0f}s running",
               "interrupt": "; cancelled by envport (interrupted)"}.get(outcome.cancelled_by_us, "")
        if outcome.state == "NODE_FAIL":
            down = ", ".join(outcome.failed_nodes) or "see `sinfo -R`"
            why += f"; a node of the job failed (Reason={outcome.reason or '?'}; {down})"
        results.append(StepResult(job_step, Verdict.FAILED, f"{what}{where}{why}; log {job.log_path}",
                                  lines=log_tail(log_text) or ["(the log is empty)"], seconds=secs))
    return results


def log_tail(text: str, n: int = 25) -> list[str]:
    """The log's last lines without the sentinel records (each check's verdict already says those)."""
    from envport.witness.scripts.envport_sentinel import PREFIX

    return tail("\n".join(ln for ln in text.splitlines() if PREFIX not in ln), n)


def _step_name(call, check: str) -> str:
    return call.step_name(check)  # the name witness.run gives it (NCCL runs say so)


PENDING_FIXES = {
    "PartitionConfig": "the request exceeds what the partition's nodes have (tasks x cpus, mem, time): lower "
                       "cpus/mem/time in the cluster profile, or ask for fewer ranks",
    "Resources": "the nodes are busy or too small right now: raise max_pending, or try later",
    "Priority": "other jobs come first: raise max_pending, or try later",
    "ReqNodeNotAvail": "the requested nodes are down, drained or reserved: check `sinfo -R`",
    "AssocMaxJobsLimit": "your account is at its job limit: wait for your other jobs",
    "QOSMaxJobsPerUserLimit": "your QOS is at its job limit: wait for your other jobs",
    "BeginTime": "the job asked to start later",
    "Dependency": "the job waits on another job",
}


def refused_pending(job: JobSpec, outcome: JobOutcome) -> StepResult:
    reason = outcome.reason or "unknown"
    fix = PENDING_FIXES.get(reason, f"see `scontrol show job` for Reason={reason}")
    return StepResult(f"slurm job {outcome.job_id}", Verdict.REFUSED,
                      f"still PENDING after {outcome.pending_s:.0f}s (Slurm Reason={reason}); cancelled after "
                      f"the cluster profile's max_pending {job.profile.max_pending:.0f}s",
                      reason="pending_timeout", lines=[f"fix: {fix}"], seconds=outcome.pending_s,
                      data={"slurm_reason": reason})


def run_job(job: JobSpec, text: str, progress: Progress = quiet, poll_s: float = POLL_S
            ) -> tuple[list[StepResult], dict]:
    """Write, submit, poll and judge one job.  Returns (results, facts for the ledger)."""
    write_job(job, text)
    progress(f"slurm: wrote {job.script_path}")
    facts: dict = {"cluster": job.profile.name, "job_dir": str(job.job_dir), "log": str(job.log_path)}
    t0 = time.monotonic()
    job_id, complaint = submit(job.script_path)
    if job_id is None:
        shutil.rmtree(job.witness_dir, ignore_errors=True)
        return [StepResult("sbatch", Verdict.REFUSED, f"Slurm refused the job: {complaint.splitlines()[-1]}",
                           reason="sbatch_rejected", lines=complaint.splitlines()[-5:] + [
                               "fix: adjust the cluster profile (partition, cpus, mem, gres, constraint, time)"],
                           seconds=time.monotonic() - t0)], facts
    facts["job_id"] = job_id
    progress(f"slurm: submitted job {job_id} ({job.job_name}, {job.ntasks} task(s)) to cluster {job.profile.name}")
    outcome = wait_for(job_id, job.profile, job.log_path, progress, poll_s=poll_s)
    facts.update({"state": outcome.state, "slurm_exit_code": outcome.exit_code, "slurm_reason": outcome.reason,
                  "nodes": outcome.nodes, "pending_s": round(outcome.pending_s, 3),
                  "running_s": round(outcome.running_s, 3), "state_from": outcome.source,
                  **({"failed_nodes": outcome.failed_nodes} if outcome.failed_nodes else {})})
    if outcome.cancelled_by_us == "pending":
        shutil.rmtree(job.witness_dir, ignore_errors=True)
        return [refused_pending(job, outcome)], facts
    try:
        log_text = job.log_path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        log_text = ""
    progress(f"slurm: job {job_id} {outcome.state} ExitCode={outcome.exit_code or '?'} "
             f"(from {outcome.source}); reading {job.log_path}")
    return job_results(job, outcome, log_text), facts

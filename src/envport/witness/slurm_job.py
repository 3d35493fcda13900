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
from typing import Literal, Optional, Sequence

import jinja2
from pydantic import BaseModel, ConfigDict, Field, field_validator

from envport.core.layout import env_prefix
from envport.core.proc import run
from envport.core.errors import EnvportError
from envport.engines.sif_run import SWEEP_FN
from envport.witness.launchers.base import WITNESS_DIR, LaunchResult
from envport.witness.launchers.docker import DockerLauncher
from envport.witness.launchers.local import LocalLauncher
from envport.witness.launchers.srun import MASTER_ADDR_FN, SrunLauncher, venv_prelude
from envport.spec.yamlfile import load_model
from envport.core.progress import Progress, quiet, tail
from envport.core.verdict import NO_ACCELERATOR_REASON, StepResult, Verdict
from envport.witness.judge import call_results

CLUSTERS_DIR = Path("slurm") / "clusters"
TARGETS = ("venv", "docker", "apptainer")
POLL_S = 1.0
# Past the job's own time limit, how long to keep polling before cancelling it ourselves.
RUN_MARGIN_S = 120.0
MARKER = "envport-slurm: "
# Slurm's words that are safe inside a #SBATCH line without quoting tricks.
_SLURM_WORD = re.compile(r"^[A-Za-z0-9_.,:@%+=/-]+$")
_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|m|h)?$")
_MEM = re.compile(r"^\d+[KMGT]?$")
# Job states after which Slurm will not run the job (any more).
DONE_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
               "BOOT_FAIL", "DEADLINE", "REVOKED", "SPECIAL_EXIT"}


# --- cluster profiles ----------------------------------------------------------


def parse_duration(value) -> float:
    """Seconds from 90, "90s", "2m", "1.5h"."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    m = _DURATION.match(str(value).strip())
    if not m:
        raise ValueError(f"{value!r} is not a duration; write seconds (90) or 90s, 2m, 1h")
    return float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, None: 1}[m.group(2)]


def slurm_time_seconds(value: str) -> float:
    """Seconds of a Slurm time limit: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS."""
    m = _TIME.match(value)
    if not m:
        raise ValueError(f"{value!r} is not a Slurm time (MM, HH:MM:SS or D-HH:MM:SS)")
    days, a, b, c = m.group(1), int(m.group(2)), m.group(3), m.group(4)
    if days is not None:  # D-HH[:MM[:SS]]
        return int(days) * 86400 + a * 3600 + int(b or 0) * 60 + int(c or 0)
    if c is not None:  # HH:MM:SS
        return a * 3600 + int(b) * 60 + int(c)
    if b is not None:  # MM:SS
        return a * 60 + int(b)
    return a * 60  # MM


class ClusterProfile(BaseModel):
    """slurm/clusters/<name>.yaml: how to get a job onto one cluster. Unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    description: str = ""
    partition: Optional[str] = Field(default=None, description="sbatch --partition")
    account: Optional[str] = Field(default=None, description="sbatch --account")
    time: str = Field(default="00:30:00", description="sbatch --time (MM, HH:MM:SS, D-HH:MM:SS)")
    gres: Optional[str] = Field(default=None, description="sbatch --gres, e.g. gpu:4")
    cpus: int = Field(default=1, ge=1, le=4096, description="sbatch --cpus-per-task")
    mem: Optional[str] = Field(default=None, description="sbatch --mem per node, e.g. 64G")
    constraint: Optional[str] = Field(default=None, description="sbatch --constraint (node features)")
    activation: list[str] = Field(default=[], description="shell lines run in the job before the tasks")
    container_runtime: Literal["docker", "apptainer", "none"] = Field(
        default="none", description="what runs container targets on the nodes")
    envs_dir: Optional[str] = Field(default=None, description="ENVPORT_ENVS_DIR of venv envs on the nodes "
                                    "(default: this shell's, else ~/.envport/envs)")
    cache_dir: str = Field(default="~/.cache/envport/slurm", description="job folders; shared with the nodes")
    tmp_dir: Optional[str] = Field(default=None, description="TMPDIR inside the job")
    max_pending: float = Field(default=600.0, gt=0, description="seconds (or 90s/10m/1h) a job may stay "
                               "PENDING before it is cancelled and REFUSED")
    slurm_conf: Optional[str] = Field(default=None, description="SLURM_CONF for every Slurm command envport runs "
                                      "and inside the job: a cluster whose slurm.conf is not the default one")
    env: dict[str, str] = Field(default={}, description="environment of every task (docker: -e), e.g. "
                                "GLOO_SOCKET_IFNAME: the interface of the network between the nodes")
    docker_master_addr: Optional[str] = Field(
        default=None, description="MASTER_ADDR of docker tasks instead of the first node's address: where "
        "`docker run --network host` puts containers in a network the nodes are not in (nodes emulated in "
        "network namespaces: dockerd's is the host's)")

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        for key in v:
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
                raise ValueError(f"{key!r} is not an environment variable name")
        return v

    @field_validator("partition", "account", "gres", "mem", "constraint")
    @classmethod
    def _slurm_word(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not _SLURM_WORD.match(v):
            raise ValueError(f"{v!r}: use letters, digits and _ . , : @ % + = / - only")
        return v

    @field_validator("mem")
    @classmethod
    def _mem(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not _MEM.match(v):
            raise ValueError(f"{v!r} is not a Slurm memory size (e.g. 4000, 16G)")
        return v

    @field_validator("time")
    @classmethod
    def _time(cls, v: str) -> str:
        slurm_time_seconds(v)
        return v

    @field_validator("max_pending", mode="before")
    @classmethod
    def _duration(cls, v):
        return parse_duration(v)

    @property
    def time_s(self) -> float:
        return slurm_time_seconds(self.time)


def packaged_clusters_dir() -> Path:
    from importlib.resources import files

    return Path(str(files("envport.slurm_files"))) / "clusters"


def templates_dir() -> Path:
    from importlib.resources import files

    return Path(str(files("envport.slurm_files")))


def cluster_names(root: Optional[Path]) -> list[str]:
    names = set()
    for d in ([root / CLUSTERS_DIR] if root else []) + [packaged_clusters_dir()]:
        if d.is_dir():
            names |= {p.stem for p in d.glob("*.yaml")}
    return sorted(names)


def load_cluster(ref: str, root: Optional[Path]) -> ClusterProfile:
    """A profile by name (the project's slurm/clusters/, then the packaged ones) or by path."""
    if ref.endswith((".yaml", ".yml")):
        path = Path(ref)
    else:
        candidates = ([root / CLUSTERS_DIR / f"{ref}.yaml"] if root else []) + \
                     [packaged_clusters_dir() / f"{ref}.yaml"]
        path = next((p for p in candidates if os.path.lexists(p)), candidates[0])
    # lexists, not is_file: a directory, FIFO or unreadable file is reported by the reader, not as missing.
    if not os.path.lexists(path):
        known = ", ".join(cluster_names(root)) or "none"
        raise EnvportError(f"cluster profile {path} not found (known: {known}); "
                           f"copy slurm/clusters/example-gpu.yaml to slurm/clusters/{ref}.yaml")
    return load_model(path, ClusterProfile, "cluster profile", "slurm/clusters/example-gpu.yaml")


# --- rendering -----------------------------------------------------------------


def _jinja() -> jinja2.Environment:
    # The renderers' environment (StrictUndefined, the shell-quoting filter, the `{##` comments
    # that leave bash's ${#a[@]} alone), reading the sbatch templates from slurm/.
    from envport.renderers import ENV

    return ENV.overlay(loader=jinja2.FileSystemLoader(str(templates_dir())))


@dataclasses.dataclass
class JobSpec:
    """Everything one witness job needs; `render` turns it into the batch script."""

    loaded: object  # loader.Loaded
    identity: object  # recipe.identity.Identity: the env this job proves, as the site built it
    profile: ClusterProfile
    target: str  # venv | docker
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
    """The launcher each witness call of the batch script uses (inside the allocation)."""
    name = job.loaded.spec.name
    if job.target == "docker":
        inner = DockerLauncher(job.image, python=job.python, docker=job.docker_bin, witness_dir=job.witness_dir,
                               gpus=bool(job.profile.gres and "gpu" in job.profile.gres))
        return SrunLauncher(inner, name, in_allocation=True, run_token=job.job_dir.name)
    if job.target == "apptainer":
        from envport.witness.launchers.sif import SifLauncher

        inner = SifLauncher(Path(job.sif), python=job.python, witness_dir=job.witness_dir,
                            gpus=bool(job.profile.gres and "gpu" in job.profile.gres),
                            runtime="apptainer" if job.profile.container_runtime == "apptainer" else "ch-run")
        return SrunLauncher(inner, name, in_allocation=True, run_token=job.job_dir.name)
    inner = LocalLauncher(f"{job.prefix}/bin/python", witness_dir=job.witness_dir, base_env={})
    return SrunLauncher(inner, name, in_allocation=True, prelude=venv_prelude(job.prefix),
                        run_token=job.job_dir.name)


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
    return _jinja().get_template("witness.sbatch.j2").render(
        name=job.loaded.spec.name, hash12=job.identity.hash12, target=job.target, cluster=job.profile.name,
        script_path=str(job.script_path), log_path=str(job.log_path), witness_dir=str(job.witness_dir),
        directives=directives(job, node_cpus), tmp_dir=job.profile.tmp_dir,
        activation=job.profile.activation, docker=job.target == "docker", docker_bin=job.docker_bin,
        slurm_conf=job.profile.slurm_conf, master_addr_fn=MASTER_ADDR_FN,
        docker_master_addr=job.profile.docker_master_addr if job.target == "docker" else None,
        sif_sweep_fn=SWEEP_FN, sif_sweep=launcher.inner.sweep_line() if job.target == "apptainer" else "",
        task_script=task_script, calls=calls,
    )


def refusal(job: JobSpec, opts) -> Optional[StepResult]:
    """Why this job cannot run on its cluster (checked before anything is submitted), or None."""
    from envport.witness.plan import requires_gpu

    profile, spec = job.profile, job.loaded.spec
    if not job.calls:
        return StepResult("witness", Verdict.SKIPPED, "the spec declares no witnesses (or --check left none)")
    if job.target == "docker" and profile.container_runtime != "docker":
        return StepResult("slurm", Verdict.REFUSED, f"cluster {profile.name} runs containers with "
                          f"{profile.container_runtime}, not docker", reason="no_container_runtime",
                          lines=["fix: --target venv, or set container_runtime: docker in the profile"])
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


# --- submitting and polling ----------------------------------------------------


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


# --- a SIF build job -----------------------------------------------------------------


def render_sif_build(name: str, hash12: str, profile: ClusterProfile, job_dir: Path, context: Path, def_name: str,
                     sif: Path) -> str:
    """The batch script that builds SIF with `apptainer build [--fakeroot]` on a node, APPTAINER_CACHEDIR and
    APPTAINER_TMPDIR under the cluster profile's cache_dir and tmp_dir."""
    cache = Path(os.path.expanduser(profile.cache_dir))
    directives = [("--job-name", f"envport-sif-{name}"), ("--output", str(job_dir / "job.log")), ("--ntasks", "1"),
                  ("--cpus-per-task", str(profile.cpus)), ("--time", profile.time)]
    for flag, value in (("--partition", profile.partition), ("--account", profile.account),
                        ("--mem", profile.mem), ("--constraint", profile.constraint)):
        if value:
            directives.append((flag, value))
    return _jinja().get_template("sif-build.sbatch.j2").render(
        name=name, hash12=hash12, cluster=profile.name, directives=directives, context=str(context),
        def_name=def_name, sif=str(sif), sif_dir=str(sif.parent), partial=str(sif.parent / f".{sif.name}.partial"),
        cache_dir=str(cache / "apptainer-cache"), tmp_dir=str(Path(profile.tmp_dir or cache) / "apptainer-tmp"),
        activation=profile.activation, script_path=str(job_dir / "job.sbatch"), log_path=str(job_dir / "job.log"))

"""Run witnesses as Slurm tasks: `srun` around a local (venv) or docker launcher.

srun starts one process per rank, so `spawns_ranks` is False and dist.py runs
just the rank its environment names.  A small per-task bash wrapper maps
Slurm's identity to torch's, enroot-style:

    SLURM_PROCID -> RANK, SLURM_LOCALID -> LOCAL_RANK, SLURM_NTASKS -> WORLD_SIZE,
    SLURM_NODEID -> NODE_RANK,
    MASTER_ADDR  = first host of `scontrol show hostnames $SLURM_STEP_NODELIST`, its
                   NodeAddr where the name does not resolve
                   (unless the batch script already exported it),
    MASTER_PORT  = one free port per job, chosen once before the tasks start
                   (by the batch script, or here for a direct srun).

With a docker inner launcher each rank's container is named
`envport-<name>-$SLURM_JOB_ID-$SLURM_PROCID` and labelled with the job and
this run, and the wrapper removes it when Slurm signals the task (scancel,
--kill-on-bad-exit, the time limit): a killed docker client alone would leave
the container running (measured).

`srun -n 4` on a 2-CPU node pends forever (Reason=PartitionConfig), so
`--overcommit` is added when more tasks than a node's CPUs are asked for
outside an allocation; inside one (a batch script) sbatch's own
`--overcommit` already covers the steps.
"""

from __future__ import annotations

import os
import shlex
import uuid
from typing import Mapping, Optional, Sequence

from envport.core.verdict import StepResult, Verdict
from envport.witness.launchers.base import Invocation, Launcher
from envport.witness.scripts.envport_sentinel import free_port
from envport.witness.launchers.docker import DockerLauncher

# master_addr NODELIST: the first host of the allocation, as an address the ranks can reach: its
# name where the name resolves, else the node's NodeAddr from slurm.conf (`scontrol show node`):
# nodes named node1, node2 with only addresses in slurm.conf (the netns cluster of the tests).
MASTER_ADDR_FN = [
    "master_addr() {",
    '  local first addr',
    '  first=$(scontrol show hostnames "$1" | head -n 1)',
    '  if getent hosts "$first" >/dev/null 2>&1; then echo "$first"; return 0; fi',
    '  addr=$(scontrol show node "$first" 2>/dev/null | sed -n \'s/.*NodeAddr=\\([^ ]*\\).*/\\1/p\' | head -n 1)',
    '  echo "${addr:-$first}"',
    "}",
]

RANK_MAP = [
    'export RANK="$SLURM_PROCID" LOCAL_RANK="$SLURM_LOCALID" WORLD_SIZE="$SLURM_NTASKS" NODE_RANK="$SLURM_NODEID"',
    'if [ -z "${MASTER_ADDR:-}" ]; then',
    *("  " + line for line in MASTER_ADDR_FN),
    '  MASTER_ADDR=$(master_addr "${SLURM_STEP_NODELIST:-$SLURM_JOB_NODELIST}")',
    "  export MASTER_ADDR",
    "fi",
]

# The docker task: run the client in the background so a trapped TERM can
# remove this rank's container by name before the task ends.
DOCKER_TASK = [
    'name="$1-${SLURM_JOB_ID}-${SLURM_PROCID}"; docker=$2; shift 2',
    '"$docker" run --name "$name" --label "envport.slurm-job=${SLURM_JOB_ID}" '
    '-e RANK -e LOCAL_RANK -e WORLD_SIZE -e NODE_RANK -e SLURMD_NODENAME -e MASTER_ADDR -e MASTER_PORT "$@" &',
    "pid=$!",
    "trap 'trap - TERM INT HUP; \"$docker\" rm -f \"$name\" >/dev/null 2>&1; wait \"$pid\"; exit 143' TERM INT HUP",
    'wait "$pid"',
]

_NAME_PLACEHOLDER = "@ENVPORT-CONTAINER@"


def venv_prelude(prefix: str) -> list[str]:
    """Shell lines that activate a venv/conda env built by setup-*.sh (its env block, then bin/ first)."""
    p = shlex.quote(prefix)
    return [
        f"if [ ! -x {p}/bin/python ]; then echo \"envport-srun: no env at \"{p}\" on $(hostname)\" >&2; exit 3; fi",
        f"if [ -f {p}/.envport/env.sh ]; then . {p}/.envport/env.sh; fi",
        f"export VIRTUAL_ENV={p} PATH={p}/bin:\"$PATH\"",
    ]


def node_cpus(partition: Optional[str] = None, timeout: float = 15) -> Optional[int]:
    """The most CPUs one node of the partition has (sinfo), or None when Slurm does not say."""
    argv = ["sinfo", "-h", "-o", "%c"] + (["-p", partition] if partition else [])
    from envport.core.proc import run

    out = run(argv, timeout=timeout)
    if out.returncode is None:
        return None
    nums = [int(x) for x in out.stdout.split() if x.strip().rstrip("+").isdigit()]
    return max(nums) if nums else None


def world_of(script: str, args: Sequence[str]) -> int:
    """Ranks a witness call needs: dist.py's --world-size, else one task."""
    if script != "dist.py":
        return 1
    args = list(args)
    for i, a in enumerate(args):
        if a == "--world-size" and i + 1 < len(args):
            return max(1, int(args[i + 1]))
        if a.startswith("--world-size="):
            return max(1, int(a.split("=", 1)[1]))
    return 1


class SrunLauncher(Launcher):
    """srun around an inner launcher (LocalLauncher for venv/conda envs, DockerLauncher for images)."""

    name = "srun"
    spawns_ranks = False

    def __init__(self, inner: Launcher, env_name: str, *, in_allocation: Optional[bool] = None,
                 prelude: Sequence[str] = (), job_options: Sequence[str] = (), job_name: Optional[str] = None,
                 partition: Optional[str] = None, overcommit: Optional[bool] = None,
                 kill_on_bad_exit: bool = True, wait_s: int = 60, srun: str = "srun",
                 run_token: Optional[str] = None):
        self.inner = inner
        self.env_name = env_name
        # Inside an allocation (a batch script) srun starts a step; outside it starts a job.
        self.in_allocation = bool(os.environ.get("SLURM_JOB_ID")) if in_allocation is None else in_allocation
        self.prelude = list(prelude)  # per-task shell lines before the witness (env activation)
        self.job_options = list(job_options)  # --partition/--time/... used only outside an allocation
        self.partition = partition
        self.token = run_token or uuid.uuid4().hex[:10]
        self.job_name = job_name or f"envport-{env_name}-{self.token}"
        self.overcommit = overcommit  # None: decide from the node's CPUs (outside an allocation)
        self.kill_on_bad_exit = kill_on_bad_exit
        self.wait_s = wait_s  # after the first task ends, the rest get this long (srun --wait)
        self.srun = srun
        self._node_cpus: Optional[int] = None

    @property
    def is_docker(self) -> bool:
        return isinstance(self.inner, DockerLauncher)

    def witness_path(self, script: str) -> str:
        return self.inner.witness_path(script)

    def needs_overcommit(self, ntasks: int) -> bool:
        if self.overcommit is not None:
            return self.overcommit
        if self.in_allocation:
            return False
        if self._node_cpus is None:
            self._node_cpus = node_cpus(self.partition) or 0
        return bool(self._node_cpus) and ntasks > self._node_cpus

    def srun_options(self, ntasks: int) -> list[str]:
        opts = [f"--ntasks={ntasks}", f"--wait={self.wait_s}"]
        if self.kill_on_bad_exit:
            opts.append("--kill-on-bad-exit=1")
        if self.needs_overcommit(ntasks):
            opts.append("--overcommit")
        if self.in_allocation:
            # The batch script's steps run one after another, yet the next one may be asked for before
            # Slurm has released the last one's CPUs: without --overlap srun then waits ("step creation
            # temporarily disabled") for a wake-up that slurmctld sends to srun's host name; where that
            # name does not reach srun (nodes in network namespaces) the wait was 2 minutes, measured.
            opts.append("--overlap")
        else:
            opts += [f"--job-name={self.job_name}"] + self.job_options
        return opts

    def task_script(self, env: Mapping[str, str]) -> str:
        lines = ["set -u"] + RANK_MAP + self.prelude
        if self.is_docker:
            lines += DOCKER_TASK
        else:
            if env:
                lines.append("export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items())))
            lines.append('exec "$@"')
        return "\n".join(lines)

    def command(self, script: str, args: Sequence[str], env: Mapping[str, str]) -> list[str]:
        """The srun argv (no host environment needed beyond MASTER_PORT): what a batch script runs."""
        ntasks = world_of(script, args)
        head = [self.srun, *self.srun_options(ntasks), "bash", "-c", self.task_script(env), "envport-task"]
        if self.is_docker:
            d: DockerLauncher = self.inner  # type: ignore[assignment]
            run_args = d.run_args(_NAME_PLACEHOLDER, env)
            i = run_args.index("--name")
            run_args = run_args[1:i] + run_args[i + 2:]  # drop "run" and the per-call name
            tail = [f"envport-{self.env_name}", d.docker, "--label", f"envport.run={self.token}", *run_args,
                    d.image, d.python, d.witness_path(script), *args]
        else:
            tail = self.inner.invocation(script, args, env).argv
        return head + tail

    def invocation(self, script: str, args: Sequence[str], env: Mapping[str, str]) -> Invocation:
        argv = self.command(script, args, env)
        host_env = self.inner.invocation(script, args, env).env if not self.is_docker else None
        host_env = dict(os.environ if host_env is None else host_env)
        if not host_env.get("MASTER_PORT"):
            host_env["MASTER_PORT"] = str(free_port())  # one per job: every task inherits it
        cleanup = []
        if not self.in_allocation:
            cleanup.append(["scancel", f"--name={self.job_name}"])
        if self.is_docker:
            d: DockerLauncher = self.inner  # type: ignore[assignment]
            cleanup.append(["bash", "-c", f"{shlex.quote(d.docker)} ps -aq --filter label=envport.run={self.token}"
                            f" | xargs -r {shlex.quote(d.docker)} rm -f"])
        return Invocation(argv, env=host_env, cleanup=cleanup, label=self.job_name)

    def preflight(self) -> Optional[StepResult]:
        import shutil

        if shutil.which(self.srun) is None:
            return StepResult("launcher", Verdict.REFUSED, f"no {self.srun} on PATH", reason="no_slurm",
                              lines=["fix: run on a Slurm login node (Debian: apt-get install slurm-client)"])
        return self.inner.preflight()

    def describe(self) -> str:
        return f"srun ({self.inner.describe()})"

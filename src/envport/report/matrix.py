"""The (env, target) matrix: every spec × target, what each pair needs, and whether this host can run it.

A pair is one spec on one target: `docker`, `apptainer`, `venv`, `conda`, or
`ssh` (a venv on an SSH site host, one pair per host of the site profile, the
way `envport parity` names them: `venv@HOST`). `pairs()` is pure planning;
`judge()` asks this host, through the probes the commands already use
(builders/preflight.py's runtime, GPU and compiler checks, the docker engine,
the apptainer route of builders/apptainer, the SIF runtime of engines/sif_run,
one SSH round trip), and every need it reports was checked — a need this host
cannot check is said to be unchecked, never OK. The run (`envport matrix
--run`) turns each runnable pair into `envport up`; `junit_xml()` and
`summary_md()` write what those runs returned.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional
from xml.etree import ElementTree as ET

from envport.report.junit import failure, finished, step_case
from envport.targets.base import Need, NeedsRequest
from envport.targets.needs import Probes, base_of, gpu_need, no_host_need, preflight_context
from envport.targets.registry import matrix_rows, row_target, ssh_rows

__all__ = ["Need", "Probes", "base_of"]  # where report/workflow.py and the tests have always found them

TARGETS = matrix_rows()
UP_STEPS = ("preflight", "build", "weights", "verify", "witness")


@dataclass(frozen=True)
class Pair:
    env: str
    target: str  # one of TARGETS
    host: Optional[str] = None  # ssh: the site host

    @property
    def label(self) -> str:
        return f"{self.env} {'venv@' + self.host if self.host else self.target}"

    @property
    def key(self) -> str:
        """A file-name-safe id: demo-cpu-docker, demo-cpu-ssh-test."""
        return f"{self.env}-{self.target}" + (f"-{self.host}" if self.host else "")

    def up_args(self) -> list[str]:
        """`envport up` arguments for the pair."""
        if self.target in ssh_rows():
            return ["up", self.env, "--target", row_target(self.target).name, "--host", self.host or ""]
        return ["up", self.env, "--target", self.target]

    @property
    def lock(self) -> Optional[str]:
        return row_target(self.target).engine_lock


@dataclass
class Judged:
    pair: Pair
    needs: list[Need] = field(default_factory=list)
    gpus: int = 0

    @property
    def runnable(self) -> bool:
        return all(n.ok is not False for n in self.needs)

    @property
    def why_not(self) -> str:
        """Every unmet need as `reason: what: detail (fix: ...)`; empty when runnable."""
        return "; ".join(f"{n.reason}: {n.what}: {n.detail}" + (f" (fix: {n.fix})" if n.fix else "")
                         for n in self.needs if n.ok is False)

    def to_dict(self) -> dict:
        return {"env": self.pair.env, "target": self.pair.target, "host": self.pair.host, "label": self.pair.label,
                "gpus": self.gpus, "runnable": self.runnable, "why_not": self.why_not,
                "up": ["envport", *self.pair.up_args()], "needs": [n.to_dict() for n in self.needs]}


# --- planning (pure) -------------------------------------------------------------


def pairs(names: list[str], site, targets: tuple[str, ...] = TARGETS) -> list[Pair]:
    """Every name × target in the order given; `ssh` once per host of the site profile (or once, hostless)."""
    out = []
    for name in names:
        for t in targets:
            if t in ssh_rows():
                hosts = sorted(site.hosts) or [None]
                out.extend(Pair(name, t, h) for h in hosts)
            else:
                out.append(Pair(name, t))
    return out


# --- judging (asks this host) -----------------------------------------------------


def judge(loaded, pair: Pair, site, root, probes: Optional[Probes] = None, gpu_inventory=None) -> Judged:
    """What PAIR needs and, for each need, whether this host has it (checked, or said unchecked)."""
    probes = probes or Probes(site, root)
    spec = loaded.spec
    j = Judged(pair, gpus=spec.resources.gpus)
    target = row_target(pair.target)
    req = NeedsRequest(loaded, site, root, probes, host=pair.host, gpu_inventory=gpu_inventory)
    if pair.target in ssh_rows() and pair.host is None:
        j.needs.append(no_host_need(site))
    else:
        j.needs.extend(target.needs(req))
    j.needs.extend(gpu_need(loaded, preflight_context(req, target)))
    return j


# --- what a run wrote -------------------------------------------------------------


@dataclass
class PairRun:
    """One pair's `envport up` (or why it was not run)."""

    judged: Judged
    exit_code: Optional[int] = None  # None: not run
    steps: list[dict] = field(default_factory=list)  # up --json steps
    seconds: float = 0.0
    size: Optional[int] = None  # image / SIF / env bytes
    where: str = ""  # image tag, SIF path or env prefix
    error: str = ""  # the run's own failure (no JSON), with its stderr tail
    reason: str = ""  # the run's own failure as a token (a Slurm task's TIMEOUT: slurm_timeout)
    lines: list[str] = field(default_factory=list)  # the run's own failure: its log's last lines
    ran_on: str = ""  # where it ran when not on this host: "Slurm job 21_3 on node2"
    slurm: dict = field(default_factory=dict)  # a Slurm task's facts: array, index, job_id, state, nodes

    @property
    def verdict(self) -> str:
        if self.exit_code is None:
            return "skipped"
        if self.exit_code == 0:
            return "OK"
        bad = next((s for s in self.steps if s.get("verdict") in ("FAILED", "REFUSED")), None)
        return bad["verdict"] if bad else "REFUSED" if self.exit_code == 3 else "FAILED"

    @property
    def detail(self) -> str:
        if self.exit_code is None:
            return self.judged.why_not
        if self.error:
            return self.error.splitlines()[0] + (f" [{self.reason}]" if self.reason else "")
        bad = next((s for s in self.steps if s.get("verdict") in ("FAILED", "REFUSED")), None)
        if bad:
            return f"{bad['step']}: {bad.get('detail', '')}" + (f" [{bad['reason']}]" if bad.get("reason") else "")
        return "every step ok"


def junit_xml(runs: list[PairRun]) -> bytes:
    """One <testcase> per pair and `up` step: a FAILED step a <failure>, a REFUSED one a <failure
    type="REFUSED">, a step not run (pair unrunnable, or after the first failure) a <skipped> with why.
    A run that ended without reporting its steps (no JSON; a Slurm task's TIMEOUT or lost node) fails
    at its first unreported step, with its reason and log tail: a pair that broke is never all skips."""
    suite = ET.Element("testsuite", name="envport-matrix")
    counts = {"tests": 0, "failures": 0, "skipped": 0}
    total = 0.0
    for run in runs:
        steps = {s["step"]: s for s in run.steps}
        broke = run.exit_code not in (None, 0) and bool(run.error)
        for step in UP_STEPS:
            case = ET.SubElement(suite, "testcase", classname=f"matrix.{run.judged.pair.key}", name=step)
            counts["tests"] += 1
            s = steps.get(step)
            if s is None and broke:
                failure(case, "REFUSED" if run.verdict == "REFUSED" else "FAILED",
                         f"the run ended before this step reported: {run.detail}", run.lines)
                counts["failures"] += 1
                broke = False  # the steps after it were never reached: skipped
            elif s is None:
                why = run.judged.why_not if run.exit_code is None else (run.error or "no result for this step")
                ET.SubElement(case, "skipped", message=f"not run: {why}"[:2000])
                counts["skipped"] += 1
            else:
                total += float(s.get("seconds") or 0)
                kind = step_case(case, s)
                if kind:
                    counts[kind] += 1
    return finished(suite, counts, total)


def human_size(n: Optional[int]) -> str:
    from envport.core.progress import human_size as size

    return "-" if n is None else size(n)


def summary_md(runs: list[PairRun], wall_s: Optional[float] = None, jobs: Optional[int] = None) -> str:
    """The markdown table: pair, verdict, seconds, size, and the detail (the reason for a skip)."""
    lines = ["| pair | verdict | seconds | size | detail |", "|---|---|---:|---:|---|"]
    for r in runs:
        secs = f"{r.seconds:.1f}" if r.exit_code is not None else "-"
        detail = (r.detail + (f" ({r.ran_on})" if r.ran_on else "")).replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {r.judged.pair.label} | {r.verdict} | {secs} | {human_size(r.size)} | {detail} |")
    ran = [r for r in runs if r.exit_code is not None]
    tail = (f"{len(ran)} pair(s) run, {sum(r.exit_code == 0 for r in ran)} ok, "
            f"{sum(r.exit_code not in (None, 0) for r in ran)} not ok, {len(runs) - len(ran)} skipped")
    if wall_s is not None:
        tail += f"; wall {wall_s:.1f} s" + (f" with --jobs {jobs}" if jobs else "")
    return "\n".join(["# envport matrix", "", *lines, "", tail, ""])

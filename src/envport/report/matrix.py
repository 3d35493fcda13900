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

import os
import shutil
from dataclasses import dataclass, field
from typing import Optional
from xml.etree import ElementTree as ET

TARGETS = ("docker", "apptainer", "venv", "conda", "ssh")
UP_STEPS = ("preflight", "build", "weights", "verify", "witness")
# Pairs that hold this lock run one at a time: two docker builds share one engine.
ENGINE_LOCK = "docker engine"


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
        if self.target == "ssh":
            return ["up", self.env, "--target", "venv", "--host", self.host or ""]
        return ["up", self.env, "--target", self.target]

    @property
    def lock(self) -> Optional[str]:
        return ENGINE_LOCK if self.target == "docker" else None


@dataclass
class Need:
    what: str  # "docker engine", "base image envport/debian-bookworm:base", "1 GPU(s) in sm_80..sm_90"
    ok: Optional[bool]  # None: not checked here (said so in detail)
    detail: str = ""
    reason: str = ""
    fix: str = ""

    def to_dict(self) -> dict:
        d = {"what": self.what, "ok": self.ok, "detail": self.detail}
        if self.reason:
            d["reason"] = self.reason
        if self.fix:
            d["fix"] = self.fix
        return d


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
            if t == "ssh":
                hosts = sorted(site.hosts) or [None]
                out.extend(Pair(name, t, h) for h in hosts)
            else:
                out.append(Pair(name, t))
    return out


def base_of(loaded, site, target: str):
    """The resolved plan's BaseStep (image, bootstrap, bootstrap_from) as this site builds the target."""
    from envport.plan.steps import BaseStep
    from envport.recipe.identity import resolve

    return next(s for s in resolve(loaded, site, target).plan.steps if isinstance(s, BaseStep))


# --- judging (asks this host) -----------------------------------------------------


class Probes:
    """The host facts several pairs share, each asked once per judge run."""

    def __init__(self, site, root):
        self.site, self.root = site, root
        self._memo: dict = {}

    def _once(self, key, fn):
        if key not in self._memo:
            self._memo[key] = fn()
        return self._memo[key]

    def engine(self) -> Optional[str]:
        """None when the docker engine answers, else why not."""
        from envport.engines.docker import engine_problem

        if shutil.which("docker") is None:
            return "no docker client on PATH"
        return self._once("engine", lambda: engine_problem(timeout=5))

    def has_image(self, image: str) -> bool:
        from envport.engines.docker import image_exists

        return self._once(("image", image), lambda: image_exists(image))

    def ssh(self, host: str, env: str) -> tuple[Optional[int], str]:
        from envport.engines.ssh import prefix_expr, probe_env, resolve_host

        return self._once(("ssh", host), lambda: probe_env(resolve_host(self.site, host), prefix_expr(env)))


def _findings(what: str, check, ctx) -> list[Need]:
    """A preflight check's problems (builders/preflight.py) as unmet needs."""
    return [Need(what, False, f.evidence, f.reason, f.fix) for f in check(ctx) if f.is_problem]


def _gpu_need(loaded, ctx) -> list[Need]:
    from envport.builders.preflight import check_gpus

    spec = loaded.spec
    if spec.resources.gpus <= 0:
        return []
    what = f"{spec.resources.gpus} GPU(s)" + (f" in {spec.sm_range[0]}..{spec.sm_range[1]}" if spec.sm_range else "")
    bad = _findings(what, check_gpus, ctx)
    return bad[:1] or [Need(what, True, "nvidia-smi lists them" + (" inside sm_range" if spec.sm_range else ""))]


def _base_need(loaded, site, target: str, probes: Probes) -> Need:
    from envport.builders.apptainer.bootstrap import base_fix

    base = base_of(loaded, site, target)
    what = f"base image {base.image}"
    if target == "apptainer" and base.bootstrap == "localimage":
        ok = os.path.exists(base.bootstrap_from)
        return Need(what, ok, f"local SIF/sandbox {base.bootstrap_from}" + ("" if ok else " is missing"),
                    "" if ok else "base_image_missing", "" if ok else f"fix local_images in sites/{site.name}.yaml")
    problem = probes.engine()
    if problem is not None:
        return Need(what, None, f"not checked: no docker engine answers ({problem})")
    if probes.has_image(base.image):
        return Need(what, True, "in the local docker engine")
    if site.registry and not base.image.startswith("envport/"):
        return Need(what, None, f"not local; site {site.name!r} pulls it at build time (the registry is not "
                    "checked here)")
    return Need(what, False, f"not in the local docker engine and site {site.name!r} cannot pull it",
                "base_image_missing", base_fix(base.image, site))


def judge(loaded, pair: Pair, site, root, probes: Optional[Probes] = None, gpu_inventory=None) -> Judged:
    """What PAIR needs and, for each need, whether this host has it (checked, or said unchecked)."""
    from envport.builders.preflight import Context, check_compiler, check_runtime

    probes = probes or Probes(site, root)
    spec = loaded.spec
    j = Judged(pair, gpus=spec.resources.gpus)
    target = "venv" if pair.target == "ssh" else pair.target
    ctx = Context(spec, target, host=pair.host, project_root=root, gpu_inventory=gpu_inventory)
    if pair.target == "docker":
        j.needs.extend(_engine_need(ctx, "answers"))
        j.needs.append(_base_need(loaded, site, "docker", probes))
    elif pair.target == "apptainer":
        j.needs.extend(_apptainer_needs(loaded, site, probes, Context(spec, "docker", project_root=root)))
    elif pair.target == "ssh":
        j.needs.append(_ssh_need(pair, spec.name, site, probes))
    else:
        have = {"venv": f"python{spec.python}", "conda": "micromamba, mamba or conda"}[target]
        j.needs.extend(_findings(have, check_runtime, ctx) or [Need(have, True, "on PATH")])
        j.needs.extend(_findings("C compiler", check_compiler, ctx))
    j.needs.extend(_gpu_need(loaded, ctx))
    return j


def _engine_need(docker_ctx, ok_detail: str) -> list[Need]:
    """The docker client and engine, as preflight judges them for --target docker."""
    from envport.builders.preflight import check_runtime

    return _findings("docker engine", check_runtime, docker_ctx) or [Need("docker engine", True, ok_detail)]


def _apptainer_needs(loaded, site, probes: Probes, docker_ctx) -> list[Need]:
    from envport.builders.apptainer.binary import apptainer_binary
    from envport.builders.apptainer.builder import builder_missing
    from envport.engines import sif_run

    needs = []
    binary = apptainer_binary()
    if binary and os.environ.get("ENVPORT_SIF_BUILDER") != "envport":
        needs.append(Need("SIF builder", True, f"apptainer ({binary})"))
    else:
        missing = builder_missing()
        if missing:
            reason, detail, fix = missing
            needs.append(Need("SIF builder", False, f"no apptainer, and {detail}", reason, fix))
        else:
            needs.append(Need("SIF builder", True, "envport's .def builder (root, mksquashfs, bwrap)"))
    base = base_of(loaded, site, "apptainer")
    if base.bootstrap in ("docker-daemon", "docker") and not (binary and base.bootstrap == "docker"):
        needs.extend(_engine_need(docker_ctx, "answers (the base rootfs comes from it)"))
    needs.append(_base_need(loaded, site, "apptainer", probes))
    kind = sif_run.runtime()
    absent = sif_run.missing_tools(kind)
    needs.append(Need("SIF runtime", not absent, kind if not absent else f"{', '.join(absent)} not found "
                      "(verify and witness run inside the SIF with apptainer, else ch-run on squashfuse)",
                      "" if not absent else "missing_tool",
                      "" if not absent else "apt-get install charliecloud-runtime squashfuse fuse3, or install "
                      "apptainer"))
    return needs


def _ssh_need(pair: Pair, name: str, site, probes: Probes) -> Need:
    from envport.engines.ssh import is_unreachable

    if pair.host is None:
        return Need("SSH host", False, f"site {site.name!r} names no hosts", "no_ssh_host",
                    f"add one under hosts: in sites/{site.name}.yaml")
    if shutil.which("ssh") is None:
        return Need(f"SSH host {pair.host}", False, "no ssh client on PATH", "runtime_missing",
                    "apt-get install openssh-client")
    rc, out = probes.ssh(pair.host, name)
    if rc is None or is_unreachable(rc, out) or rc != 0:
        last = out.strip().splitlines()[-1] if out.strip() else f"ssh exited {rc}"
        return Need(f"SSH host {pair.host}", False, f"does not answer: {last}", "ssh_unreachable",
                    f"check the host and its sshd, and hosts.{pair.host} in sites/{site.name}.yaml")
    return Need(f"SSH host {pair.host}", True, "answers (its python and disk are checked by the build there)")


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

    @property
    def verdict(self) -> str:
        if self.exit_code is None:
            return "skipped"
        if self.exit_code == 0:
            return "OK"
        bad = next((s for s in self.steps if s.get("verdict") in ("FAILED", "REFUSED")), None)
        return bad["verdict"] if bad else "FAILED"

    @property
    def detail(self) -> str:
        if self.exit_code is None:
            return self.judged.why_not
        if self.error:
            return self.error.splitlines()[0] if self.error else ""
        bad = next((s for s in self.steps if s.get("verdict") in ("FAILED", "REFUSED")), None)
        if bad:
            return f"{bad['step']}: {bad.get('detail', '')}" + (f" [{bad['reason']}]" if bad.get("reason") else "")
        return "every step ok"


def junit_xml(runs: list[PairRun]) -> bytes:
    """One <testcase> per pair and `up` step: a FAILED step a <failure>, a REFUSED one a <failure
    type="REFUSED">, a step not run (pair unrunnable, or after the first failure) a <skipped> with why."""
    suite = ET.Element("testsuite", name="envport-matrix")
    counts = {"tests": 0, "failures": 0, "skipped": 0}
    total = 0.0
    for run in runs:
        steps = {s["step"]: s for s in run.steps}
        for step in UP_STEPS:
            case = ET.SubElement(suite, "testcase", classname=f"matrix.{run.judged.pair.key}", name=step)
            counts["tests"] += 1
            s = steps.get(step)
            if s is None:
                why = run.judged.why_not if run.exit_code is None else (run.error or "no result for this step")
                ET.SubElement(case, "skipped", message=f"not run: {why}"[:2000])
                counts["skipped"] += 1
                continue
            case.set("time", f"{float(s.get('seconds') or 0):.3f}")
            total += float(s.get("seconds") or 0)
            verdict = s.get("verdict")
            message = s.get("detail", "") + (f" [{s['reason']}]" if s.get("reason") else "")
            if verdict in ("FAILED", "REFUSED"):
                el = ET.SubElement(case, "failure", type=verdict, message=message[:2000])
                el.text = "\n".join(s.get("lines") or [])
                counts["failures"] += 1
            elif verdict == "skipped":
                ET.SubElement(case, "skipped", message=message[:2000] or "skipped")
                counts["skipped"] += 1
            else:
                ET.SubElement(case, "system-out").text = f"{verdict}: {message}"
    for k, v in counts.items():
        suite.set(k, str(v))
    suite.set("errors", "0")
    suite.set("time", f"{total:.3f}")
    ET.indent(suite)
    return ET.tostring(suite, encoding="utf-8", xml_declaration=True) + b"\n"


def human_size(n: Optional[int]) -> str:
    if n is None:
        return "-"
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


def summary_md(runs: list[PairRun], wall_s: Optional[float] = None, jobs: Optional[int] = None) -> str:
    """The markdown table: pair, verdict, seconds, size, and the detail (the reason for a skip)."""
    lines = ["| pair | verdict | seconds | size | detail |", "|---|---|---:|---:|---|"]
    for r in runs:
        secs = f"{r.seconds:.1f}" if r.exit_code is not None else "-"
        detail = r.detail.replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {r.judged.pair.label} | {r.verdict} | {secs} | {human_size(r.size)} | {detail} |")
    ran = [r for r in runs if r.exit_code is not None]
    tail = (f"{len(ran)} pair(s) run, {sum(r.exit_code == 0 for r in ran)} ok, "
            f"{sum(r.exit_code not in (None, 0) for r in ran)} not ok, {len(runs) - len(ran)} skipped")
    if wall_s is not None:
        tail += f"; wall {wall_s:.1f} s" + (f" with --jobs {jobs}" if jobs else "")
    return "\n".join(["# envport matrix", "", *lines, "", tail, ""])

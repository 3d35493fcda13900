"""Preflight: cheap local checks, before anything large is built or downloaded.

A machine that cannot run an env learns so in a second rather than after
16 GB (seed 002). Every check is a small function returning Findings: a
problem is a stable reason token with its fix and refuses; a note (a small
/dev/shm, a size never measured here) is printed and refuses nothing. The
shape is the doctor's: a list of checks, each with a fix.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from envport.builders import weights as weights_mod
from envport.core.layout import env_prefix
from envport.core.verdict import NO_ACCELERATOR_REASON, StepResult, Verdict
from envport.spec.model import Spec
from envport.spec.venv_needs import host_venv_missing

GiB = 2**30
# Kept free beyond the estimate: a build's temporary files, pip's unpacked wheels, logs.
DEFAULT_MARGIN_GB = 1.0
SMALL_SHM_GIB = 1.0
# System packages that mean "a phase compiles C/C++": on a host target the host must have the compiler.
COMPILER_PKGS = frozenset({"build-essential", "gcc", "g++", "clang", "cmake", "ninja-build", "make"})


@dataclass(frozen=True)
class Finding:
    reason: str  # stable token; empty for a note
    message: str
    fix: str = ""

    @property
    def is_problem(self) -> bool:
        return bool(self.reason)

    def line(self) -> str:
        if not self.is_problem:
            return f"note: {self.message}"
        return f"{self.reason}: {self.message}" + (f" (fix: {self.fix})" if self.fix else "")


@dataclass
class Context:
    spec: Spec
    target: str  # docker | apptainer | venv | conda
    host: Optional[str] = None  # venv/conda over SSH: the host's own checks happen in its build
    weights_root: Path = field(default_factory=weights_mod.weights_root)
    env_bytes: Optional[int] = None  # the env's size when this host built it before (the ledger), else None
    margin_gb: float = DEFAULT_MARGIN_GB
    project_root: Optional[Path] = None
    # Injected by tests only where no real part exists (a GPU on a GPU-less host): nvidia-smi's view.
    gpu_inventory: Optional[Callable[[], dict]] = None


def check_disk(ctx: Context) -> list[Finding]:
    needs: dict[int, list] = {}  # device -> [free bytes, needed bytes, where]

    def want(path: Path, n: int, what: str) -> None:
        p = Path(path)
        while not p.exists() and p != p.parent:
            p = p.parent
        dev = os.stat(p).st_dev
        slot = needs.setdefault(dev, [shutil.disk_usage(p).free, 0, str(p), []])
        slot[1] += n
        slot[3].append(what)

    notes = []
    if ctx.target in ("venv", "conda") and ctx.host:
        pass  # the env's disk is the remote host's; its setup script finds out there
    else:
        where = {"docker": Path("/var/lib/docker"), "apptainer": (ctx.project_root or Path.cwd()) / ".cache",
                 "venv": env_prefix(ctx.spec.name).parent, "conda": Path.home()}[ctx.target]
        if ctx.env_bytes is None:
            notes.append(Finding("", f"{ctx.spec.name}'s {ctx.target} size was never measured on this host; "
                                 "only the weights and the margin are counted"))
        want(where, ctx.env_bytes or 0, f"the {ctx.target} env")
    missing = weights_mod.missing_bytes(ctx.spec, ctx.weights_root)
    if missing:
        want(ctx.weights_root, missing, "the weights not yet on disk")
    out = []
    for free, need, where, what in needs.values():
        need_total = need + int(ctx.margin_gb * GiB)
        if free < need_total:
            out.append(Finding("disk_low", f"{free / GiB:.1f} GiB free at {where}; {' and '.join(what)} need "
                               f"~{need / GiB:.2f} GiB plus a {ctx.margin_gb:g} GiB margin",
                               f"free space at {where}, or point ENVPORT_ENVS_DIR / ENVPORT_WEIGHTS_DIR at a "
                               "larger disk"))
    return out + notes


def check_runtime(ctx: Context) -> list[Finding]:
    t = ctx.target
    if t == "docker":
        if shutil.which("docker") is None:
            return [Finding("runtime_missing", "no docker client on PATH",
                            "install docker (Debian: apt-get install docker.io) and start dockerd, or use "
                            "--target venv")]
        from envport.engines.docker import engine_problem

        problem = engine_problem(timeout=5)
        if problem:
            return [Finding("docker_unreachable", f"the docker engine does not answer: {problem}",
                            "start dockerd, or check DOCKER_HOST")]
        return []
    if t == "apptainer":
        if shutil.which("apptainer") or shutil.which("singularity"):
            return []
        missing = [b for b in ("mksquashfs", "docker") if shutil.which(b) is None]
        if missing:
            return [Finding("runtime_missing", f"no apptainer on PATH, and envport's own .def builder needs "
                            f"{' and '.join(missing)}", "install apptainer, or squashfs-tools and docker")]
        return []
    if ctx.host:
        return []  # the remote setup script refuses with its own reason (no_python, no_conda)
    if t == "venv":
        py = f"python{ctx.spec.python}"
        if shutil.which(py) is None:
            return [Finding("runtime_missing", f"{py} is not on PATH (the venv target makes the env with it)",
                            f"install it (Debian: apt-get install {py}-venv), or use --target docker")]
        why = host_venv_missing(ctx.spec.python)
        return [Finding("runtime_missing", why, f"install {py}-venv (Debian/Ubuntu: apt-get install {py}-venv), "
                        "or use --target docker")] if why else []
    if t == "conda":
        if not any(shutil.which(c) for c in ("micromamba", "mamba", "conda")):
            return [Finding("runtime_missing", "no micromamba, mamba or conda on PATH",
                            "install micromamba, or use --target venv")]
    return []


def _sm(text: str) -> tuple[int, int]:
    """'sm_90a' -> (9, 0); '8.6' -> (8, 6)."""
    if text.startswith("sm_"):
        digits = "".join(c for c in text[3:] if c.isdigit())
        return int(digits[:-1]), int(digits[-1])
    major, _, minor = text.partition(".")
    return int(major), int(minor or 0)


def check_gpus(ctx: Context) -> list[Finding]:
    want = ctx.spec.resources.gpus
    if want <= 0:
        return []
    from envport.engines.gpu import gpu_inventory

    inv = (ctx.gpu_inventory or gpu_inventory)()
    route = "run on a GPU node (`envport doctor` shows the Slurm route), or set resources.gpus: 0 for a CPU run"
    if not inv.get("nvidia_smi"):
        return [Finding(NO_ACCELERATOR_REASON, f"the spec asks for {want} GPU(s) and this host has no nvidia-smi "
                        "(no NVIDIA driver)", route)]
    gpus = inv.get("gpus") or []
    if len(gpus) < want:
        why = inv.get("error") or f"nvidia-smi lists {len(gpus)}"
        return [Finding(NO_ACCELERATOR_REASON, f"the spec asks for {want} GPU(s); {why}", route)]
    out = []
    if ctx.spec.sm_range:
        lo, hi = (_sm(s) for s in ctx.spec.sm_range)
        outside = [g for g in gpus if g.get("compute_capability") and not lo <= _sm(g["compute_capability"]) <= hi]
        if len(gpus) - len(outside) < want:
            names = ", ".join(f"{g['name']} (sm_{g['compute_capability'].replace('.', '')})" for g in outside)
            out.append(Finding("gpu_outside_sm_range", f"{names} outside the spec's sm_range "
                               f"{ctx.spec.sm_range[0]}..{ctx.spec.sm_range[1]}",
                               "route the job to GPUs inside sm_range, or rebuild with a torch whose arch list "
                               "covers this card and widen sm_range"))
        if any(not g.get("compute_capability") for g in gpus):
            out.append(Finding("", "nvidia-smi reports no compute capability (driver < 510): sm_range not judged"))
    out.append(Finding("", f"driver {inv.get('driver')}: the spec declares no driver floor, so it is reported, "
                       "not judged"))
    return out


def check_compiler(ctx: Context) -> list[Finding]:
    if ctx.target not in ("venv", "conda") or ctx.host:
        return []  # a container builds inside its own image
    needs = sorted(COMPILER_PKGS & {p.split("=")[0] for p in ctx.spec.system_pkgs})
    if needs and not (shutil.which("cc") or shutil.which("gcc")):
        return [Finding("compiler_missing", f"the spec's system_pkgs ({', '.join(needs)}) say a phase compiles "
                        "from source, and this host has no cc or gcc on PATH",
                        "apt-get install build-essential (or ask an admin), or use --target docker")]
    return []


def check_shm(ctx: Context) -> list[Finding]:
    try:
        total = shutil.disk_usage("/dev/shm").total / GiB
    except OSError:
        return []
    if total < SMALL_SHM_GIB:
        return [Finding("", f"/dev/shm is {total:.2f} GiB (small); ranks sharing tensors through it may fail; "
                        "docker runs get --ipc host")]
    return []


CHECKS: tuple[Callable[[Context], list[Finding]], ...] = (check_runtime, check_gpus, check_disk, check_compiler,
                                                           check_shm)


def preflight(ctx: Context) -> StepResult:
    start = time.monotonic()
    findings = [f for check in CHECKS for f in check(ctx)]
    problems = [f for f in findings if f.is_problem]
    notes = [f.line() for f in findings if not f.is_problem]
    step = f"preflight {ctx.spec.name} ({ctx.target}{' on ' + ctx.host if ctx.host else ''})"
    if problems:
        return StepResult(step, Verdict.REFUSED, "; ".join(p.message for p in problems), reason=problems[0].reason,
                          lines=[p.line() for p in problems] + notes, seconds=time.monotonic() - start,
                          data={"problems": [p.reason for p in problems]})
    return StepResult(step, Verdict.OK, f"{len(CHECKS)} checks passed (disk, runtime, GPUs, compiler, /dev/shm)",
                      lines=notes, seconds=time.monotonic() - start)

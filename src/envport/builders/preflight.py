"""Preflight: cheap local checks, before anything large is built or downloaded.

A machine that cannot run an env learns so in a second rather than after
16 GB (seed 002). Every check is a small function returning Findings: a
problem is a stable reason token with its fix and refuses; a note (a small
/dev/shm, a size never measured here) is printed and refuses nothing. The
shape is the doctor's (core/finding), and the GPUs, the driver and the docker
engine are judged by the same functions doctor calls (engines/gpu.judge_gpus,
core/arch.driver_finding, engines/docker.engine_finding).
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Optional

from envport.builders import weights as weights_mod
from envport.core.arch import driver_check, driver_finding, flavour_cuda, parse_capability, torch_flavour
from envport.core.finding import Finding
from envport.core.verdict import StepResult, Verdict
from envport.spec.model import Spec

GiB = 2**30
# Kept free beyond the estimate: a build's temporary files, pip's unpacked wheels, logs.
DEFAULT_MARGIN_GB = 1.0
SMALL_SHM_GIB = 1.0
# System packages that mean "a phase compiles C/C++": on a host target the host must have the compiler.
COMPILER_PKGS = frozenset({"build-essential", "gcc", "g++", "clang", "cmake", "ninja-build", "make"})


@dataclass
class Context:
    spec: Spec
    target: str  # a target's name (envport.targets.registry.NAMES)
    host: Optional[str] = None  # venv/conda over SSH: the host's own checks happen in its build
    weights_root: Path = field(default_factory=weights_mod.weights_root)
    env_bytes: Optional[int] = None  # the env's size when this host built it before (the ledger), else None
    margin_gb: float = DEFAULT_MARGIN_GB
    project_root: Optional[Path] = None
    # Injected by tests only where no real part exists (a GPU on a GPU-less host): nvidia-smi's view.
    gpu_inventory: Optional[Callable[[], dict]] = None
    # The target's own runtime check (envport.targets: Target.runtime_findings); None: not checked, and said so.
    runtime: Optional[Callable[["Context"], list[Finding]]] = None
    # Where the env's bytes land on this host (Target.env_disk); None: not on this host (an SSH host's
    # setup script checks its own disk), or not said, and then only the weights are counted.
    env_disk: Optional[Path] = None
    # The env's pip phases compile on this host (a venv or conda env built here), not inside an image.
    compiles_here: bool = False


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
    if ctx.env_disk is not None:
        where = ctx.env_disk
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
    """The target's runtime on this host, as the target itself checks it (builders stay below targets/)."""
    if ctx.runtime is None:
        return [Finding("", f"the {ctx.target} runtime was not checked (no target check given)")]
    return ctx.runtime(ctx)


def check_gpus(ctx: Context) -> list[Finding]:
    want = ctx.spec.resources.gpus
    if want <= 0:
        return []
    from envport.engines.gpu import gpu_inventory, judge_gpus

    inv = (ctx.gpu_inventory or gpu_inventory)()
    found = judge_gpus(inv, want)
    if found.is_problem:
        joined = " and " if not inv.get("nvidia_smi") else "; "
        return [replace(found, evidence=f"the spec asks for {want} GPU(s){joined}{found.evidence}")]
    gpus = inv["gpus"]
    out = []
    if ctx.spec.sm_range:
        lo, hi = (parse_capability(s) for s in ctx.spec.sm_range)
        outside = [g for g in gpus
                   if g.get("compute_capability") and not lo <= parse_capability(g["compute_capability"]) <= hi]
        if len(gpus) - len(outside) < want:
            names = ", ".join(f"{g['name']} (sm_{g['compute_capability'].replace('.', '')})" for g in outside)
            out.append(Finding("gpu_outside_sm_range", f"{names} outside the spec's sm_range "
                               f"{ctx.spec.sm_range[0]}..{ctx.spec.sm_range[1]}",
                               "route the job to GPUs inside sm_range, or rebuild with a torch whose arch list "
                               "covers this card and widen sm_range"))
        if any(not g.get("compute_capability") for g in gpus):
            out.append(Finding("", "nvidia-smi reports no compute capability (driver < 510): sm_range not judged"))
    out.append(_driver_finding(ctx.spec, inv))
    jax = jax_named(ctx.spec)
    if jax:
        # The driver above is judged against torch's pin; JAX brings its own CUDA (a plugin wheel), whose view is
        # only known where the env runs: said, never guessed (a CPU torch beside it is not the judge).
        out.append(Finding("", f"the env installs {jax}: JAX's view of the GPUs is judged where the env runs "
                           f"(envport doctor --python ENV_PYTHON, the kernel witness), not from its pin"))
    return out


def torch_pin(spec: Spec) -> tuple[Optional[str], Optional[str]]:
    """(the version the spec's last phase naming torch pins, the index that phase installs it from)."""
    from packaging.requirements import Requirement

    from envport.spec.model import canonical_name, last_pins

    index_url = None
    for phase in spec.pip_phases:
        for text in phase.packages:
            if canonical_name(Requirement(text).name) == "torch":
                index_url = phase.index_url
    return last_pins(spec).get("torch"), index_url


# Distributions whose presence says the env's accelerator may be JAX's (jax[cuda12] brings the plugin).
JAX_DISTRIBUTIONS = ("jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda13-plugin")


def jax_named(spec: Spec) -> Optional[str]:
    """"jax==V" (or "jax") when a pip phase installs JAX, else None: a CPU torch beside it is not the judge."""
    from packaging.requirements import Requirement

    from envport.spec.model import canonical_name, last_pins

    names = {canonical_name(Requirement(t).name) for ph in spec.pip_phases for t in ph.packages}
    if not names & set(JAX_DISTRIBUTIONS):
        return None
    pin = last_pins(spec).get("jax") or last_pins(spec).get("jaxlib")
    return f"jax=={pin}" if pin else "jax"


def _driver_finding(spec: Spec, inv: dict) -> Finding:
    """The driver against the CUDA build of the spec's torch pin: the judgement `envport doctor` makes
    against the torch it probes (core.arch.driver_check), made here before anything is built."""
    pin, index_url = torch_pin(spec)
    flavour, how = torch_flavour(pin, index_url) if pin else (None, "")
    drv = driver_check(inv.get("driver"), inv.get("cuda_driver"), flavour_cuda(flavour))
    found = driver_finding(drv)
    # Only a build the spec names (a +cuXYZ tag, a pytorch.org index) is judged: PyPI's default build is
    # a guess where a site's index or wheelhouse may install another one.
    guessed = how.startswith("PyPI's default")
    if found.is_problem and not guessed:
        return found
    guess = f" (if PyPI's default build is installed: {how})" if guessed else ""
    return Finding("", f"driver {inv.get('driver')}: {drv['detail']}{guess}",
                   verdict=Verdict.SKIPPED if guessed else found.verdict)


def check_compiler(ctx: Context) -> list[Finding]:
    if not ctx.compiles_here:
        return []  # a container builds inside its own image; an SSH host's setup script checks its own
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


def run_checks(ctx: Context) -> list[Finding]:
    """Every check's findings, each naming the check it came from (check_disk -> "disk")."""
    return [replace(f, check=check.__name__.removeprefix("check_")) for check in CHECKS for f in check(ctx)]


def preflight(ctx: Context) -> StepResult:
    start = time.monotonic()
    findings = run_checks(ctx)
    problems = [f for f in findings if f.is_problem]
    notes = [f.line() for f in findings if not f.is_problem]
    step = f"preflight {ctx.spec.name} ({ctx.target}{' on ' + ctx.host if ctx.host else ''})"
    if problems:
        return StepResult(step, Verdict.REFUSED, "; ".join(p.evidence for p in problems), reason=problems[0].reason,
                          lines=[p.line() for p in problems] + notes, seconds=time.monotonic() - start,
                          data={"problems": [p.reason for p in problems]})
    return StepResult(step, Verdict.OK, f"{len(CHECKS)} checks passed (disk, runtime, GPUs, compiler, /dev/shm)",
                      lines=notes, seconds=time.monotonic() - start)

"""What this host can build and prove: GPUs, the torch stack, disk, runtimes, and the route.

Everything here observes and reports; nothing installs or changes the host.
The report is one dict (validated by docs/doctor.schema.json) rendered as text
or JSON, and optionally as docs/infra.md: the launch recipe the witness and
Slurm commands follow.  What it judges (GPUs, driver, arch, disk, docker, the
--env arch verdict) is a list of checks answering in core/finding's Finding,
as preflight's do; the text renders the verdicts from them.

The GPU count decides what is testable here: collectives and DTensor run
anywhere on gloo/CPU; one free GPU already runs the kernel witness, NCCL at
world 1 and a size-1 mesh locally (NCCL worlds up to the free GPUs); a 2-D
square mesh on GPUs needs a perfect square >= 4 of them and full integration
wants 8; with no GPU the GPU witnesses go through Slurm.  What is testable is
counted by the probed torch once it answered (a CPU-only torch or a driver
older than torch's CUDA build uses none of the GPUs nvidia-smi lists, and the
note says which); nvidia-smi's count alone decides only where torch could not
be probed.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import shutil
import socket
import sys
from pathlib import Path
from typing import Optional

from envport import __version__
from envport.core.finding import Finding
from envport.core.proc import run
from envport.core.verdict import Verdict
from envport.engines.docker import engine_finding
from envport.engines.gpu import GpuCensus, gpu_inventory, judge_gpus, smi_count, topology, topology_pairs
from envport.witness.scripts.envport_sentinel import HARDENING_ENV, WITNESS_ENV
from envport.core.arch import (
    driver_check,
    driver_finding,
    gpu_runnable,
    parse_capability,
    published_arch_list,
    range_verdict,
    sm_name,
    torch_flavour,
)

SCHEMA_VERSION = 4  # 2: census, driver, topology_pairs, tier "basic" (one GPU runs locally), [N/A] fields; 3: findings;
# 4: frameworks (JAX, Triton), census.jax, arch[].judged_by

RECOMMENDED_FREE_DISK_GB = 150.0  # images + envs + weights + build caches

_TORCH_PROBE = r"""
import json, sys
out = {"python": sys.executable, "python_version": "%d.%d.%d" % sys.version_info[:3]}
try:
    import torch
except Exception as exc:
    out.update(available=False, error="%s: %s" % (type(exc).__name__, exc))
else:
    out.update(available=True, version=torch.__version__, cuda=getattr(torch.version, "cuda", None))
    try:
        out["arch_list"] = list(torch.cuda.get_arch_list())
    except Exception:
        out["arch_list"] = []
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out["cuda_available"] = bool(torch.cuda.is_available())
    out["warnings"] = ["%s" % w.message for w in caught if "cuda" in str(w.message).lower()]
    out["devices"] = []
    if out["cuda_available"]:
        for i in range(torch.cuda.device_count()):
            out["devices"].append({"index": i, "name": torch.cuda.get_device_name(i),
                                   "capability": "%d.%d" % torch.cuda.get_device_capability(i)})
    try:
        v = torch.cuda.nccl.version()
        out["nccl"] = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
    except Exception:
        out["nccl"] = None
    import torch.distributed as dist
    out["distributed"] = bool(dist.is_available())
    out["gloo"] = bool(dist.is_available() and dist.is_gloo_available())
    out["nccl_backend"] = bool(dist.is_available() and dist.is_nccl_available())
    try:
        from torch.distributed.device_mesh import init_device_mesh  # noqa: F401
        out["dtensor"] = True
    except Exception:
        out["dtensor"] = False
print("ENVPORT-DOCTOR " + json.dumps(out))
"""


def torch_probe(python: Optional[str] = None, timeout: float = 120) -> dict:
    """torch, CUDA, NCCL and DTensor as `python` sees them, probed in a subprocess (optional)."""
    python = python or sys.executable
    res = run([python, "-c", _TORCH_PROBE], timeout=timeout)
    if res.returncode is None:
        return {"python": python, "available": False, "error": f"{python} did not run or answer in {timeout:.0f}s"}
    for line in res.stdout.splitlines():
        if line.startswith("ENVPORT-DOCTOR "):
            return json.loads(line[len("ENVPORT-DOCTOR "):])
    err = (res.stderr.strip().splitlines() or [f"exit {res.returncode}"])[-1]
    return {"python": python, "available": False, "error": err}


def disk(path: Path) -> dict:
    path = Path(path)
    while not path.exists() and path != path.parent:
        path = path.parent
    usage = shutil.disk_usage(path)
    free = usage.free / 1e9
    return {"path": str(path), "free_gb": round(free, 1), "total_gb": round(usage.total / 1e9, 1),
            "recommended_gb": RECOMMENDED_FREE_DISK_GB, "ok": free >= RECOMMENDED_FREE_DISK_GB}


def shm(path: str = "/dev/shm") -> Optional[dict]:
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return {"path": path, "size_gb": round(st.f_blocks * st.f_frsize / 1e9, 2),
            "free_gb": round(st.f_bavail * st.f_frsize / 1e9, 2)}


def tools() -> dict:
    """Runtimes and launchers on PATH; docker also says whether its engine answers (check_docker judges it)."""
    from envport.engines.docker import engine_problem

    out: dict = {}
    for name in ("docker", "apptainer", "singularity", "srun", "sbatch", "ssh"):
        out[name] = {"path": shutil.which(name)}
    problem = engine_problem("docker", timeout=10) if out["docker"]["path"] else None
    out["docker"]["engine"] = bool(out["docker"]["path"]) and problem is None
    out["docker"]["detail"] = problem or ("engine answers" if out["docker"]["path"] else "no docker client")
    return out


def gpu_configurations(free_gpus: int, why: str = "") -> dict:
    """Free GPU count -> what can be proven here, and which route the rest takes (`why`: how it was counted)."""
    side = math.isqrt(free_gpus)
    mesh_2d = [side, side] if side >= 2 else None
    if free_gpus >= 8:
        tier, route = "full", "local"
        note = f"full integration: 2-D mesh {side}x{side} and world size {free_gpus} on NCCL here"
    elif free_gpus >= 4:
        tier, route = "limited", "local"
        note = f"2-D mesh {side}x{side} on NCCL here; full integration wants 8 GPUs (Slurm)"
    elif free_gpus >= 1:
        tier, route = "basic", "local"
        have = f"{free_gpus} free GPU{'s' if free_gpus != 1 else ''}"
        note = (f"{have}: the kernel witness, NCCL up to world {free_gpus} and a 1-D mesh of {free_gpus} run "
                f"here; a 2-D GPU mesh needs a perfect square >= 4 (Slurm); the spec's full worlds also run "
                f"here on CPU (gloo)")
    else:
        tier, route = "none", "slurm"
        note = ("no free GPU: GPU witnesses go through Slurm; collectives and DTensor still run here on "
                "CPU (gloo)")
    if why:
        note += f" ({why})"
    return {"free_gpus": free_gpus, "max_gpu_world_size": free_gpus, "mesh_2d": mesh_2d,
            "tier": tier, "route": route, "cpu_gloo": True, "note": note}


def usable_gpus(free: int, torch_info: dict, driver: dict, frameworks: Optional[dict] = None) -> tuple[int, str]:
    """Free GPUs the probed frameworks can use: torch's count (_torch_usable), or JAX's where it sees more
    (a CPU-only torch beside a JAX that drives the card: the GPUs are JAX's, and the note says so)."""
    from envport.report.frameworks import jax_gpus, jax_said

    seen, why = _torch_usable(free, torch_info, driver)
    by_jax = min(free, len(jax_gpus(frameworks or {})))
    if by_jax > seen or (by_jax and by_jax == free and why):
        torch_part = why.rsplit("; counted", 1)[0] if why else f"torch sees {seen}"
        return by_jax, f"{torch_part}; {jax_said(frameworks or {})} sees {by_jax}: counted {by_jax}, judged by JAX"
    return seen, why


def _torch_usable(free: int, torch_info: dict, driver: dict) -> tuple[int, str]:
    """Free GPUs the probed torch can use, and why fewer than nvidia-smi lists ("" when none are lost).

    Once torch answered, its device count caps the free ones: nvidia-smi lists
    GPUs a CPU-only torch or a too-old driver cannot use.  Where torch could
    not be probed, nvidia-smi's count stands, and the note says it is unconfirmed.
    """
    if not torch_info.get("available"):
        if free and torch_info.get("error") != "not probed":
            return free, f"counted by nvidia-smi alone: torch could not be probed ({torch_info.get('error')})"
        return free, ("counted by nvidia-smi alone: torch not probed" if free else "")
    seen = len(torch_info.get("devices") or [])
    if free <= seen:
        return free, ""
    if not torch_info.get("cuda"):
        cause = "it is a CPU-only build"
    elif driver.get("ok") is False:
        cause = f"the driver is older than its CUDA {torch_info['cuda']} build"
    elif os.environ.get("CUDA_VISIBLE_DEVICES") is not None:
        cause = f"CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']!r} hides the rest"
    else:
        cause = "; ".join(torch_info.get("warnings") or []) or "torch.cuda.is_available() is False"
    return seen, (f"nvidia-smi lists {free} free GPU(s) but torch {torch_info.get('version')} in "
                  f"{torch_info.get('python')} can use {seen}: {cause}; counted {seen}")


def arch_vs_gpus(torch_info: dict, gpus: list[dict], frameworks: Optional[dict] = None) -> list[dict]:
    """Each GPU judged by the framework that can drive it: torch's arch list first, then JAX (a card JAX lists is
    not refused because the env's torch is a CPU build); `judged_by` names which."""
    from envport.report.frameworks import jax_gpus, judge_by_jax

    rows = _torch_arch(torch_info, gpus or [{"index": d.get("index"), "compute_capability": d.get("capability")}
                                            for d in jax_gpus(frameworks or {})])
    return [(r.get("runnable") is not True and judge_by_jax(r["index"], r.get("capability"), frameworks or {},
                                                              r["detail"])) or r for r in rows]


def _torch_arch(torch_info: dict, gpus: list[dict]) -> list[dict]:
    """torch's arch list judged against each GPU's capability."""
    arch_list = torch_info.get("arch_list") if torch_info.get("available") else None
    out = []
    if not gpus:  # nvidia-smi lists none (absent, or a sandbox): judge the GPUs torch sees
        gpus = [{"index": d.get("index"), "compute_capability": d.get("capability")}
                for d in torch_info.get("devices") or []]
    for gpu in gpus:
        cap = gpu.get("compute_capability")
        if cap is None:
            dev = next((d for d in torch_info.get("devices", []) if d.get("index") == gpu.get("index")), None)
            cap = dev.get("capability") if dev else None
        if cap is None or arch_list is None:
            out.append({"index": gpu["index"], "capability": cap, "runnable": None, "judged_by": "torch",
                        "detail": "unknown: no capability or no torch to compare"})
            continue
        match = gpu_runnable(parse_capability(cap), arch_list)
        d = match.to_dict()
        d["index"] = gpu["index"]
        d["judged_by"] = "torch"
        d["detail"] = (f"{sm_name(match.capability)} runs via {match.via}" + (" (PTX JIT)" if match.jit else "")
                       if match.runnable else match.reason)
        out.append(d)
    return out


def env_arch(spec) -> dict:
    """The env's torch pin -> its published arch list -> the verdict on its sm_range. No GPU needed."""
    from envport.builders.preflight import torch_pin

    pin, index_url = torch_pin(spec)
    out: dict = {"name": spec.name, "torch_pin": pin, "index_url": index_url, "sm_range": spec.sm_range}
    if pin is None:
        out.update(flavour=None, how="the spec pins no torch", arch_list=None, verdict=None,
                   ok=None, detail="no torch pin: nothing to judge")
        return out
    flavour, how = torch_flavour(pin, index_url)
    arch_list = published_arch_list(flavour, pin)
    out.update(flavour=flavour, how=how, arch_list=arch_list)
    if spec.sm_range is None:
        out.update(verdict=None, ok=None, detail="the spec declares no sm_range: nothing to judge")
    elif arch_list is None:
        out.update(verdict=None, ok=None,
                   detail=f"no recorded arch list for torch {pin} ({how}); probe the built env "
                   f"(envport witness {spec.name} --only kernel on a GPU)")
    else:
        verdict = range_verdict(spec.sm_range, arch_list)
        out.update(verdict=verdict.to_dict(), ok=verdict.ok,
                   detail=f"torch {pin} ({flavour}): {verdict.detail}")
    return _cpu_torch_beside_jax(spec, out)


def _cpu_torch_beside_jax(spec, out: dict) -> dict:
    """A CPU torch in an env that installs JAX does not judge the card: JAX does, once the env runs on it.

    Seed 002: an AlphaFold 3 env pins a CPU-only torch for its weights converter while JAX drives the GPU, and
    a verdict from torch's empty arch list refused an env that works.  Not judged from a pin, and said so.
    """
    from envport.builders.preflight import jax_named

    jax = jax_named(spec)
    if out.get("flavour") != "cpu" or jax is None or out.get("ok") is not False:
        return out
    out.update(verdict=None, ok=None,
               detail=f"torch {out['torch_pin']} is a CPU build and the env installs {jax}: its GPU is JAX's, "
               f"judged by JAX where the env runs (`envport doctor --python ENV_PYTHON`, `envport witness "
               f"{spec.name} --only kernel` on a GPU), not refused for torch's empty arch list")
    return out


def collect(python: Optional[str] = None, workdir: Optional[Path] = None, probe_torch: bool = True,
            spec=None) -> dict:
    """The whole report as one dict (see docs/doctor.schema.json)."""
    from envport.report.frameworks import frameworks_probe, jax_gpus, triton_probe

    inv = gpu_inventory()
    torch_info = torch_probe(python) if probe_torch else {"python": python or sys.executable,
                                                           "available": False, "error": "not probed"}
    # JAX and Triton are probed with torch (--no-torch skips every framework probe: each imports its framework).
    frameworks = frameworks_probe(python) if probe_torch else {}
    if "triton" in frameworks:
        frameworks["triton"]["compile"] = triton_probe(python)
    torch_seen = len(torch_info.get("devices") or []) if torch_info.get("available") else None
    census = GpuCensus(smi_count(inv), torch_seen, jax=len(jax_gpus(frameworks)) if "jax" in frameworks else None)
    # GPUs torch sees that nvidia-smi does not list (a sandbox) count as free: nothing says otherwise.
    free = len([g for g in inv["gpus"] if not g["in_use"]]) + max(0, census.count - len(inv["gpus"]))
    driver = driver_check(inv["driver"], inv["cuda_driver"], torch_info.get("cuda"))
    free, why = usable_gpus(free, torch_info, driver, frameworks)
    topo = topology()
    report = {
        "schema_version": SCHEMA_VERSION,
        "envport": __version__,
        "generated": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        "host": {"hostname": socket.gethostname(), "platform": platform.platform(),
                 "machine": platform.machine(), "cpus": os.cpu_count() or 1,
                 "python": sys.version.split()[0]},
        "gpus": inv,
        "census": census.to_dict(),
        "topology": topo,
        "topology_pairs": topology_pairs(topo),
        "torch": torch_info,
        "frameworks": frameworks,
        "driver": driver,
        "arch": arch_vs_gpus(torch_info, inv["gpus"], frameworks),
        "disk": disk(workdir or Path.cwd()),
        "shm": shm(),
        "tools": tools(),
        "testable": gpu_configurations(free, why),
        "hardening_env": dict(HARDENING_ENV),
        "witness_env": dict(WITNESS_ENV),
    }
    if spec is not None:
        report["env"] = env_arch(spec)
    report["findings"] = [f.to_dict() for f in findings(report)]
    report["verdict"] = verdict_line(report)
    return report


def verdict_line(report: dict) -> str:
    gpus = report["gpus"]["gpus"]
    t = report["testable"]
    census = report.get("census") or {}
    if check_gpus(report)[0].is_problem:
        text = ("no GPU on this host (no nvidia-smi)" if report["gpus"]["nvidia_smi"] is None
                else f"no GPU visible ({report['gpus'].get('error') or 'nvidia-smi lists none'})")
        text += "; CPU witnesses (gloo) run here; GPU witnesses take the Slurm route"
        if not report["tools"]["srun"]["path"]:
            text += " (no srun on this host: run from a cluster login node)"
        return text
    names = sorted({g["name"] for g in gpus}) or sorted({d["name"] for d in report["torch"].get("devices") or []})
    text = f"{census.get('count') or len(gpus)} GPU(s) ({', '.join(names)}), {t['free_gpus']} free: {t['note']}"
    if census.get("note"):
        text += f" (note: {census['note']})"
    driver = check_driver(report)
    if driver and driver[0].is_problem:
        text += f"; DRIVER: {said(driver[0])}"
    return text


# --- the checks: each judges facts of the report and answers in Findings ----------------------------
# They read the report dict, not the host, so a saved `doctor --json` renders with the same verdicts.
# The GPUs, the driver and the docker engine are judged by the functions preflight calls.


def said(f: Finding) -> str:
    """A finding's evidence and fix in one line, as the report prints it."""
    return f.evidence + (f" fix: {f.fix}" if f.fix else "")


def check_gpus(report: dict) -> list[Finding]:
    """At least one GPU for the GPU witnesses (else they take the Slurm route)."""
    census = report.get("census") or {}
    jax_n = census.get("jax") or 0
    return [judge_gpus(report["gpus"], 1, census.get("torch") if jax_n <= (census.get("torch") or 0) else jax_n,
                       seen_by="torch" if jax_n <= (census.get("torch") or 0) else "JAX",
                       fix="the GPU witnesses take the Slurm route (envport slurm submit); CPU witnesses "
                       "(gloo) run here")]


def check_driver(report: dict) -> list[Finding]:
    """The driver against torch's CUDA build; nothing when there was no floor to judge (a CPU torch)."""
    drv = report.get("driver") or {}
    if not drv.get("floor") and drv.get("ok") is None:
        return []
    return [driver_finding(drv)]


def check_arch(report: dict) -> list[Finding]:
    """torch's arch list against each GPU's capability, one finding per GPU (in report["arch"]'s order)."""
    out = []
    for a in report["arch"]:
        runnable = a.get("runnable")
        if runnable is False:
            out.append(Finding("arch_uncovered", a["detail"], "route the job to a GPU torch's arch list covers, "
                               "or pin a torch built for this card", check="arch"))
        else:
            # Where JAX is there too, the verdict names the framework that judged the card (a JAX row says so).
            judged = a.get("judged_by") or "torch"
            said_by = f" (judged by {judged})" if judged == "torch" and (report.get("frameworks") or {}).get("jax") \
                else ""
            out.append(Finding("", a["detail"] + said_by, check="arch", verdict=Verdict.OK if runnable else None))
    return out


def check_disk(report: dict) -> list[Finding]:
    d = report["disk"]
    evidence = (f"{_gb(d['free_gb'])} free of {_gb(d['total_gb'])} at {d['path']} "
                f"({'ok' if d['ok'] else 'below'} the ~{d['recommended_gb']:g} GB recommendation)")
    if d["ok"]:
        return [Finding("", evidence, check="disk", verdict=Verdict.OK)]
    return [Finding("disk_low", evidence, f"free space at {d['path']}, or point ENVPORT_ENVS_DIR / "
                    "ENVPORT_WEIGHTS_DIR at a larger disk", check="disk")]


def check_docker(report: dict) -> list[Finding]:
    d = report["tools"]["docker"]
    return [engine_finding(d["path"], None if d.get("engine") else d.get("detail") or "the engine is down")]


def check_env(report: dict) -> list[Finding]:
    """--env NAME: the env's torch pin's arch list against its sm_range (the one check that sets the exit code)."""
    if "env" not in report:
        return []
    e = report["env"]
    if e.get("ok") is False:
        return [Finding("arch_uncovered", e["detail"], "pin a torch whose arch list covers the spec's sm_range, "
                        "or narrow sm_range to the GPUs it runs on", check="env")]
    return [Finding("", e["detail"], check="env", verdict=Verdict.OK if e.get("ok") else None)]


def check_triton(report: dict) -> list[Finding]:
    """Triton's compile probe (a tl.sum kernel in a child): only where the probed interpreter holds Triton."""
    from envport.report.frameworks import triton_finding

    return triton_finding(((report.get("frameworks") or {}).get("triton") or {}).get("compile"))


CHECKS = (check_gpus, check_driver, check_arch, check_triton, check_disk, check_docker, check_env)


def findings(report: dict) -> list[Finding]:
    """Every check's findings, in CHECKS order."""
    return [f for check in CHECKS for f in check(report)]


def _gb(v) -> str:
    return "?" if v is None else f"{v:g} GB"


def _mib(v) -> str:
    return "?" if v is None else f"{v:.0f}"


TEXT_TEMPLATE = "doctor.txt.j2"
INFRA_TEMPLATE = "infra.md.j2"


def _template(name: str):
    # The renderers' environment (StrictUndefined, trim_blocks), reading the
    # templates that sit beside this module: a report is a template, not string code.
    import jinja2

    from envport.renderers import ENV

    return ENV.overlay(loader=jinja2.FileSystemLoader(str(Path(__file__).parent))).get_template(name)


def render_text(report: dict) -> str:
    """`envport doctor`'s text: one line per fact, the verdict last."""
    import jinja2

    try:
        found = findings(report)
        one = {f.check: f for f in found if f.check != "arch"}
        return _template(TEXT_TEMPLATE).render(r=report, f=one, arch=[f for f in found if f.check == "arch"],
                                               said=said, mib=_mib, gb=_gb)
    except jinja2.UndefinedError as exc:
        # A saved report missing a field: the KeyError `doctor --from` names as "not a saved report".
        raise KeyError(str(exc)) from exc


def portable_path(path: Optional[str], root: Optional[Path]) -> Optional[str]:
    """`path` as a committed record may name it: relative to the project root, else under `~`, else as is
    (a system path such as /usr/bin/python3 names no one's checkout)."""
    if not path:
        return path
    given = Path(path)
    if root is not None and given.is_relative_to(root):
        return given.relative_to(root).as_posix()  # "." for the root itself
    if given.is_relative_to(Path.home()):
        return "~/" + given.relative_to(Path.home()).as_posix()
    return path


def render_infra_md(report: dict, root: Optional[Path] = None) -> str:
    """docs/infra.md: what this host is and the launch recipe every multi-rank run reuses.

    It is committed, so the interpreter and the disk it names are written relative to
    the project `root` (or `~`), never as this machine's absolute paths."""
    shown = {**report, "torch": {**report["torch"], "python": portable_path(report["torch"].get("python"), root)},
             "disk": {**report["disk"], "path": portable_path(report["disk"]["path"], root)}}
    return _template(INFRA_TEMPLATE).render(r=shown, hardening_env=HARDENING_ENV, witness_env=WITNESS_ENV,
                                    mib=_mib, gb=_gb)

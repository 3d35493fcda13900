"""What this host can build and prove: GPUs, the torch stack, disk, runtimes, and the route.

Everything here observes and reports; nothing installs or changes the host.
The report is one dict (validated by docs/doctor.schema.json) rendered as text
or JSON, and optionally as docs/infra.md: the launch recipe the witness and
Slurm commands follow.

The GPU count decides what is testable here: collectives and a 1-D DTensor
mesh run anywhere (gloo on CPU), a 2-D square mesh on GPUs needs a perfect
square >= 4 of free GPUs, full integration wants 8, and fewer than 4 free
GPUs means the GPU witnesses go through Slurm.
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
from envport.witness.scripts.envport_sentinel import HARDENING_ENV
from envport.core.proc import run
from envport.engines.gpu import gpu_inventory, topology
from envport.witness.arch import (
    gpu_runnable,
    parse_capability,
    published_arch_list,
    range_verdict,
    sm_name,
    torch_flavour,
)

SCHEMA_VERSION = 1
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
    out["cuda_available"] = bool(torch.cuda.is_available())
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
    """Runtimes and launchers on PATH; docker also says whether its engine answers."""
    from envport.engines.docker import engine_problem

    out: dict = {}
    for name in ("docker", "apptainer", "singularity", "srun", "sbatch", "ssh"):
        out[name] = {"path": shutil.which(name)}
    if out["docker"]["path"]:
        problem = engine_problem("docker", timeout=10)
        out["docker"]["engine"] = problem is None
        out["docker"]["detail"] = problem or "engine answers"
    else:
        out["docker"]["engine"] = False
        out["docker"]["detail"] = "no docker client"
    return out


def gpu_configurations(free_gpus: int) -> dict:
    """Free GPU count -> what can be proven here, and which route the rest takes."""
    side = math.isqrt(free_gpus)
    mesh_2d = [side, side] if side >= 2 else None
    if free_gpus >= 8:
        tier, route = "full", "local"
        note = f"full integration: 2-D mesh {side}x{side} and world size {free_gpus} on NCCL here"
    elif free_gpus >= 4:
        tier, route = "limited", "local"
        note = f"2-D mesh {side}x{side} on NCCL here; full integration wants 8 GPUs (Slurm)"
    else:
        tier, route = "none", "slurm"
        have = f"{free_gpus} free GPU{'s' if free_gpus != 1 else ''}"
        note = (f"{have}: a 2-D GPU mesh needs a perfect square >= 4, so GPU witnesses go through "
                f"Slurm; collectives and DTensor still run here on CPU (gloo)")
        mesh_2d = None
    return {"free_gpus": free_gpus, "max_gpu_world_size": free_gpus, "mesh_2d": mesh_2d,
            "tier": tier, "route": route, "cpu_gloo": True, "note": note}


def arch_vs_gpus(torch_info: dict, gpus: list[dict]) -> list[dict]:
    """torch's arch list judged against each GPU's capability."""
    arch_list = torch_info.get("arch_list") if torch_info.get("available") else None
    out = []
    for gpu in gpus:
        cap = gpu.get("compute_capability")
        if cap is None:
            dev = next((d for d in torch_info.get("devices", []) if d.get("index") == gpu.get("index")), None)
            cap = dev.get("capability") if dev else None
        if cap is None or arch_list is None:
            out.append({"index": gpu["index"], "capability": None, "runnable": None,
                        "detail": "unknown: no capability or no torch to compare"})
            continue
        match = gpu_runnable(parse_capability(cap), arch_list)
        d = match.to_dict()
        d["index"] = gpu["index"]
        d["detail"] = (f"{sm_name(match.capability)} runs via {match.via}" + (" (PTX JIT)" if match.jit else "")
                       if match.runnable else match.reason)
        out.append(d)
    return out


def env_arch(spec) -> dict:
    """The env's torch pin -> its published arch list -> the verdict on its sm_range. No GPU needed."""
    from packaging.requirements import Requirement

    from envport.spec.model import canonical_name, last_pins

    pin = last_pins(spec).get("torch")
    index_url = None
    for phase in spec.pip_phases:
        for text in phase.packages:
            if canonical_name(Requirement(text).name) == "torch":
                index_url = phase.index_url
    out: dict = {"name": spec.name, "torch_pin": pin, "index_url": index_url, "sm_range": spec.sm_range}
    if pin is None:
        out.update(flavour=None, how="the spec pins no torch", arch_list=None, verdict=None,
                   ok=None, detail="no torch pin: nothing to judge")
        return out
    flavour, how = torch_flavour(pin, index_url)
    arch_list = published_arch_list(flavour)
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
    return out


def collect(python: Optional[str] = None, workdir: Optional[Path] = None, probe_torch: bool = True,
            spec=None) -> dict:
    """The whole report as one dict (see docs/doctor.schema.json)."""
    inv = gpu_inventory()
    torch_info = torch_probe(python) if probe_torch else {"python": python or sys.executable,
                                                           "available": False, "error": "not probed"}
    free = [g for g in inv["gpus"] if not g["in_use"]]
    report = {
        "schema_version": SCHEMA_VERSION,
        "envport": __version__,
        "generated": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        "host": {"hostname": socket.gethostname(), "platform": platform.platform(),
                 "machine": platform.machine(), "cpus": os.cpu_count() or 1,
                 "python": sys.version.split()[0]},
        "gpus": inv,
        "topology": topology(),
        "torch": torch_info,
        "arch": arch_vs_gpus(torch_info, inv["gpus"]),
        "disk": disk(workdir or Path.cwd()),
        "shm": shm(),
        "tools": tools(),
        "testable": gpu_configurations(len(free)),
        "hardening_env": dict(HARDENING_ENV),
    }
    if spec is not None:
        report["env"] = env_arch(spec)
    report["verdict"] = verdict_line(report)
    return report


def verdict_line(report: dict) -> str:
    gpus = report["gpus"]["gpus"]
    t = report["testable"]
    if not gpus:
        text = ("no GPU on this host (no nvidia-smi)" if report["gpus"]["nvidia_smi"] is None
                else f"no GPU visible ({report['gpus'].get('error') or 'nvidia-smi lists none'})")
        text += "; CPU witnesses (gloo) run here; GPU witnesses take the Slurm route"
        if not report["tools"]["srun"]["path"]:
            text += " (no srun on this host: run from a cluster login node)"
        return text
    names = sorted({g["name"] for g in gpus})
    return f"{len(gpus)} GPU(s) ({', '.join(names)}), {t['free_gpus']} free: {t['note']}"


def _gb(v) -> str:
    return "?" if v is None else f"{v:g} GB"


def render_text(report: dict) -> str:
    lines = [f"envport doctor on {report['host']['hostname']} ({report['host']['machine']}, "
             f"{report['host']['cpus']} CPUs)"]
    inv = report["gpus"]
    if inv["gpus"]:
        lines.append(f"GPUs: {len(inv['gpus'])}, driver {inv['driver']}, CUDA (driver) {inv['cuda_driver']}")
        for g in inv["gpus"]:
            mem = f"{(g['memory_used_mib'] or 0):.0f}/{(g['memory_total_mib'] or 0):.0f} MiB"
            lines.append(f"  [{g['index']}] {g['name']} cc {g['compute_capability'] or '?'} {mem}"
                         + (" IN USE" if g["in_use"] else " free"))
    else:
        lines.append("GPUs: none" + (f" ({inv['error']})" if inv.get("error") else
                                      " (nvidia-smi not found)" if inv["nvidia_smi"] is None else ""))
    if report.get("topology"):
        lines.append("topology (nvidia-smi topo -m):")
        lines += [f"  {ln}" for ln in report["topology"].splitlines()]
    tr = report["torch"]
    if tr.get("available"):
        lines.append(f"torch {tr['version']} (CUDA build {tr.get('cuda') or 'none'}, NCCL {tr.get('nccl') or 'none'}) "
                     f"in {tr['python']}: cuda available {tr.get('cuda_available')}, "
                     f"gloo {tr.get('gloo')}, nccl {tr.get('nccl_backend')}, DTensor {tr.get('dtensor')}")
        lines.append(f"  arch list: {' '.join(tr.get('arch_list') or []) or '(none: CPU build)'}")
    else:
        lines.append(f"torch: not importable by {tr.get('python')} ({tr.get('error')}); pass --python PATH "
                     "to probe an env's interpreter")
    for a in report["arch"]:
        lines.append(f"  GPU {a['index']}: {a['detail']}")
    d = report["disk"]
    lines.append(f"disk: {_gb(d['free_gb'])} free of {_gb(d['total_gb'])} at {d['path']} "
                 f"({'ok' if d['ok'] else 'below'} the ~{d['recommended_gb']:g} GB recommendation)")
    if report.get("shm"):
        lines.append(f"/dev/shm: {_gb(report['shm']['size_gb'])}")
    tl = report["tools"]
    lines.append("tools: " + ", ".join(
        f"{k} {'yes' if v['path'] else 'no'}" + (f" (engine {'up' if v.get('engine') else 'down'})" if k == "docker"
                                                 and v["path"] else "")
        for k, v in tl.items()))
    t = report["testable"]
    lines.append(f"testable: {t['note']} (tier {t['tier']}, route {t['route']})")
    if "env" in report:
        e = report["env"]
        lines.append(f"env {e['name']}: torch {e['torch_pin'] or '-'} "
                     f"[{e.get('flavour') or '?'}; {e.get('how')}], sm_range {e.get('sm_range')}")
        lines.append(f"  arch list: {' '.join(e['arch_list']) if e.get('arch_list') else '(none)'}")
        lines.append(f"  {('OK       ' if e['ok'] else 'REFUSED  ' if e['ok'] is False else 'unknown  ')}{e['detail']}")
    lines.append(f"verdict: {report['verdict']}")
    return "\n".join(lines) + "\n"


def render_infra_md(report: dict) -> str:
    """docs/infra.md: what this host is and the launch recipe every multi-rank run reuses."""
    t, tr, inv = report["testable"], report["torch"], report["gpus"]
    out = [
        "# Test infrastructure",
        "",
        f"Generated by `envport doctor --write-docs` on {report['host']['hostname']} "
        f"({report['generated'][:10]}); re-run it after the host changes. Do not edit by hand.",
        "",
        "## This host",
        "",
        f"- CPUs: {report['host']['cpus']} ({report['host']['machine']}), {report['host']['platform']}",
    ]
    if inv["gpus"]:
        out.append(f"- GPUs: {len(inv['gpus'])} (driver {inv['driver']}, CUDA driver {inv['cuda_driver']})")
        out += [f"  - [{g['index']}] {g['name']}, cc {g['compute_capability']}, "
                f"{g['memory_total_mib']:.0f} MiB, {'in use' if g['in_use'] else 'free'}" for g in inv["gpus"]]
    else:
        out.append("- GPUs: none (no nvidia-smi)" if inv["nvidia_smi"] is None else "- GPUs: none visible")
    if report.get("topology"):
        out += ["", "```", report["topology"], "```"]
    if tr.get("available"):
        out.append(f"- torch {tr['version']} at `{tr['python']}`: CUDA build {tr.get('cuda') or 'none'}, "
                   f"NCCL {tr.get('nccl') or 'none'}, gloo {tr.get('gloo')}, DTensor {tr.get('dtensor')}")
        out.append(f"- torch arch list: {' '.join(tr.get('arch_list') or []) or 'none (CPU build)'}")
    else:
        out.append(f"- torch: not importable by `{tr.get('python')}` (the host interpreter need not have it; "
                   "each env carries its own)")
    d = report["disk"]
    out.append(f"- disk: {d['free_gb']:g} GB free at `{d['path']}` "
               f"({'meets' if d['ok'] else 'below'} the ~{d['recommended_gb']:g} GB recommendation)")
    if report.get("shm"):
        out.append(f"- /dev/shm: {report['shm']['size_gb']:g} GB")
    tl = report["tools"]
    out.append("- runtimes: " + ", ".join(
        f"{k} {'yes' if v['path'] else 'no'}" for k, v in tl.items())
        + f"; docker engine {'up' if tl['docker'].get('engine') else 'down'}")
    out += [
        "",
        "## What is testable here",
        "",
        f"{t['note']}.",
        "",
        "| free GPUs | 2-D mesh | integration | route |",
        "|---|---|---|---|",
        "| >= 8 | yes (square, e.g. 2x2; 3x3 with 9) | full | local |",
        "| 4-7 | yes (2x2) | limited | local |",
        "| 0-3 | no (needs a perfect square >= 4) | none | Slurm |",
        "",
        f"This host: **{t['free_gpus']} free GPU(s), tier {t['tier']}, route {t['route']}**. "
        "Collectives and DTensor always run on CPU with gloo, on any host.",
        "",
        "## Launch recipe",
        "",
        "Every multi-rank run sets these before any process group exists "
        "(the witness does `setdefault`, so a launcher may override):",
        "",
        "```sh",
        *[f"export {k}={v}" for k, v in HARDENING_ENV.items()],
        "```",
        "",
        "- One free port is chosen once by the launching process and passed to every rank as "
        "`MASTER_PORT` (never a fixed port: concurrent runs collide).",
        "- Process-group timeouts differ by backend: gloo 120 s, NCCL 300 s (`dist.py --gloo-timeout/--nccl-timeout`); "
        "the group deadline (`--deadline`, 300 s) dumps every rank's Python stack and kills the group.",
        "- Ring P2P posts send/recv in rank-parity order.",
        "",
        "Local (this host, ranks spawned by the witness itself):",
        "",
        "```sh",
        "envport witness NAME --target venv            # ~/.envport/envs/NAME/bin/python",
        "envport witness NAME --target docker          # envport/NAME:<hash12>, witnesses mounted read-only",
        "python src/envport/witness/scripts/dist.py --world-size 4 --checks collectives,dtensor --mesh 2,2",
        "```",
        "",
        "Slurm (one process per rank; `dist.py` runs just its own rank from "
        "`SLURM_PROCID`/`SLURM_NTASKS`/`SLURM_LOCALID`):",
        "",
        "```sh",
        "#SBATCH --nodes=1 --ntasks=4 --gpus-per-node=4 --time=00:15:00",
        "export MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n1)",
        "export MASTER_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind((\"\", 0)); "
        "print(s.getsockname()[1])')",
        *[f"export {k}={v}" for k, v in HARDENING_ENV.items()],
        "srun --label --kill-on-bad-exit=1 python WITNESS_DIR/dist.py --launch external \\",
        "    --checks collectives,dtensor --mesh 2,2 --device cuda --deadline 600",
        "```",
        "",
        "`--label` prefixes each line with its task, so the stack a rank's watchdog dumps at the "
        "deadline (and on scancel's SIGTERM) names the rank. On a CPU-only Slurm node add "
        "`--overcommit` when tasks exceed CPUs (`srun -n 4` on 2 CPUs otherwise pends forever) "
        "and use `--device cpu`. WITNESS_DIR is `src/envport/witnesses` in a checkout (measured here: "
        "`srun -n 2 --overcommit` on the one-node test cluster passes in ~4 s).",
        "",
        f"Verdict: {report['verdict']}.",
        "",
    ]
    return "\n".join(out)

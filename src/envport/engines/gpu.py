"""GPU probes: what nvidia-smi says about this host's GPUs, driver and topology.

The doctor, the witness planner and preflight all ask here, so a GPU count or
a driver version is read one way everywhere.
"""

from __future__ import annotations

import re
import shutil
from typing import Optional

from envport.core.proc import run


def _num(text: str) -> Optional[float]:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None  # "[N/A]" and friends


def gpu_inventory(nvidia_smi: str = "nvidia-smi") -> dict:
    """GPUs as nvidia-smi sees them; {"nvidia_smi": None, "gpus": []} where it is absent."""
    path = shutil.which(nvidia_smi)
    out: dict = {"nvidia_smi": path, "driver": None, "cuda_driver": None, "gpus": [], "error": None}
    if path is None:
        return out
    fields = "index,uuid,name,memory.total,memory.used,driver_version,compute_cap"
    res = run([path, f"--query-gpu={fields}", "--format=csv,noheader,nounits"])
    if res.returncode not in (None, 0):  # drivers before 510 have no compute_cap field
        fields = fields.rsplit(",", 1)[0]
        res = run([path, f"--query-gpu={fields}", "--format=csv,noheader,nounits"])
    if not res.ok:
        out["error"] = ((res.stderr or res.stdout).strip().splitlines() or ["nvidia-smi failed"])[-1] \
            if res.returncode is not None else "nvidia-smi did not answer"
        return out
    busy: dict[str, int] = {}
    apps = run([path, "--query-compute-apps=gpu_uuid,pid", "--format=csv,noheader"])
    if apps.ok:
        for line in apps.stdout.splitlines():
            uuid = line.split(",")[0].strip()
            if uuid:
                busy[uuid] = busy.get(uuid, 0) + 1
    for line in res.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 6:
            continue
        total, used = _num(parts[3]), _num(parts[4])
        cap = parts[6] if len(parts) > 6 and re.match(r"^\d+\.\d+$", parts[6]) else None
        procs = busy.get(parts[1], 0)
        out["driver"] = parts[5]
        out["gpus"].append({
            "index": int(parts[0]), "uuid": parts[1], "name": parts[2],
            "memory_total_mib": total, "memory_used_mib": used, "compute_capability": cap,
            "processes": procs,
            # Someone else's job on a shared node: a process, or memory taken beyond the driver's own.
            "in_use": procs > 0 or bool(total and used and used > 0.05 * total),
        })
    header = run([path])
    if header.ok:
        m = re.search(r"CUDA Version:\s*([\d.]+)", header.stdout)
        out["cuda_driver"] = m[1] if m else None
    return out


def topology(nvidia_smi: str = "nvidia-smi") -> Optional[str]:
    path = shutil.which(nvidia_smi)
    if path is None:
        return None
    res = run([path, "topo", "-m"])
    return res.stdout.rstrip() if res.ok else None


def gpu_count() -> int:
    return len(gpu_inventory().get("gpus", []))

"""GPU probes: what nvidia-smi says about this host's GPUs, driver and topology.

The doctor, the witness planner and preflight all ask here, so a GPU count or
a driver version is read one way everywhere.  nvidia-smi answers "[N/A]",
"[Not Supported]" or "[Unknown Error]" for any field a driver, a MIG slice or
a sandboxed runtime (gVisor) cannot read; every field is parsed so that such
an answer is None, never a crash and never a made-up number.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from typing import Optional

from envport.core.finding import Finding
from envport.core.proc import run
from envport.core.verdict import NO_ACCELERATOR_REASON, Verdict

# Where a GPU run goes when this host has too few GPUs.
GPU_ROUTE = "run on a GPU node (`envport doctor` shows the Slurm route), or set resources.gpus: 0 for a CPU run"

QUERY_FIELDS = "index,uuid,name,memory.total,memory.used,driver_version,compute_cap"


def _text(value: Optional[str]) -> Optional[str]:
    """A field's text, or None for nvidia-smi's "[N/A]", "N/A", "[Not Supported]", "[Unknown Error]"."""
    if value is None:
        return None
    text = value.strip()
    if not text or text.startswith("[") or text.upper() in ("N/A", "NOT SUPPORTED", "UNKNOWN ERROR"):
        return None
    return text


def _num(text: Optional[str]) -> Optional[float]:
    try:
        return float(_text(text))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def _int(text: Optional[str]) -> Optional[int]:
    value = _num(text)
    return int(value) if value is not None and value == int(value) else None


def gpu_inventory(nvidia_smi: str = "nvidia-smi") -> dict:
    """GPUs as nvidia-smi sees them; {"nvidia_smi": None, "gpus": []} where it is absent.

    `odd` lists answer lines that are not GPU rows (a sandbox's shim printing
    something else): they are reported, not counted.
    """
    path = shutil.which(nvidia_smi)
    out: dict = {"nvidia_smi": path, "driver": None, "cuda_driver": None, "gpus": [], "error": None, "odd": []}
    if path is None:
        return out
    fields = QUERY_FIELDS
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
            uuid = _text(line.split(",")[0])
            if uuid:
                busy[uuid] = busy.get(uuid, 0) + 1
    for line in res.stdout.splitlines():
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 6:
            out["odd"].append(line.strip())
            continue
        uuid = _text(parts[1])
        total, used = _num(parts[3]), _num(parts[4])
        cap = _text(parts[6]) if len(parts) > 6 else None
        cap = cap if cap and re.match(r"^\d+\.\d+$", cap) else None
        procs = busy.get(uuid, 0) if uuid else 0
        out["driver"] = out["driver"] or _text(parts[5])
        index = _int(parts[0])
        out["gpus"].append({
            "index": index if index is not None else len(out["gpus"]),
            "uuid": uuid, "name": _text(parts[2]) or "unknown GPU",
            "memory_total_mib": total, "memory_used_mib": used, "compute_capability": cap,
            "processes": procs,
            # Someone else's job on a shared node: a process, or memory taken beyond the driver's own.
            "in_use": procs > 0 or bool(total and used and used > 0.05 * total),
        })
    if out["odd"] and not out["gpus"]:
        out["error"] = f"nvidia-smi answered oddly: {out['odd'][0]!r}"
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


# `nvidia-smi topo -m`'s legend: NV# is # bonded NVLinks; PIX, PXB, PHB and NODE
# go through PCIe (one switch, several switches, the host bridge, host bridges
# within a NUMA node); SYS crosses the SMP interconnect between NUMA nodes.
_PCIE_LINKS = {"PIX": "one PCIe switch", "PXB": "several PCIe switches", "PHB": "a PCIe host bridge",
               "NODE": "PCIe host bridges within a NUMA node"}


def topology_pairs(text: Optional[str]) -> list[dict]:
    """GPU pairs from `nvidia-smi topo -m`: [{"a": 0, "b": 1, "link": "NV18", "kind": "nvlink", ...}]."""
    if not text:
        return []
    header: list[str] = []
    rows: dict[int, list[str]] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.split("\t")]
        if not header and any(re.fullmatch(r"GPU\d+", c) for c in cells[1:]):
            header = cells
            continue
        if header and cells and re.fullmatch(r"GPU\d+", cells[0] or ""):
            rows[int(cells[0][3:])] = cells
    gpu_cols = {i: int(name[3:]) for i, name in enumerate(header) if re.fullmatch(r"GPU\d+", name)}
    pairs = []
    for a, cells in sorted(rows.items()):
        for col, b in sorted(gpu_cols.items(), key=lambda kv: kv[1]):
            if b <= a or col >= len(cells):
                continue
            link = cells[col]
            if re.fullmatch(r"NV\d+", link):
                kind, via = "nvlink", f"{link[2:]} NVLink(s)"
            elif link in _PCIE_LINKS:
                kind, via = "pcie", _PCIE_LINKS[link]
            elif link == "SYS":
                kind, via = "sys", "PCIe and the SMP interconnect between NUMA nodes"
            else:
                kind, via = "unknown", link
            pairs.append({"a": a, "b": b, "link": link, "kind": kind, "via": via})
    return pairs


def smi_count(inv: dict) -> Optional[int]:
    """GPUs gpu_inventory()'s answer INV lists; None where there is no nvidia-smi or it did not answer."""
    if inv["nvidia_smi"] is None or (inv["error"] and not inv["gpus"]):
        return None
    return len(inv["gpus"])


def gpu_count() -> Optional[int]:
    """GPUs nvidia-smi lists here; None where there is no nvidia-smi or it did not answer."""
    return smi_count(gpu_inventory())


@dataclass(frozen=True)
class GpuCensus:
    """GPUs counted three ways: nvidia-smi, the env's own torch and the env's own JAX.  None: that one could not
    be asked (or, for JAX, is not installed)."""

    smi: Optional[int]
    torch: Optional[int]
    where: str = "this host"  # or "the Slurm allocation (gres gpu:4)"
    # A provider's accelerator is not always torch's: a CPU-only torch can sit beside a JAX that drives the card.
    jax: Optional[int] = None
    # The cards the judging framework listed ({index, name, capability, seen_by}) and nvidia-smi's driver
    # version: what a witness statement says it ran on (model, capability, driver), not only how many.
    devices: tuple = ()
    driver: Optional[str] = None

    @property
    def count(self) -> int:
        """Whichever sees more: a sandbox without nvidia-smi still has the GPUs torch (or JAX) sees."""
        return max(self.smi or 0, self.torch or 0, self.jax or 0)

    @property
    def judged_by(self) -> str:
        """The framework whose view the env's GPUs are counted by: torch, else JAX where only it sees them."""
        return "jax" if (self.jax or 0) > (self.torch or 0) else "torch"

    @property
    def note(self) -> str:
        """Why the counts differ, when they do ("" when they agree or only one was asked)."""
        if self.smi is None or self.torch is None or self.smi == self.torch:
            return ""
        if self.torch < self.smi:
            if (self.jax or 0) >= self.smi:
                return (f"nvidia-smi lists {self.smi} GPU(s) and the env's JAX sees {self.jax}; its torch sees "
                        f"{self.torch} (a CPU build beside a JAX on the GPU): the GPUs are judged by JAX")
            return (f"nvidia-smi lists {self.smi} GPU(s) but the env's torch sees {self.torch}: a CPU build of "
                    "torch, a driver older than torch's CUDA build, or CUDA_VISIBLE_DEVICES")
        return (f"the env's torch sees {self.torch} GPU(s) but nvidia-smi lists {self.smi}: nvidia-smi is "
                "missing or answers oddly here (a sandboxed runtime?)")

    def to_dict(self) -> dict:
        jax = {} if self.jax is None else {"jax": self.jax}  # only where JAX is installed: the torch shape stays
        seen = {"devices": [dict(d) for d in self.devices]} if self.devices else {}
        driver = {"driver": self.driver} if self.driver else {}
        return {"nvidia_smi": self.smi, "torch": self.torch, **jax, "count": self.count, "where": self.where,
                "note": self.note, **seen, **driver}


def census_from_gres(gres: Optional[str]) -> GpuCensus:
    """The GPUs a Slurm job asks for: "gpu:4" or "gpu:a100:4" -> 4 (a bare "gpu" is one)."""
    count = 0
    for item in (gres or "").split(","):
        parts = item.strip().split(":")
        if parts and parts[0] == "gpu":
            count += int(parts[-1]) if len(parts) > 1 and parts[-1].isdigit() else 1
    return GpuCensus(count, None, where=f"the Slurm allocation (gres {gres or 'none'})")


def judge_gpus(inv: dict, want: int = 1, torch_seen: Optional[int] = None, fix: str = GPU_ROUTE,
               seen_by: str = "torch") -> Finding:
    """Whether `want` GPUs are here: the one judgement preflight (the spec's resources.gpus) and doctor
    (one GPU for the GPU witnesses) make of gpu_inventory()'s answer.

    GPUs a probed torch sees that nvidia-smi does not list (a sandbox) count: nothing says otherwise.
    `seen_by` names the framework whose count `torch_seen` is (JAX where a CPU torch sits beside it).
    The evidence of a refusal is what was seen: no nvidia-smi, its error, or how many it lists.
    """
    listed = len(inv.get("gpus") or [])
    count = max(listed, torch_seen or 0)
    if count >= want:
        seen = f", {seen_by} sees {torch_seen}" if torch_seen is not None else ""
        return Finding("", f"nvidia-smi lists {listed} GPU(s){seen}", check="gpus", verdict=Verdict.OK)
    if not inv.get("nvidia_smi"):
        why = "this host has no nvidia-smi (no NVIDIA driver)"
    else:
        why = inv.get("error") or f"nvidia-smi lists {listed}"
    return Finding(NO_ACCELERATOR_REASON, why, fix, check="gpus")

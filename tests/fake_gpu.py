"""A fake `nvidia-smi` for tests: no GPU can be had on this machine, so a small
executable put first on PATH answers the queries envport sends, with the
fields and odd answers real drivers and sandboxes give (a mock, and the tests
that use it say so).  Plain helpers, no fixtures.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

H200 = {"name": "NVIDIA H200", "memory_total": "143771", "memory_used": "0", "compute_cap": "9.0"}

# `nvidia-smi topo -m` of a 4-GPU NVLink box, as the driver prints it (tabs between cells).
TOPO_4_NVLINK = (
    "\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
    "GPU0\t X \tNV18\tNV18\tSYS\t0-47\t0\t\tN/A\n"
    "GPU1\tNV18\t X \tNV18\tPIX\t0-47\t0\t\tN/A\n"
    "GPU2\tNV18\tNV18\t X \tNODE\t0-47\t0\t\tN/A\n"
    "GPU3\tSYS\tPIX\tNODE\t X \t48-95\t1\t\tN/A\n"
    "\n"
    "Legend:\n\n"
    "  X    = Self\n"
    "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)\n"
    "  NV#  = Connection traversing a bonded set of # NVLinks\n"
)

_SCRIPT = r'''#!{python}
import json, sys
cfg = json.load(open({cfg!r}))
args = sys.argv[1:]
if cfg.get("fail"):
    sys.stderr.write(cfg["fail"] + "\n"); sys.exit(9)
if any(a.startswith("--query-gpu=") for a in args):
    if cfg.get("odd") is not None:
        print(cfg["odd"]); sys.exit(0)
    for i, g in enumerate(cfg["gpus"]):
        print(", ".join([g.get("index", str(i)), g.get("uuid", "GPU-%08d-fake" % i), g["name"],
                         g["memory_total"], g["memory_used"], cfg["driver"], g["compute_cap"]]))
elif any(a.startswith("--query-compute-apps=") for a in args):
    for line in cfg.get("apps", []):
        print(line)
elif args[:2] == ["topo", "-m"]:
    sys.stdout.write(cfg.get("topo") or "")
else:
    print("| NVIDIA-SMI %s    Driver Version: %s    CUDA Version: %s |" % (cfg["driver"], cfg["driver"], cfg["cuda"]))
'''


def fake_nvidia_smi(bin_dir: Path, gpus: list[dict], driver: str = "580.95.05", cuda: str = "13.0",
                    topo: str | None = None, odd: str | None = None, fail: str | None = None,
                    apps: list[str] | None = None) -> Path:
    """Write BIN_DIR/nvidia-smi answering for `gpus` (dicts like H200; any field may be "[N/A]")."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    cfg = bin_dir / "nvidia-smi.json"
    cfg.write_text(json.dumps({"gpus": gpus, "driver": driver, "cuda": cuda, "topo": topo, "odd": odd,
                               "fail": fail, "apps": apps or []}))
    path = bin_dir / "nvidia-smi"
    path.write_text(_SCRIPT.format(python=sys.executable, cfg=str(cfg)))
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def path_with(bin_dir: Path) -> str:
    return f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"

"""How fast `envport up` refuses in preflight, against the one-second budget (seed 002: "a machine that
cannot run this provider learns so in a second rather than after 16 GB"). Ratios below 1 meet it.

    python bench/bench_preflight.py [--runs 3]

Three refusals, each a real check on this host: a fake low-disk threshold (--min-free-gb 10000000),
a GPU env (resources.gpus 1) on a host without nvidia-smi, and a missing runtime (docker hidden from
PATH). Prints, per case, the median of the whole `envport up` process and of the preflight step itself.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
BUDGET_S = 1.0


def up(root: Path, *args: str, env: dict | None = None) -> tuple[float, dict, int]:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "envport", "-C", str(root), "up", *args, "--json"], cwd=root,
                          capture_output=True, text=True, timeout=600, env=env)
    wall = time.monotonic() - t0
    return wall, json.loads(proc.stdout), proc.returncode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="envport-bench-preflight-") as tmp:
        root = Path(tmp)
        for d in ("specs", "sites", "slurm"):
            shutil.copytree(REPO / d, root / d)
        gpu = yaml.safe_load((root / "specs" / "demo-cpu.yaml").read_text())
        gpu.update(name="gpu-demo", resources={"gpus": 1}, sm_range=["sm_80", "sm_90"])
        (root / "specs" / "gpu-demo.yaml").write_text(yaml.safe_dump(gpu))
        env = {**os.environ, "ENVPORT_STATE_DIR": str(root / "state"), "ENVPORT_WEIGHTS_DIR": str(root / "w")}
        cases = [
            ("low disk (--min-free-gb 1e7)", ["demo-cpu", "--target", "venv", "--min-free-gb", "10000000"], env),
            ("GPU env, no GPU here", ["gpu-demo", "--target", "venv"], env),
            ("missing runtime (docker off PATH)", ["demo-cpu", "--target", "docker"], {**env, "PATH": "/nonexistent"}),
        ]
        print(f"{'case':<36} {'exit':>4} {'reason':<16} {'process':>9} {'preflight':>10} {'process/1s':>11}")
        for label, argv, case_env in cases:
            walls, steps = [], []
            for _ in range(args.runs):
                wall, out, code = up(root, *argv, env=case_env)
                walls.append(wall)
                steps.append(out["steps"][0]["seconds"])
            reason = out["steps"][0].get("reason", "")
            w, s = statistics.median(walls), statistics.median(steps)
            print(f"{label:<36} {code:>4} {reason:<16} {w:8.3f}s {s:9.3f}s {w / BUDGET_S:10.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Witness suite wall time in docker vs the same scripts on the host, as a ratio from one run.

    python bench/bench_witness.py [--image envport/demo-cpu:latest] [--python PATH] [--world-size 2]

The same spec-less suite (python, import torch, kernel, collectives, DTensor)
runs once through the docker launcher and once through the local launcher;
the ratio is docker / host.  Skips with a message (exit 0) when no docker
engine answers, the image is absent, or no host interpreter has torch.
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

from envport.witness.launchers.docker import DockerLauncher  # noqa: E402

from envport.witness.launchers.local import LocalLauncher  # noqa: E402
from envport.engines.docker import engine_problem, image_exists  # noqa: E402
from envport.spec.model import Spec  # noqa: E402
from envport.witness.run import WitnessOptions, run_witnesses  # noqa: E402


def host_python(given: str | None) -> str | None:
    candidates = [given] if given else [sys.executable, str(REPO / ".cache" / "witness-venv" / "bin" / "python")]
    for python in candidates:
        if python and Path(python).exists() and subprocess.run(
                [python, "-c", "import torch"], capture_output=True).returncode == 0:
            return python
    return None


def timed(spec: Spec, launcher) -> tuple[float, list]:
    t = time.monotonic()
    results = run_witnesses(spec, launcher, WitnessOptions(deadline_s=300))
    return time.monotonic() - t, results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--image", default="envport/demo-cpu:latest")
    ap.add_argument("--python", default=None, help="host interpreter with torch (default: this one, or .cache/witness-venv)")
    ap.add_argument("--world-size", type=int, default=2)
    args = ap.parse_args()

    why = engine_problem()
    if why:
        print(f"skipped: no docker engine answers ({why})")
        return 0
    if not image_exists(args.image):
        print(f"skipped: image {args.image} is not on this engine (build it with the docker target)")
        return 0
    python = host_python(args.python)
    if python is None:
        print("skipped: no host interpreter with torch (pip install torch==2.13.0 into .cache/witness-venv)")
        return 0
    side = math.isqrt(args.world_size)
    mesh = [side, side] if side * side == args.world_size and side > 1 else [args.world_size]
    spec = Spec(name="bench", base="debian:bookworm", python="3.11",
                witnesses={"imports": ["torch"], "kernel": True,
                           "collectives": {"world_size": args.world_size}, "dtensor": {"mesh": mesh}})
    host_s, host_res = timed(spec, LocalLauncher(python))
    docker_s, docker_res = timed(spec, DockerLauncher(args.image))
    for label, res in (("host", host_res), ("docker", docker_res)):
        bad = [r for r in res if not r.verdict.ok and r.step != "python"]
        if bad:
            print(f"warning: {label} run had {len(bad)} failing check(s): {bad[0].step}: {bad[0].detail}")
    print(f"witness suite (world {args.world_size}, mesh {'x'.join(map(str, mesh))}, {len(host_res)} checks)")
    print(f"  host   {host_s:6.1f}s  ({python})")
    print(f"  docker {docker_s:6.1f}s  ({args.image})")
    print(f"  ratio docker/host: {docker_s / host_s:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

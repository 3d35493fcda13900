"""How fast envport gives up when it must, as ratios (moved here from tests: wall-clock asserts flake on a
loaded machine and prove nothing about correctness, which the tests check by reason and detail).

    python bench/bench_refusals.py [--runs 3]

- ssh: `envport witness/verify/build --host ssh://root@127.0.0.1:1` (connection refused) against the
  ssh client's ConnectTimeout (10 s): a ratio well below 1 means the refusal did not wait for a timeout.
- slurm: `envport slurm submit` of a job Slurm keeps PENDING with max_pending 3s: seconds to REFUSED
  pending_timeout over max_pending (about 1 plus the poll interval and sbatch/scancel overhead).
  Prints a message instead when no Slurm answers (.ci/services/slurm-up.sh).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
SSH_CONNECT_TIMEOUT_S = 10
MAX_PENDING_S = 3


def envport(root: Path, *args: str) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "envport", "-C", str(root), *args], cwd=root,
                          capture_output=True, text=True, timeout=600)
    return time.monotonic() - t0, proc


def project(tmp: Path) -> Path:
    for d in ("specs", "sites", "slurm"):
        if (REPO / d).is_dir():
            subprocess.run(["cp", "-r", str(REPO / d), str(tmp / d)], check=True)
    return tmp


def bench_ssh(root: Path, runs: int) -> None:
    host = "ssh://root@127.0.0.1:1"
    for cmd in (["witness", "--no-ledger"], ["verify"], ["build"]):
        secs = []
        for _ in range(runs):
            took, proc = envport(root, cmd[0], "demo-cpu", "--target", "venv", "--host", host, *cmd[1:])
            if proc.returncode != 3:
                print(f"ssh {cmd[0]}: expected exit 3 (REFUSED), got {proc.returncode}: {proc.stdout[-300:]}")
                return
            secs.append(took)
        med = statistics.median(secs)
        print(f"ssh {cmd[0]:8s} refused in {med:5.2f}s median of {runs}; / ConnectTimeout {SSH_CONNECT_TIMEOUT_S}s "
              f"= {med / SSH_CONNECT_TIMEOUT_S:.2f}")


def bench_slurm(root: Path, runs: int) -> None:
    up = subprocess.run(["bash", str(REPO / ".ci" / "services" / "slurm-up.sh")], capture_output=True, text=True)
    if up.returncode != 0:
        print(f"slurm: not up ({up.stderr.strip()}); start it with .ci/services/slurm.sh")
        return
    cpus = int(up.stdout.split()[2])
    profile = {"name": "bench-pends", "partition": "debug", "time": "00:05:00", "container_runtime": "docker",
               "cache_dir": str(root / "jobs"), "max_pending": f"{MAX_PENDING_S}s", "cpus": cpus * 32}
    path = root / "slurm" / "clusters" / "bench-pends.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(profile, sort_keys=False))
    secs = []
    for _ in range(runs):
        took, proc = envport(root, "slurm", "submit", "demo-cpu", "--cluster", "bench-pends", "--target", "venv",
                             "--check", "python", "--no-ledger")
        if proc.returncode != 3:
            print(f"slurm: expected exit 3 (REFUSED pending_timeout), got {proc.returncode}: {proc.stdout[-300:]}")
            return
        secs.append(took)
    med = statistics.median(secs)
    print(f"slurm pending refused in {med:5.2f}s median of {runs}; / max_pending {MAX_PENDING_S}s "
          f"= {med / MAX_PENDING_S:.2f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="envport-bench-") as tmp:
        root = project(Path(tmp))
        bench_ssh(root, args.runs)
        bench_slurm(root, args.runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())

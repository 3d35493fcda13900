"""`envport matrix --run --jobs 2` against the same pairs run one after another, side by side in one run.

    python bench/bench_matrix.py [--env demo-cpu] [--targets venv,docker,ssh,apptainer] [--rounds 1]
                                 [--json bench/results/matrix.json]

The pairs (default demo-cpu on venv, docker, venv over SSH and apptainer: the pairs
CI's matrix runs) are first brought up once, unmeasured, so every measured run finds each
env present and does the same work: preflight, weights, verify and the
witness suite per pair. Then, per round, `--jobs 1` (one after another) and
`--jobs 2` (docker pairs still one at a time) in ABBA order across rounds, and
the ratio of the totals (goal <= 0.7). Runs in a throwaway copy of the project,
with its own state dir and env folders under /var/tmp/envport-bench-matrix
(kept between runs, so a second run starts present); needs the docker engine
with envport/debian-bookworm:base and the test sshd (.ci/services/sshd.sh).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ENVS = Path(os.environ.get("ENVPORT_BENCH_ENVS", "/var/tmp/envport-bench-matrix"))


def matrix(root: Path, env: dict, name: str, targets: str, jobs: int, tag: str) -> tuple[float, dict]:
    summary = root / "reports" / f"matrix-{tag}.md"
    argv = [sys.executable, "-m", "envport", "-C", str(root), "matrix", "--run", "--jobs", str(jobs), "--env", name,
            "--target", targets, "--json", "--junit", str(root / "reports" / f"matrix-{tag}.xml"),
            "--summary", str(summary)]
    t0 = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=3600, env=env, cwd=root)
    wall = time.monotonic() - t0
    try:
        out = json.loads(proc.stdout)
    except ValueError:
        raise SystemExit(f"matrix --jobs {jobs} gave no JSON (exit {proc.returncode}):\n{proc.stderr[-3000:]}") from None
    if proc.returncode != 0:
        print(summary.read_text() if summary.exists() else proc.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"matrix --jobs {jobs} exited {proc.returncode}")
    return wall, out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--env", default="demo-cpu")
    ap.add_argument("--targets", default="venv,docker,ssh,apptainer")
    ap.add_argument("--rounds", type=int, default=1, help="pairs of measured runs, ABBA order (default 1)")
    ap.add_argument("--json", default=str(REPO / "bench" / "results" / "matrix.json"))
    args = ap.parse_args()
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="envport-bench-matrix-") as tmp:
        root = Path(tmp) / "project"
        for d in ("specs", "sites", "images"):
            shutil.copytree(REPO / d, root / d)
        (ENVS / "local").mkdir(parents=True, exist_ok=True)
        (ENVS / "ssh").mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "ENVPORT_ENVS_DIR": str(ENVS / "local"), "ENVPORT_SSH_ENVS_DIR": str(ENVS / "ssh"),
               "ENVPORT_STATE_DIR": str(Path(tmp) / "state")}
        print(f"pairs: {args.env} x {args.targets} (warm-up: bringing each up once, unmeasured)", flush=True)
        warm_s, warm = matrix(root, env, args.env, args.targets, 1, "warmup")
        pairs = [s["step"] for s in warm["steps"] if s["verdict"] != "skipped"]
        skipped = [f"{s['step']}: {s['detail']}" for s in warm["steps"] if s["verdict"] == "skipped"]
        print(f"  {warm_s:.1f}s; ran {', '.join(pairs)}" + (f"; skipped {'; '.join(skipped)}" if skipped else ""))
        order = []
        for i in range(args.rounds):
            order += [1, 2] if i % 2 == 0 else [2, 1]
        walls: dict[int, list[float]] = {1: [], 2: []}
        per_pair: dict[int, list[dict]] = {1: [], 2: []}
        for n, jobs in enumerate(order):
            wall, out = matrix(root, env, args.env, args.targets, jobs, f"j{jobs}-{n}")
            walls[jobs].append(wall)
            per_pair[jobs].append({s["step"]: round(s["seconds"], 1) for s in out["steps"] if s["verdict"] != "skipped"})
            print(f"  --jobs {jobs}: {wall:.1f}s  {per_pair[jobs][-1]}", flush=True)
    seq, par = sum(walls[1]), sum(walls[2])
    ratio = par / seq
    result = {"env": args.env, "targets": args.targets.split(","), "pairs": pairs, "skipped": skipped,
              "rounds": args.rounds, "order": order, "sequential_s": [round(w, 2) for w in walls[1]],
              "parallel_jobs2_s": [round(w, 2) for w in walls[2]], "per_pair_s": per_pair,
              "ratio": round(ratio, 3), "goal": "<= 0.7", "cores": os.cpu_count(),
              "load_1min_before": round(load, 2)}
    print(f"one after another (--jobs 1): {seq:.1f}s; --jobs 2: {par:.1f}s; ratio {ratio:.2f} (goal <= 0.7)")
    out_path = Path(args.json)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

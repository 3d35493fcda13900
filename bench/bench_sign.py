"""Signing and checking a SIF against hashing it: `envport sign` and `envport verify-sig` vs `sha256sum`.

    python bench/bench_sign.py [--sif FILE | --spec NAME] [--repeat N] [--json bench/results/sign.json]

Signing is hashing (every object's sha256, then one Ed25519 signature over a
few hundred bytes), and so is checking: the goal is each <= 1.2x the time of
`sha256sum FILE`, all three run as whole processes on the same file, warm in
the page cache, --repeat times (default 5) in alternation; the ratios of the
medians are printed side by side. Each sign round signs a fresh unsigned copy
(the copy is not timed). Without --sif the SIF of --spec (default tiny-sif, a
small env with no torch; demo-cpu for the issue's number) is built first with
envport's own builder in a throwaway copy of the project (root, the docker
engine with envport/debian-bookworm:base, squashfs-tools, bwrap).
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

REPO = Path(__file__).resolve().parent.parent
GOAL = 1.2


def timed(argv: list[str], env: dict | None = None) -> float:
    t0 = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env)
    seconds = time.monotonic() - t0
    if proc.returncode != 0:
        sys.exit(f"bench_sign: {' '.join(argv)} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}")
    return seconds


def build_sif(spec: str, work: Path) -> Path:
    sys.path.insert(0, str(REPO))
    from tests.support import copy_project, write_site, write_spec

    root = copy_project(work / "project")
    if spec != "demo-cpu":
        write_spec(root, spec)
    write_site(root, "bench-sign", apptainer={"compression": "lz4"})
    site = ["--site", "bench-sign"] if spec != "demo-cpu" else []
    proc = subprocess.run([sys.executable, "-m", "envport", "-C", str(root), "build", spec, "--target", "apptainer",
                           "--json", *site], capture_output=True, text=True,
                          env={**os.environ, "ENVPORT_SIF_BUILDER": "envport"})
    if proc.returncode != 0:
        sys.exit(f"bench_sign: building {spec}'s SIF failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return Path(json.loads(proc.stdout)["steps"][-1]["data"]["sif"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sif", type=Path, help="an unsigned SIF to measure (default: build --spec's)")
    ap.add_argument("--spec", default="tiny-sif")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", type=Path, help="write the numbers here too")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO))
    from tests.test_sif_sign import new_key

    with tempfile.TemporaryDirectory(prefix="bench-sign-", dir="/var/tmp") as tmp:
        work = Path(tmp)
        sif = args.sif or build_sif(args.spec, work)
        priv, pub = new_key(work, "ed25519")
        copy = work / "signed.sif"
        envport = [sys.executable, "-m", "envport"]
        times: dict[str, list[float]] = {"sha256sum": [], "sign": [], "verify-sig": []}
        timed(["sha256sum", str(sif)])  # warm the page cache
        for _ in range(args.repeat):
            shutil.copyfile(sif, copy)
            times["sha256sum"].append(timed(["sha256sum", str(copy)]))
            times["sign"].append(timed([*envport, "sign", str(copy), "--key", str(priv)]))
            times["verify-sig"].append(timed([*envport, "verify-sig", str(copy), "--key", str(pub)]))
        size = sif.stat().st_size
    med = {k: statistics.median(v) for k, v in times.items()}
    ratios = {k: med[k] / med["sha256sum"] for k in ("sign", "verify-sig")}
    print(f"SIF {sif.name}: {size / 2**20:.0f} MiB, {args.repeat} rounds, medians (min)")
    for k, v in times.items():
        ratio = f"  {ratios[k]:.2f}x sha256sum (goal <= {GOAL}x: {'met' if ratios[k] <= GOAL else 'NOT met'})" \
            if k in ratios else ""
        print(f"  {k:<11} {med[k]:6.2f} s ({min(v):.2f}){ratio}")
    if args.json:
        args.json.write_text(json.dumps({"sif": sif.name, "bytes": size, "repeat": args.repeat, "seconds": times,
                                         "median": med, "ratio_to_sha256sum": ratios, "goal": GOAL},
                                        indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

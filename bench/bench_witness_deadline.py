"""How fast a stuck or broken witness group ends, as ratios to its deadline, from one run each.

    python bench/bench_witness_deadline.py [--python PATH] [--deadline 20]

The timing the witness tests used to assert on (tests never assert on time):
  hang     one rank hangs (ENVPORT_WITNESS_FAULT=hang:1): the group must end at
           its deadline with every stack dumped; ratio = elapsed / deadline
           (goal <= 1.5: the deadline plus the dump and kill, launch included).
  crash    one rank dies (crash:1): its peers must end at once, not at the
           deadline; ratio = elapsed / deadline (goal well under 1).
  cli      a CLI check that sleeps 30 s under --timeout 2; ratio = elapsed / 2.
Skips with a message (exit 0) when no interpreter has torch.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

from envport.spec.model import Spec  # noqa: E402
from envport.witness.launchers.base import WITNESS_DIR  # noqa: E402
from envport.witness.launchers.local import LocalLauncher  # noqa: E402
from envport.witness.run import WitnessOptions, run_witnesses  # noqa: E402


def host_python(given: str | None) -> str | None:
    candidates = [given] if given else [sys.executable, str(REPO / ".cache" / "witness-venv" / "bin" / "python")]
    for python in candidates:
        if python and Path(python).exists() and subprocess.run(
                [python, "-c", "import torch"], capture_output=True).returncode == 0:
            return python
    return None


def group(python: str, deadline: float, fault: str) -> tuple[float, str]:
    spec = Spec(name="bench", base="debian:bookworm", python="3.11", witnesses={"collectives": {"world_size": 2}})
    t = time.monotonic()
    (res,) = run_witnesses(spec, LocalLauncher(python),
                           WitnessOptions(only=["collectives"], device="cpu", deadline_s=deadline, fault=fault))
    return time.monotonic() - t, f"{res.verdict.value}: {res.detail}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", default=None)
    ap.add_argument("--deadline", type=float, default=20.0)
    args = ap.parse_args()
    python = host_python(args.python)
    if python is None:
        print("skipped: no interpreter with torch (pass --python PATH)")
        return 0
    hang_s, hang = group(python, args.deadline, "hang:1")
    crash_s, crash = group(python, 240.0, "crash:1")
    t = time.monotonic()
    subprocess.run([sys.executable, str(WITNESS_DIR / "basic.py"), "--timeout", "2",
                    "--cli", json.dumps({"cmd": "sleep 30", "expect": "x"})], capture_output=True, timeout=120)
    cli_s = time.monotonic() - t
    print(f"{'case':<6} {'elapsed':>8} {'limit':>7} {'ratio':>6}  verdict")
    print(f"{'hang':<6} {hang_s:7.1f}s {args.deadline:6.0f}s {hang_s / args.deadline:6.2f}  {hang[:90]}")
    print(f"{'crash':<6} {crash_s:7.1f}s {240:6.0f}s {crash_s / 240:6.2f}  {crash[:90]}")
    print(f"{'cli':<6} {cli_s:7.1f}s {2:6.0f}s {cli_s / 2:6.2f}  (sleep 30 under --timeout 2)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What replaying every step into a fresh venv costs, with and without pip's cache, as ratios from one run.

    python bench/bench_shell_replay.py [--spec demo-cpu] [--envs DIR]

A venv build is never patched in place: any change to the spec replays every
step into a fresh env beside the old one (docs/cli.md, "Shell builds").  This
measures, on the same spec with the host's own pip configuration (demo-cpu:
torch from the host's local wheel, six from PyPI):

  cold      the first build, empty envs dir (pip cache as the host has it)
  present   the no-op build (hash + installed-distribution check)
  replay    after an edit of the spec's env (a new hash, same packages), pip cache warm
  nocache   the same replay with PIP_NO_CACHE_DIR=1
  venv      `python -m venv` alone, the floor every replay pays

and prints each in seconds plus replay/cold, nocache/replay and venv/replay.
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

import yaml

REPO = Path(__file__).resolve().parent.parent


def build(root: Path, name: str, env: dict) -> tuple[float, str]:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "envport", "-C", str(root), "build", name, "--target", "venv",
                           "--json"], capture_output=True, text=True, env=env, timeout=3600)
    took = time.monotonic() - t0
    if proc.returncode != 0:
        sys.exit(f"build failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return took, json.loads(proc.stdout)["steps"][-1]["verdict"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default="demo-cpu")
    ap.add_argument("--envs", default=None, help="envs dir (default: a temporary one, removed afterwards)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="envport-replay-"))
    try:
        root = work / "project"
        for d in ("specs", "sites"):
            shutil.copytree(REPO / d, root / d)
        envs = Path(args.envs) if args.envs else work / "envs"
        env = {**os.environ, "ENVPORT_ENVS_DIR": str(envs), "ENVPORT_STATE_DIR": str(work / "state")}
        spec_path = root / "specs" / f"{args.spec}.yaml"
        data = yaml.safe_load(spec_path.read_text())
        python = f"python{data['python']}"

        cold, _ = build(root, args.spec, env)
        present, verdict = build(root, args.spec, env)
        assert verdict == "present", verdict
        data.setdefault("env", {})["BENCH_EDIT"] = "1"
        spec_path.write_text(yaml.safe_dump(data, sort_keys=False))
        replay, _ = build(root, args.spec, env)
        data["env"]["BENCH_EDIT"] = "2"
        spec_path.write_text(yaml.safe_dump(data, sort_keys=False))
        nocache, _ = build(root, args.spec, {**env, "PIP_NO_CACHE_DIR": "1"})
        t0 = time.monotonic()
        subprocess.run([python, "-m", "venv", str(work / "bare")], check=True)
        venv = time.monotonic() - t0
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{args.spec}: cold {cold:.1f}s, present {present:.2f}s, replay (pip cache) {replay:.1f}s, "
          f"replay (no cache) {nocache:.1f}s, python -m venv {venv:.1f}s")
    print(f"replay/cold {replay / cold:.2f}; nocache/replay {nocache / replay:.2f}; venv/replay {venv / replay:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

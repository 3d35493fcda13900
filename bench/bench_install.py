"""Installing an env: uv vs pip, locked vs unlocked, envport vs hand-written Dockerfiles; one run, interleaved.

    python bench/bench_install.py [--spec demo-cpu] [--repeat 1] [--out bench/results/install.json]

Works on a throwaway copy of the project with the spec renamed `<spec>-bench`
(its lock renamed with it, so the real env's tags never move), three site
profiles that differ only in `installer` and `bytecode` (pip; uv, which leaves
bytecode to the first import as uv itself does; uv with `bytecode: build`,
which compiles it while installing as pip does), the env's wheelhouse
downloaded once beforehand (`envport wheelhouse`) and uv's binary fetched
once beforehand, so every timed build installs the same files from local disk.
Each round runs every variant once, in this order, so a slow minute on this
shared machine hits all of them; before each timed variant the disk writes the
previous one left are flushed (`sync`, not timed), or a docker export's or a
venv's gigabyte still being written back would slow whichever variant follows:

1. docker, cold (`envport build --target docker --rebuild --no-cache`): pip, uv, uv with
   `bytecode: build`; then, not timed as builds, the first `import torch` in a fresh container
   of each image: what leaving bytecode to the first import costs every process of an image;
2. hand-written, hand-optimised Dockerfiles of the same env (one venv, one
   `--no-deps --require-hashes` install of every locked file from the same
   wheelhouse, bind-mounted; pip, then uv with its own defaults), `docker build --no-cache`
   under BuildKit;
3. venv here, cold (a fresh ENVPORT_ENVS_DIR), pip then uv, then pip with `--no-lock`.

pip's and uv's own download caches are left as they are (warm): torch comes
from the host's wheel either way, and a cold env is what is compared.
Each ratio is the median over rounds of that round's own ratio (the two builds
it compares ran minutes apart, under the same load); the JSON also keeps the
ratio of the medians.  Goals: docker uv/pip <= 0.6, venv uv/pip <= 0.5, locked/unlocked <= 1.0,
envport pip / hand pip <= 1.0, envport uv / hand uv <= 1.1; uv with `bytecode: build` is
printed beside them, without a goal.  Exits 0 with
"skipped: ..." when no engine or BuildKit client answers or the base is absent.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

from envport import __version__  # noqa: E402
from envport.builders.tools import ensure_uv  # noqa: E402
from envport.core.progress import quiet  # noqa: E402
from envport.engines import docker as engine  # noqa: E402
from envport.plan.lock import load_for  # noqa: E402
from envport.plan.site import load_site  # noqa: E402
from envport.spec.loader import load_spec  # noqa: E402

HAND_DOCKERFILE = """\
FROM {base}
RUN python{python} -m venv /opt/venv
{install}
COPY ["files", "/opt/envport-files"]
ENV VIRTUAL_ENV=/opt/venv PATH="/opt/venv/bin:$PATH"
"""
HAND_PIP = ("RUN --mount=type=bind,source=wheelhouse,target=/wh /opt/venv/bin/python -m pip install --no-cache-dir "
            "--disable-pip-version-check --no-index --find-links /wh --no-deps --require-hashes -r /wh/requirements.txt")
HAND_UV = ("RUN --mount=type=bind,source=wheelhouse,target=/wh --mount=type=bind,source=uv,target=/usr/local/bin/uv "
           "uv pip install --python /opt/venv/bin/python --no-cache --no-index --find-links /wh "
           "--no-deps --require-hashes -r /wh/requirements.txt")


# The site profiles the variants build with: they differ only in how, never in what.
SITES = {"bench-pip": {"installer": "pip"}, "bench-uv": {"installer": "uv"},
         "bench-uv-build": {"installer": "uv", "bytecode": "build"}}
DOCKER_VARIANTS = {"docker_pip": "bench-pip", "docker_uv": "bench-uv", "docker_uv_bytecode_build": "bench-uv-build"}


def envport(root: Path, *args: str, env: dict | None = None) -> tuple[float, dict]:
    t = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "envport", "-C", str(root), *args, "--json"], cwd=root,
                          capture_output=True, text=True, env=env)
    seconds = time.monotonic() - t
    if proc.returncode != 0:
        raise SystemExit(f"envport {' '.join(args)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n"
                         f"{proc.stderr[-3000:]}")
    return seconds, json.loads(proc.stdout)


def copy_project(dest: Path, spec: str, name: str) -> None:
    for d in ("specs", "sites"):
        shutil.copytree(REPO / d, dest / d)
    text = (dest / "specs" / f"{spec}.yaml").read_text()
    data = yaml.safe_load(text)
    data["name"] = name
    (dest / "specs" / f"{name}.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    lock = dest / "specs" / f"{spec}.lock"
    if lock.is_file():
        (dest / "specs" / f"{name}.lock").write_text(lock.read_text().replace(f'env = "{spec}"', f'env = "{name}"'))
    local = yaml.safe_load((dest / "sites" / "local.yaml").read_text())
    for site, fields in SITES.items():
        (dest / "sites" / f"{site}.yaml").write_text(yaml.safe_dump({**local, "name": site, **fields}, sort_keys=False))


def hand_context(tmp: Path, root: Path, name: str, base: str, python: str, uv: Path, installer: str) -> Path:
    """A hand-written Dockerfile of the same env: every locked file in one install, from the same wheelhouse."""
    ctx = tmp / f"hand-{installer}"
    shutil.rmtree(ctx, ignore_errors=True)
    (ctx / "wheelhouse").mkdir(parents=True)
    (ctx / "files").mkdir()
    lock = load_for(load_spec(name, root))
    wheelhouse = load_site("bench-pip", root).wheelhouse_path(root, name)
    for fname in lock.files():
        os.link(wheelhouse / fname, ctx / "wheelhouse" / fname)
    (ctx / "wheelhouse" / "requirements.txt").write_text(
        "".join(d.requirement() + "\n" for d in lock.final().values()))
    if installer == "uv":
        os.link(uv, ctx / "uv")
    (ctx / "Dockerfile").write_text(HAND_DOCKERFILE.format(base=base, python=python,
                                                           install=HAND_UV if installer == "uv" else HAND_PIP))
    return ctx


def settle() -> None:
    """Flush what the previous variant wrote (not timed): its writeback must not be the next one's cost."""
    os.sync()


def docker_build(cli: str, ctx: Path, tag: str) -> float:
    env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/root"), "DOCKER_BUILDKIT": "1"}
    if "DOCKER_HOST" in os.environ:
        env["DOCKER_HOST"] = os.environ["DOCKER_HOST"]
    t = time.monotonic()
    subprocess.run([cli, "build", "--no-cache", "-q", "--network", "host", "-t", tag, "."], cwd=ctx, env=env,
                   check=True, capture_output=True)
    return time.monotonic() - t


def first_import(image: str) -> float:
    """Seconds of a fresh container's first `import torch` (bytecode compiled then or at build)."""
    proc = subprocess.run(["docker", "run", "--rm", "--network", "none", image, "python", "-c",
                           "import time; t = time.monotonic(); import torch; print(time.monotonic() - t)"],
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"import torch in {image} exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    return float(proc.stdout.split()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default="demo-cpu")
    ap.add_argument("--repeat", type=int, default=1, help="rounds (each runs every variant once); medians")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "install.json"))
    args = ap.parse_args()

    client, refusal = engine.connect("bench")
    if client is None:
        print(f"skipped: {refusal.detail}")
        return 0
    cli = engine.buildkit_cli()
    if cli is None:
        print("skipped: no docker client here runs BuildKit")
        return 0
    name = f"{args.spec}-bench"
    tmp = Path(tempfile.mkdtemp(prefix="envport-bench-install-"))
    times: dict[str, list[float]] = {}
    hand_tags = [f"envport-bench-hand:{i}" for i in ("pip", "uv")]
    try:
        root = tmp / "project"
        root.mkdir()
        copy_project(root, args.spec, name)
        loaded = load_spec(name, root)
        if load_for(loaded) is None:
            print(f"skipped: specs/{args.spec}.lock is missing (envport lock {args.spec})")
            return 0
        base = loaded.spec.base
        if engine.get_image(client, base) is None:
            print(f"skipped: base image {base} absent (envport base debian-bookworm)")
            return 0
        print("setup: wheelhouse and uv binary (not timed) ...", flush=True)
        envport(root, "wheelhouse", name, "--site", "bench-pip")
        uv, failed = ensure_uv(root, quiet)
        if failed:
            raise SystemExit(failed.detail)
        hand = {i: hand_context(tmp, root, name, base, loaded.spec.python, uv, i) for i in ("pip", "uv")}

        def note(key: str, seconds: float) -> None:
            times.setdefault(key, []).append(seconds)
            print(f"    {key:<32} {seconds:7.1f}s", flush=True)

        for r in range(args.repeat):
            print(f"round {r + 1}/{args.repeat}", flush=True)
            images = {}
            for key, site in DOCKER_VARIANTS.items():
                settle()
                s, out = envport(root, "build", name, "--target", "docker", "--rebuild", "--no-cache", "--site", site)
                note(key, s)
                images[key] = out["steps"][-1]["data"]["image"]
            for key, image in images.items():
                note(f"import_torch_{key.removeprefix('docker_')}", first_import(image))
            for installer, tag in zip(("pip", "uv"), hand_tags):
                settle()
                note(f"hand_{installer}", docker_build(cli, hand[installer], tag))
            for key, extra in (("venv_pip", ["--site", "bench-pip"]), ("venv_uv", ["--site", "bench-uv"]),
                               ("venv_pip_unlocked", ["--site", "bench-pip", "--no-lock"])):
                envs = tmp / f"envs-{key}-{r}"
                env = {**os.environ, "ENVPORT_ENVS_DIR": str(envs), "ENVPORT_STATE_DIR": str(tmp / "state")}
                settle()
                s, _ = envport(root, "build", name, "--target", "venv", *extra, env=env)
                note(key, s)
                shutil.rmtree(envs, ignore_errors=True)
    finally:
        for img in client.images.list(all=True, filters={"label": f"envport.name={name}"}):
            try:
                client.images.remove(img.id, force=True)
            except Exception:
                pass
        for tag in hand_tags:
            subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)

    med = {k: statistics.median(v) for k, v in times.items()}
    pairs = {  # ratio: (numerator, denominator, goal)
        "docker uv/pip": ("docker_uv", "docker_pip", 0.6),
        "venv uv/pip": ("venv_uv", "venv_pip", 0.5),
        "venv locked/unlocked": ("venv_pip", "venv_pip_unlocked", 1.0),
        "envport pip / hand pip": ("docker_pip", "hand_pip", 1.0),
        "envport uv / hand uv": ("docker_uv", "hand_uv", 1.1),
        "docker uv, bytecode: build / pip": ("docker_uv_bytecode_build", "docker_pip", None),
        "import torch, uv / pip image": ("import_torch_uv", "import_torch_pip", None),
    }
    ratios = {k: (statistics.median(a / b for a, b in zip(times[num], times[den])), goal)
              for k, (num, den, goal) in pairs.items()}
    of_medians = {k: med[num] / med[den] for k, (num, den, _) in pairs.items()}
    print(f"medians of {args.repeat} round(s), whole processes:")
    for k, v in med.items():
        print(f"    {k:<32} {v:7.1f}s")
    print("ratios, the median of each round's own (the ratio of the medians in brackets):")
    for k, (ratio, goal) in ratios.items():
        verdict = "(no goal: the trade-off)" if goal is None else \
            f"(goal <= {goal}){'' if ratio <= goal else '  MISSED'}"
        print(f"    {k:<34} {ratio:6.2f}  ({of_medians[k]:.2f})  {verdict}")
    results = {
        "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": {"cpus": os.cpu_count(), "machine": platform.machine(), "client": cli, "envport": __version__,
                 "spec": args.spec, "repeat": args.repeat},
        "seconds": {k: [round(x, 2) for x in v] for k, v in times.items()},
        "ratios": {k: {"ratio": round(r, 3), "of_medians": round(of_medians[k], 3), "goal": g}
                   for k, (r, g) in ratios.items()},
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

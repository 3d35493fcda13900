"""Docker builds: a no-op `envport build` vs `docker build`, and a last-phase edit vs a cold build.

    python bench/bench_docker.py [--spec demo-cpu] [--repeat 5] [--part b] [--out bench/results/docker.json]

Works on a throwaway copy of the project with the spec renamed `<spec>-bench`
(so the real env's tags never move) and a fresh run id in its env (so no layer
from an earlier run is reused), and removes the images it made.

(a) no-op: `envport build NAME --target docker` on a present image (the CLI,
    a fresh process each time, exactly as a user types it: no --json, and
    with Python's default bytecode cache, kept under a throwaway
    PYTHONPYCACHEPREFIX so nothing is written into the checkout; and the
    builder's own call in-process) vs `docker build` of the very same
    rendered context, fully cached (BuildKit via /usr/bin/docker, the only
    builder that runs this Dockerfile's RUN --mount lines), the two
    alternating --repeat times.  Goals: the whole envport process >= 2x
    faster (it answers before argparse and imports only os, the built-in
    blake2b, the C json scanner and _socket to ask the engine); the builder's
    own call >= 10x.  Printed beside them, from the same run: a bare
    `python -c pass` (the floor any Python CLI stands on here), the CLI with
    --json, the CLI without a bytecode cache where PYTHONDONTWRITEBYTECODE is
    set (every envport module compiled on each run), the `envport` console
    script pip installed beside this interpreter, and, on a pyenv host,
    pyenv's `envport` shim (what a shell finds first there: bash and
    `pyenv exec` before Python starts).
(b) a build after editing only the last pip phase vs a cold build
    (`--no-cache`, empty wheelhouse).  Goal: <= 0.15, SBOM, label and pin
    check included.  Printed beside the ratio: where each build's time went,
    step by step (base, wheelhouse, the engine's build, pin check, SBOM read,
    SBOM layer, tags, and the rest of the process: start, imports, render,
    ledger), so a step that costs the same whatever changed shows.
    `--part b` runs (b) alone.

Medians of --repeat runs for (a); (b) is one cold and one edited build.  All
numbers come from one run of this script; they are printed and written to
--out.  Exits 0 with "skipped: ..." when no engine answers or the base image
is absent.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
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
from envport.builders.docker import builder as builder  # noqa: E402
from envport.builders.docker import context as docker_context  # noqa: E402
from envport.engines import docker as engine  # noqa: E402
from envport.recipe.identity import content_hash  # noqa: E402
from envport.spec.loader import load_spec  # noqa: E402
from envport.plan.steps import make_plan  # noqa: E402
from envport.core.progress import quiet  # noqa: E402
from envport.recipe.render import render_plan  # noqa: E402
from envport.plan.site import apply_site, load_site  # noqa: E402


def envport(root: Path, *args: str) -> tuple[float, dict]:
    t = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "envport", "-C", str(root), *args, "--json"], cwd=root,
                          capture_output=True, text=True)
    seconds = time.monotonic() - t
    if proc.returncode != 0:
        raise SystemExit(f"envport {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return seconds, json.loads(proc.stdout)


def timed(argv: list[str], cwd: Path, env: dict | None = None, expect: str | None = None) -> float:
    """Wall seconds of one process; EXPECT must start its stdout (the no-op's `present` line)."""
    t = time.monotonic()
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    seconds = time.monotonic() - t
    if proc.returncode != 0 or (expect is not None and not proc.stdout.startswith(expect)):
        raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return seconds


def interleaved(n: int, runs: dict) -> dict[str, list[float]]:
    """Each of RUNS (name -> callable returning seconds) once per round, N rounds: load hits them alike."""
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(n):
        for k, fn in runs.items():
            times[k].append(fn())
    return times


def copy_project(dest: Path, spec: str, name: str) -> None:
    for d in ("specs", "sites"):
        shutil.copytree(REPO / d, dest / d)
    data = yaml.safe_load((dest / "specs" / f"{spec}.yaml").read_text())
    data["name"] = name
    # A run id in env (before the pip phases): the edited last phase is new to the engine's
    # cache on every run, instead of a hit left by an earlier run of this benchmark.
    data.setdefault("env", {})["BENCH_RUN"] = secrets.token_hex(6)
    (dest / "specs" / f"{name}.yaml").write_text(yaml.safe_dump(data, sort_keys=False))


def edit_last_phase(root: Path, name: str) -> str:
    """Bump the last phase's first pin to another release that the host's index has."""
    path = root / "specs" / f"{name}.yaml"
    data = yaml.safe_load(path.read_text())
    last = data["pip_phases"][-1]
    packages = last if isinstance(last, list) else last["packages"]
    old = packages[0]
    pkg, _, version = old.partition("==")
    probe = subprocess.run([sys.executable, "-m", "pip", "index", "versions", pkg], capture_output=True, text=True)
    versions = [v.strip() for line in probe.stdout.splitlines() if line.startswith("Available versions:")
                for v in line.split(":", 1)[1].split(",")]
    other = next((v for v in versions if v != version), None)
    if other is None:
        raise SystemExit(f"no other release of {pkg} to edit the last phase to ({probe.stdout}{probe.stderr})")
    packages[0] = f"{pkg}=={other}"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return f"{old} -> {packages[0]}"


def where_time_went(wall: float, result: dict) -> dict[str, float]:
    """{step: seconds} of one `envport build --json` that took WALL seconds: its steps (the build step split
    into the builder's own timings), then `process` for the rest (start, imports, render, ledger)."""
    steps: dict[str, float] = {}
    for step in result["steps"]:
        timings = (step.get("data") or {}).get("timings")
        if timings:
            steps.update(timings)
        else:
            steps[step["step"].split()[0]] = step["seconds"]
    steps["process"] = wall - sum(steps.values())
    return {k: round(v, 3) for k, v in steps.items()}


def print_where(cold: dict[str, float], edited: dict[str, float]) -> None:
    print(f"    {'step':<14} {'cold':>8} {'edited':>8}  {'edited/cold':>11}")
    for k in dict.fromkeys([*cold, *edited]):
        c, e = cold.get(k, 0.0), edited.get(k, 0.0)
        print(f"    {k:<14} {c:>7.2f}s {e:>7.2f}s  {(f'{e / c:.2f}' if c > 0.05 else '-'):>11}")
    print(f"    {'total':<14} {sum(cold.values()):>7.2f}s {sum(edited.values()):>7.2f}s")


def median_of(n: int, fn) -> float:
    times = []
    for _ in range(n):
        t = time.monotonic()
        fn()
        times.append(time.monotonic() - t)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default="demo-cpu")
    ap.add_argument("--repeat", type=int, default=11)
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "docker.json"))
    ap.add_argument("--part", choices=("b", "both"), default="both",
                    help="b: the last-phase edit alone (the no-op's numbers in --out are kept); both (default)")
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
    tmp = Path(tempfile.mkdtemp(prefix="envport-bench-docker-"))
    try:
        copy_project(tmp, args.spec, name)
        loaded = load_spec(name, tmp)
        site = load_site(None, tmp)
        base = next(s.image for s in apply_site(make_plan(loaded), site).steps if s.kind == "base")
        if engine.get_image(client, base) is None:
            print(f"skipped: base image {base} absent (envport base debian-bookworm)")
            return 0

        # (b) cold: no layer cache, empty wheelhouse; then only the last pip phase edited.
        print(f"(b) cold build of {name} (--no-cache, empty wheelhouse) ...", flush=True)
        cold_s, cold = envport(tmp, "build", name, "--target", "docker", "--no-cache", "--rebuild")
        cold_steps = where_time_went(cold_s, cold)
        edit = edit_last_phase(tmp, name)
        print(f"(b) edited the last phase ({edit}), building ...", flush=True)
        edit_s, edited = envport(tmp, "build", name, "--target", "docker")
        edit_steps = where_time_went(edit_s, edited)
        edited_data = edited["steps"][-1]["data"]
        if args.part == "b":
            return report(args, client, cli, {}, (edit, cold_s, cold_steps, edit_s, edit_steps, edited_data))

        # (a) no-op on the present image, vs docker build of the same context fully cached.
        print(f"(a) no-op builds, medians of {args.repeat}, alternating ...", flush=True)
        loaded = load_spec(name, tmp)
        _, check = envport(tmp, "build", name, "--target", "docker")
        assert [s["verdict"] for s in check["steps"]] == ["present"], check
        noop_call = median_of(args.repeat, lambda: builder.build(loaded, site, tmp, progress=quiet))

        plan = apply_site(make_plan(loaded), site)
        hash_ = content_hash(loaded, site)
        ctx = tmp / "docker-context"
        ctx.mkdir()
        docker_context.write_context(ctx, render_plan(plan, hash_, ("docker",)), plan,
                                     site.wheelhouse_path(tmp, name), tmp / "phase-wheels.json")
        env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/root"), "DOCKER_BUILDKIT": "1"}
        if "DOCKER_HOST" in os.environ:
            env["DOCKER_HOST"] = os.environ["DOCKER_HOST"]
        argv = [cli, "build", "--progress=plain", "--network", site.network, "-q", "."]

        def docker_build():
            subprocess.run(argv, cwd=ctx, env=env, check=True, capture_output=True)

        docker_build()  # warm: the context is sent once, every layer is a cache hit from here on
        # The user's envport: Python's default bytecode cache (this environment may set
        # PYTHONDONTWRITEBYTECODE), kept out of the checkout under a throwaway prefix.
        pycache = tempfile.mkdtemp(prefix="envport-bench-pycache-")
        user_env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        user_env["PYTHONPYCACHEPREFIX"] = pycache
        cmd = [sys.executable, "-m", "envport", "build", name, "--target", "docker"]
        expect = "present  image "
        on_path = shutil.which("envport")  # the console script pip wrote beside this interpreter
        # On a pyenv host the shell's `envport` is pyenv's shim (bash, then `pyenv exec`): timed too, apart.
        shim = Path(os.environ.get("PYENV_ROOT", "/nonexistent")) / "shims" / "envport"
        runs = {
            "python -c pass": lambda: timed([sys.executable, "-c", "pass"], tmp, user_env),
            "envport": lambda: timed(cmd, tmp, user_env, expect),
            "docker build": lambda: timed(argv, ctx, env),
            "envport --json": lambda: timed([*cmd, "--json"], tmp, user_env, "{"),
        }
        if os.environ.get("PYTHONDONTWRITEBYTECODE"):
            runs["envport, no bytecode cache"] = lambda: timed(cmd, tmp, None, expect)
        if on_path:
            runs["envport console script"] = lambda: timed([on_path, *cmd[3:]], tmp, user_env, expect)
        if shim.is_file():
            runs["envport via pyenv's shim"] = lambda: timed([str(shim), *cmd[3:]], tmp, user_env, expect)
        timed(cmd, tmp, user_env, expect)  # writes the bytecode cache
        times = interleaved(args.repeat, runs)
        shutil.rmtree(pycache, ignore_errors=True)
        noop_cli, noop_docker = statistics.median(times["envport"]), statistics.median(times["docker build"])
    finally:
        for img in client.images.list(all=True, filters={"label": f"envport.name={name}"}):
            try:
                client.images.remove(img.id, force=True)
            except Exception:
                pass
        shutil.rmtree(tmp, ignore_errors=True)

    return report(args, client, cli, {"times": times, "noop_cli": noop_cli, "noop_call": noop_call,
                                      "noop_docker": noop_docker, "on_path": on_path, "shim": shim},
                  (edit, cold_s, cold_steps, edit_s, edit_steps, edited_data))


def report(args, client, cli: str, noop: dict, edit_run: tuple) -> int:
    """Print (a) (when it ran) and (b), and write them to --out."""
    edit, cold_s, cold_steps, edit_s, edit_steps, edited_data = edit_run
    engine_version = client.version()
    results = {
        "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": {"cpus": os.cpu_count(), "machine": platform.machine(), "engine": engine_version.get("Version"),
                 "client": cli, "envport": __version__, "spec": args.spec},
    }
    if noop:
        results["noop"] = noop_results(args, noop)
    results["last_phase_edit"] = {
        "edit": edit,
        "cold_s": round(cold_s, 2),
        "cold_steps_s": cold_steps,
        "edited_s": round(edit_s, 2),
        "edited_steps_s": edit_steps,
        "edited_built": edited_data.get("built_steps"),
        "edited_cached": edited_data.get("cached_steps"),
        "ratio": round(edit_s / cold_s, 3),
        "goal": "<= 0.15",
    }
    if noop:
        print_noop(args, cli, noop["times"], results["noop"])
    e = results["last_phase_edit"]
    print(f"(b) last pip phase edited ({edit}) vs cold (--no-cache), where the time went:")
    print_where(cold_steps, edit_steps)
    print(f"    edited built {e['edited_built']}, cached {e['edited_cached']}")
    print(f"    ratio edited/cold: {e['edited_s']:.1f}s / {e['cold_s']:.1f}s = {e['ratio']:.3f}  (goal <= 0.15)")
    out = Path(args.out)
    if not noop and out.is_file():
        kept = json.loads(out.read_text()).get("noop")  # --part b: (a)'s last numbers stay, with their date
        if kept:
            results["noop"] = kept
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


def noop_results(args, noop: dict) -> dict:
    times, noop_cli, noop_call, noop_docker = noop["times"], noop["noop_cli"], noop["noop_call"], noop["noop_docker"]
    name = f"{args.spec}-bench"
    return {
        "envport_cli_s": round(noop_cli, 4),
        "envport_build_call_s": round(noop_call, 4),
        "docker_build_cached_s": round(noop_docker, 4),
        "speedup_cli": round(noop_docker / noop_cli, 2),
        "speedup_cli_minima": round(min(times["docker build"]) / min(times["envport"]), 2),
        "speedup_call": round(noop_docker / noop_call, 1),
        "goal": "CLI >= 2x, call >= 10x",
        "repeat": args.repeat,
        "cli": f"{Path(sys.executable).name} -m envport build {name} --target docker (bytecode cached)",
        "medians_s": {k: round(statistics.median(v), 4) for k, v in times.items()},
        "minima_s": {k: round(min(v), 4) for k, v in times.items()},
        "envport_console_script": noop["on_path"],
        "pyenv_shim": str(noop["shim"]) if noop["shim"].is_file() else None,
        "load_1min_after": round(os.getloadavg()[0], 2),
    }


def print_noop(args, cli: str, times: dict, n: dict) -> None:
    print(f"(a) no-op build of a present image (medians of {args.repeat}, alternating; load {n['load_1min_after']}):")
    for k in times:
        print(f"    {k:<30} {n['medians_s'][k]:.4f}s  (min {n['minima_s'][k]:.4f}s)")
    print(f"    envport builder call (in-proc) {n['envport_build_call_s']:.4f}s")
    print(f"    docker build is BuildKit's, fully cached, via {cli}")
    print(f"    speedup docker/envport: CLI {n['speedup_cli']:.2f}x (of the minima {n['speedup_cli_minima']:.2f}x), "
          f"call {n['speedup_call']:.1f}x  (goals: CLI >= 2x, call >= 10x)")


if __name__ == "__main__":
    sys.exit(main())

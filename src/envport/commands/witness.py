"""`envport witness NAME --target docker|venv`: prove a built env works, from inside it."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from envport.commands._common import add_no_lock_arg
from envport.core.verdict import StepResult

TARGETS = ("docker", "venv", "apptainer")


def register(sub) -> None:
    from envport.witness.checks import CHECKS

    p = sub.add_parser(
        "witness", help="run the spec's witnesses inside a built env (python, imports, CLI, kernel, "
        "collectives, DTensor)",
        description="Run the witness scripts (stdlib + torch only, mounted or run in place, never baked "
        "into the env) inside a built env and print one verdict per check with its time. Appends the run "
        "to this machine's ledger (`envport ledger NAME`). A spec that needs a GPU on a host without one exits 5.")
    p.add_argument("name", metavar="NAME|PATH", help="spec name (specs/<name>.yaml) or path")
    p.add_argument("--target", choices=TARGETS, required=True)
    p.add_argument("--only", action="append", default=[], metavar="CHECK",
                   help=f"run only these checks (repeat or comma-separate): {', '.join(CHECKS)}")
    p.add_argument("--world-size", type=int, default=None, help="ranks for the collectives check (DTensor keeps the spec's mesh)")
    p.add_argument("--python", default=None,
                   help="venv: the interpreter (default ~/.envport/envs/NAME/bin/python, or under "
                   "$ENVPORT_ENVS_DIR); docker: the interpreter inside the image (default python3)")
    p.add_argument("--host", default=None,
                   help="venv: run in the env on this SSH host (site alias or destination; the scripts travel "
                   "over ssh and are removed after)")
    p.add_argument("--image", default=None, help="docker: image tag (default envport/NAME:<hash12> as --site builds it)")
    p.add_argument("--sif", default=None, metavar="FILE",
                   help="apptainer: the SIF (default <sif_dir>/NAME-<hash12>.sif as --site builds it); run with "
                   "apptainer exec where installed, else ch-run on the SIF mounted with squashfuse")
    p.add_argument("--site", default=None, help="site profile (default: local): names the docker image and SSH hosts")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="auto: GPUs where the spec asks for them, else what the env has; cuda: require one")
    p.add_argument("--deadline", type=float, default=300.0,
                   help="seconds per witness script; a stuck group has every rank's stack dumped (default 300)")
    add_no_lock_arg(p, "witness")
    p.add_argument("--no-ledger", action="store_true", help="do not append this run to the ledger")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(func=run)


def venv_python(name: str) -> Path:
    """Where the shell target's venv flavour puts the env (setup-venv.sh honours ENVPORT_ENVS_DIR)."""
    from envport.core.layout import env_prefix

    return env_prefix(name) / "bin" / "python"


def _table_row(r: StepResult) -> str:
    reason = f" [{r.reason}]" if r.reason else ""
    return f"{r.verdict.value:<8} {r.seconds:7.1f}s  {r.step:<28} {r.detail}{reason}"


def run(args) -> int:
    from envport.commands._common import load_one, unlocked
    from envport.plan.site import load_site
    from envport.recipe.identity import resolve
    from envport.witness.checks import check_world_size, parse_checks
    from envport.witness.judge import overall
    from envport.witness.plan import WitnessOptions
    from envport.witness.run import run_witnesses
    from envport.witness.scripts.envport_sentinel import FAULT_ENV

    only = parse_checks(args.only, "--only")
    check_world_size(args.world_size)
    loaded = load_one(args, args.name)
    spec = loaded.spec
    opts = WitnessOptions(only=only, world_size=args.world_size, device=args.device,
                          deadline_s=args.deadline, fault=os.environ.get(FAULT_ENV) or None, weights=True)
    site = unlocked(load_site(args.site, loaded.root), args.no_lock)
    identity = resolve(loaded, site, args.target).identity
    launcher, facts = _launcher(args, loaded, identity, opts)

    out = sys.stdout
    if not args.json:
        print(f"envport witness {identity.ref} --target {args.target} ({launcher.describe()})", file=out)
        print(f"{'VERDICT':<8} {'TIME':>8}  {'CHECK':<28} DETAIL", file=out)
        opts.on_step = lambda r: _print_step(r, out)
        opts.on_start = lambda call: print(f"  ... {call.label}: {', '.join(call.checks)}", file=sys.stderr,
                                           flush=True)
    t0 = time.monotonic()
    result = overall(run_witnesses(spec, launcher, opts), time.monotonic() - t0)
    if not args.no_ledger:
        from envport.report import ledger

        ledger.record(loaded.root, spec, kind="witness", target=args.target, hash_=identity.hash, result=result,
                      site=site, launcher=launcher.describe(), sm_range=spec.sm_range, **facts,
                      options={"only": only, "world_size": args.world_size, "device": args.device,
                               "deadline": args.deadline})
    if args.json:
        json.dump({"command": "witness", "exit_code": result.data["exit_code"], "steps": result.data["steps"],
                   "problems": [], "env": spec.name, "hash": identity.hash, "target": args.target,
                   "launcher": launcher.describe(), "verdict": result.verdict.value,
                   "seconds": round(result.seconds, 3)}, out, indent=2)
        out.write("\n")
    else:
        print(f"{result.verdict.value}: {spec.name} witnesses on {args.target} in {result.seconds:.1f}s "
              f"({result.detail})", file=out)
    return result.data["exit_code"]


def _print_step(r: StepResult, out) -> None:
    print(_table_row(r), file=out)
    for ln in r.lines:
        print(f"    | {ln}", file=out)
    out.flush()


def _launcher(args, loaded, identity, opts):
    """The launcher for --target/--host, and the facts the ledger records about where it ran."""
    from envport.builders import weights
    from envport.witness.launchers.docker import DockerLauncher
    from envport.witness.launchers.local import LocalLauncher, activated_env
    from envport.witness.census import host_gpu_count
    from envport.witness.plan import requires_gpu

    spec = loaded.spec
    if args.target == "venv" and args.host:
        from envport.plan.site import load_site
        from envport.witness.launchers.ssh import launcher_for_host

        launcher = launcher_for_host(load_site(args.site, loaded.root), args.host, spec.name,
                                     prefix=args.python and str(Path(args.python).parent.parent),
                                     weight_env=weights.remote_env(spec))
        return launcher, {"ssh_host": args.host}
    if args.target == "venv":
        python = Path(args.python).expanduser() if args.python else venv_python(spec.name)
        # What activating the env would do (CLI checks run `python`, `tool --help`);
        # an interpreter outside an envport env still gets the spec's env vars.
        env = activated_env(python.parent.parent, os.environ)
        if not (python.parent.parent / ".envport" / "env.sh").is_file():
            env.update(spec.env)
        # Each weight's variable points at its folder under the weights root, bound read-only where bwrap works.
        env.update(weights.runtime_env(spec, weights.weights_root()))
        launcher = LocalLauncher(python, base_env=env,
                                 missing_fix=f"envport build {spec.name} --target venv, or pass --python PATH",
                                 read_only=[h for h, _ in weights.existing_mounts(spec, weights.weights_root())])
        return launcher, {"prefix": str(python.parent.parent)}
    gpus = requires_gpu(spec, opts) and host_gpu_count() > 0
    if args.target == "apptainer":
        from envport.builders.apptainer.builder import sif_path
        from envport.plan.site import load_site
        from envport.witness.launchers.sif import SifLauncher

        sif = Path(args.sif) if args.sif else sif_path(load_site(args.site, loaded.root), loaded.root, identity)
        launcher = SifLauncher(sif, python=args.python or "python3", gpus=gpus,
                               mounts=weights.existing_mounts(spec, weights.weights_root()),
                               missing_fix=f"envport build {spec.name} --target apptainer, or pass --sif FILE")
        return launcher, {"sif": str(sif)}
    image = args.image or identity.image_tag
    launcher = DockerLauncher(image, python=args.python or "python3", gpus=gpus,
                              missing_fix=f"envport build {spec.name} --target docker, or pass --image TAG",
                              mounts=weights.existing_mounts(spec, weights.weights_root()))
    return launcher, {"image": image}

"""`envport witness NAME --target docker|venv`: prove a built env works, from inside it."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from ..verdict import StepResult, Verdict, exit_code

TARGETS = ("docker", "venv")


def register(sub) -> None:
    from ..witness_checks import CHECKS

    p = sub.add_parser(
        "witness", help="run the spec's witnesses inside a built env (python, imports, CLI, kernel, "
        "collectives, DTensor)",
        description="Run the witness scripts (stdlib + torch only, mounted or run in place, never baked "
        "into the env) inside a built env and print one verdict per check with its time. Appends the run "
        "to images/NAME/ledger.json. A spec that needs a GPU on a host without one exits 5.")
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
    p.add_argument("--site", default=None, help="site profile (default: local): names the docker image and SSH hosts")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="auto: GPUs where the spec asks for them, else what the env has; cuda: require one")
    p.add_argument("--deadline", type=float, default=300.0,
                   help="seconds per witness script; a stuck group has every rank's stack dumped (default 300)")
    p.add_argument("--no-ledger", action="store_true", help="do not append this run to the ledger")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(func=run)


def venv_python(name: str) -> Path:
    """Where the shell target's venv flavour puts the env (setup-venv.sh honours ENVPORT_ENVS_DIR)."""
    base = Path(os.environ.get("ENVPORT_ENVS_DIR") or "~/.envport/envs").expanduser()
    return base / name / "bin" / "python"


def _table_row(r: StepResult) -> str:
    reason = f" [{r.reason}]" if r.reason else ""
    return f"{r.verdict.value:<8} {r.seconds:7.1f}s  {r.step:<28} {r.detail}{reason}"


def run(args) -> int:
    from ..launchers import DockerLauncher, LocalLauncher
    from ..launchers.local import activated_env
    from ..witness_checks import check_world_size, parse_checks
    from ..witness_run import WitnessOptions, host_gpu_count, requires_gpu, run_witnesses, summary
    from ..witnesses.envport_sentinel import FAULT_ENV
    from ._common import load_one

    only = parse_checks(args.only, "--only")
    check_world_size(args.world_size)
    loaded = load_one(args, args.name)
    spec = loaded.spec
    opts = WitnessOptions(only=only, world_size=args.world_size, device=args.device,
                          deadline_s=args.deadline, fault=os.environ.get(FAULT_ENV) or None)
    ledger_facts: dict = {}
    hash_ = loaded.hash  # host envs; a docker image is named by the hash as the site builds it
    if args.target == "venv" and args.host:
        from ..launchers.ssh import launcher_for_host
        from ..site import load_site

        launcher = launcher_for_host(load_site(args.site, loaded.root), args.host, spec.name, prefix=args.python and
                                     str(Path(args.python).parent.parent))
        ledger_facts["ssh_host"] = args.host
    elif args.target == "venv":
        python = Path(args.python).expanduser() if args.python else venv_python(spec.name)
        # What activating the env would do (CLI checks run `python`, `tool --help`);
        # an interpreter outside an envport env still gets the spec's env vars.
        env = activated_env(python.parent.parent, os.environ)
        if not (python.parent.parent / ".envport" / "env.sh").is_file():
            env.update(spec.env)
        launcher = LocalLauncher(python, base_env=env,
                                 missing_fix=f"envport build {spec.name} --target venv, or pass --python PATH")
        ledger_facts["prefix"] = str(python.parent.parent)
    else:
        from ..hashing import content_hash
        from ..site import load_site

        # Images are named by the hash as the site builds them (CA bundle, wheelhouse...).
        hash_ = content_hash(loaded, load_site(args.site, loaded.root))
        image = args.image or f"envport/{spec.name}:{hash_[:12]}"
        gpus = requires_gpu(spec, opts) and host_gpu_count() > 0
        launcher = DockerLauncher(image, python=args.python or "python3", gpus=gpus,
                                  missing_fix=f"envport build {spec.name} --target docker, or pass --image TAG")
        ledger_facts["image"] = image

    out = sys.stdout
    if not args.json:
        print(f"envport witness {spec.name}@{hash_[:12]} --target {args.target} ({launcher.describe()})",
              file=out)
        print(f"{'VERDICT':<8} {'TIME':>8}  {'CHECK':<28} DETAIL", file=out)

        def on_step(r: StepResult) -> None:
            print(_table_row(r), file=out)
            for ln in r.lines:
                print(f"    | {ln}", file=out)
            out.flush()
        opts.on_step = on_step
        opts.on_start = lambda call: print(f"  ... {call.label}: {', '.join(call.checks)}", file=sys.stderr,
                                           flush=True)
    t0 = time.monotonic()
    results = run_witnesses(spec, launcher, opts)
    total = time.monotonic() - t0
    code = exit_code(results)
    bad_step = next((r for r in results if not r.verdict.ok), None)
    overall = Verdict.OK.value if bad_step is None else bad_step.verdict.value
    line = summary(results)
    if not args.no_ledger:
        _append_ledger(loaded, {
            "kind": "witness", "target": args.target, "hash": hash_, "verdict": overall,
            "summary": line, "exit_code": code, "seconds": round(total, 3),
            "launcher": launcher.describe(), "steps": [r.to_dict() for r in results],
            "options": {"only": only, "world_size": args.world_size, "device": args.device,
                        "deadline": args.deadline},
            "sm_range": spec.sm_range, **ledger_facts,
        })
    if args.json:
        json.dump({"env": spec.name, "hash": hash_, "target": args.target,
                   "launcher": launcher.describe(), "verdict": overall, "exit_code": code,
                   "seconds": round(total, 3), "steps": [r.to_dict() for r in results]}, out, indent=2)
        out.write("\n")
    else:
        print(f"{overall}: {spec.name} witnesses on {args.target} in {total:.1f}s ({line})", file=out)
    return code


def _append_ledger(loaded, entry: dict) -> None:
    try:
        from .. import ledger
    except ImportError:  # pragma: no cover - the ledger module ships with envport
        print("envport: no ledger module; this run is not recorded", file=sys.stderr)
        return
    ledger.append(loaded.root, loaded.spec.name, entry)

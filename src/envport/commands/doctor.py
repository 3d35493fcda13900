"""`envport doctor`: what this host can build and prove, and the route for the rest."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from envport.core.files import write_atomic
from envport.core.verdict import EXIT_OK, EXIT_REFUSED, envelope, print_json


def register(sub) -> None:
    p = sub.add_parser(
        "doctor", help="inventory GPUs, torch/CUDA/NCCL, driver, disk, runtimes; map the GPU count to what is testable",
        description="Observe this host (nothing is installed or changed): GPUs via nvidia-smi, topology, "
        "driver, torch/CUDA/NCCL as an interpreter sees them, torch's arch list vs every GPU, free disk "
        "vs the ~150 GB recommendation, /dev/shm, docker/apptainer/srun/ssh, and which configurations "
        "are testable here (one GPU runs the kernel witness, NCCL at world 1 and a 1-D mesh locally; a 2-D "
        "mesh needs a perfect square >= 4 free GPUs; no GPU: Slurm). Once the probed torch answers, the "
        "testable GPUs are the ones it can use (a CPU-only torch or a too-old driver uses none of those "
        "nvidia-smi lists, and the note says why); nvidia-smi's count alone decides only where torch "
        "cannot be probed. The driver is compared with torch's CUDA build. JAX and Triton are probed too "
        "where the interpreter holds them: JAX's backend and GPUs (a card JAX lists is judged by JAX, not "
        "refused because torch is a CPU build), Triton's version, its ptxas targets and a tl.sum kernel "
        "compiled and run in a child process. "
        "--env NAME judges an env's torch arch list against its sm_range without a GPU (exit 3 when "
        "it cannot cover it).")
    p.add_argument("--json", action="store_true", help="print the report as JSON (docs/doctor.schema.json)")
    p.add_argument("--env", metavar="NAME", default=None, help="also judge this env's torch pin vs its sm_range")
    p.add_argument("--python", default=None,
                   help="interpreter whose torch, JAX and Triton to probe (default: this one)")
    p.add_argument("--no-torch", action="store_true",
                   help="skip the framework probes: torch, JAX and Triton (each imports its framework: seconds)")
    p.add_argument("--write-docs", action="store_true", help="write docs/infra.md (the launch recipe) under the root")
    p.add_argument("--from-json", metavar="FILE", default=None,
                   help="render a report `doctor --json` saved before, probing nothing (one probe, two renderings)")
    p.set_defaults(func=run)


def run(args) -> int:
    from envport.report.doctor import collect, render_infra_md, render_text

    if args.from_json:
        return _rendered(args.from_json)
    spec = None
    root = None
    if args.env or args.write_docs:
        from envport.commands._common import load_one, project_root

        if args.env:
            loaded = load_one(args, args.env)
            spec, root = loaded.spec, loaded.root
        root = root or project_root(args)
    workdir = root or Path.cwd()
    report = collect(python=args.python, workdir=workdir, probe_torch=not args.no_torch, spec=spec)
    if args.write_docs:
        path = Path(root) / "docs" / "infra.md"
        write_atomic(path, render_infra_md(report, Path(root)))
        print(f"wrote {path}", file=sys.stderr)
    # Only --env's verdict sets the exit code: the other findings describe the host, they refuse nothing.
    refused = any(f["check"] == "env" and f["verdict"] == "REFUSED" for f in report["findings"])
    code = EXIT_REFUSED if refused else EXIT_OK
    if args.json:
        print_json(envelope("doctor", code, **report))
    else:
        sys.stdout.write(render_text(report))
    return code


def _rendered(path: str) -> int:
    """The text of a saved `doctor --json` report; exit 2 naming the file when it is not one."""
    from envport.core.verdict import EXIT_USAGE
    from envport.report.doctor import render_text

    try:
        report = json.loads(Path(path).read_text(encoding="utf-8"))
        text = render_text(report)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"doctor: {path}: not a saved `envport doctor --json` report ({type(exc).__name__}: {exc}); "
              "fix: pass the file `envport doctor --json > FILE` wrote", file=sys.stderr)
        return EXIT_USAGE
    sys.stdout.write(text)
    return report.get("exit_code", EXIT_OK)

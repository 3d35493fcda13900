"""`envport slurm submit NAME --cluster C --target venv|docker`: the witnesses as a Slurm batch job."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time

from envport.targets.base import SLURM
from envport.targets.registry import get, names


def register(sub) -> None:
    p = sub.add_parser("slurm", help="run an env's witnesses as a Slurm job (sbatch + srun), or list cluster profiles",
                       description="Slurm: render an sbatch script from a cluster profile (slurm/clusters/<name>.yaml), "
                       "submit it, poll it and judge the witnesses from its log.")
    ssub = p.add_subparsers(dest="slurm_command", metavar="SUBCOMMAND")
    ssub.required = True

    s = ssub.add_parser("submit", help="submit the witnesses of a built env as one batch job and wait for the verdict",
                        description="Render the batch script (every witness call runs under srun, one task per "
                        "rank, RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT from Slurm), submit it with sbatch "
                        "--parsable, poll squeue/scontrol (sacct -c once Slurm forgets the job), read the log and "
                        "print one verdict per check. OK; FAILED with the log tail and Slurm's ExitCode; REFUSED "
                        "(exit 3) when the job could not start: sbatch rejected it, or it was still PENDING after "
                        "the profile's max_pending (it is then cancelled; Slurm's Reason is printed).")
    s.add_argument("name", metavar="NAME|PATH", help="spec name (specs/<name>.yaml) or path")
    s.add_argument("--cluster", required=True, help="cluster profile: slurm/clusters/<name>.yaml or a path")
    s.add_argument("--target", choices=names(SLURM), required=True,
                   help="venv: the env built on the nodes (envport build NAME --target venv); docker: the image; "
                   "apptainer: the SIF (apptainer exec where the profile's container_runtime is apptainer, "
                   "else ch-run on the SIF mounted with squashfuse)")
    s.add_argument("--check", action="append", default=[], metavar="CHECK",
                   help="run only these checks (repeat or comma-separate): python, imports, cli, kernel, "
                   "collectives, dtensor (default: all the spec declares)")
    s.add_argument("--world-size", type=int, default=None, help="ranks (Slurm tasks) for the collectives check "
                   "(default: the spec's; with --nodes and --ntasks-per-node, their product)")
    s.add_argument("--nodes", type=int, default=None, metavar="N",
                   help="sbatch --nodes: spread the ranks over N nodes (MASTER_ADDR is the first one; "
                   "NODE_RANK is SLURM_NODEID)")
    s.add_argument("--ntasks-per-node", type=int, default=None, metavar="M",
                   help="sbatch --ntasks-per-node: M ranks on each node (LOCAL_RANK 0..M-1)")
    s.add_argument("--image", default=None, help="docker: image tag (default envport/NAME:<hash12> for --site)")
    s.add_argument("--sif", default=None, metavar="FILE",
                   help="apptainer: the SIF, on a path the nodes see (default <sif_dir>/NAME-<hash12>.sif for --site)")
    s.add_argument("--prefix", default=None, help="venv: the env's folder on the nodes "
                   "(default: the profile's envs_dir, else $ENVPORT_ENVS_DIR, else ~/.envport/envs, + /NAME)")
    s.add_argument("--site", default=None, metavar="NAME|FILE", help="site profile, for the docker image's hash (default: local)")
    s.add_argument("--deadline", type=float, default=300.0, help="seconds per witness script inside the job")
    s.add_argument("--dry-run", action="store_true", help="print the batch script; submit nothing")
    s.add_argument("--no-ledger", action="store_true", help="do not append this run to the ledger")
    s.add_argument("--json", action="store_true", help="print the result as JSON")
    s.set_defaults(func=run_submit)

    b = ssub.add_parser("build", help="a batch job that builds the env's SIF with apptainer on a node",
                        description="Render the .def (and the files it copies) into a job folder under the cluster "
                        "profile's cache_dir and write a batch script running `apptainer build [--fakeroot]` there, "
                        "APPTAINER_CACHEDIR/APPTAINER_TMPDIR under the profile's cache_dir and tmp_dir; the SIF "
                        "appears under the site's sif_dir only when the build succeeded. --dry-run prints the "
                        "script; otherwise it is submitted with sbatch and its job id printed (no waiting).")
    b.add_argument("name", metavar="NAME|PATH")
    b.add_argument("--cluster", required=True, help="cluster profile: slurm/clusters/<name>.yaml or a path")
    b.add_argument("--target", choices=("apptainer",), default="apptainer")
    b.add_argument("--site", default=None, metavar="NAME|FILE", help="site profile: the plan, hash and sif_dir (default: local)")
    b.add_argument("--dry-run", action="store_true", help="print the batch script; submit nothing")
    b.set_defaults(func=run_build)

    c = ssub.add_parser("clusters", help="list the cluster profiles (each one validated)")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=run_clusters)


def run_build(args) -> int:
    """Write the SIF build job (the rendered .def and its files in the job folder) and submit it."""
    import os
    import shutil as _shutil

    from envport.builders.apptainer.builder import sif_path
    from envport.commands._common import load_one, project_root
    from envport.plan.site import load_site
    from envport.recipe.identity import resolve
    from envport.recipe.render import WHEELHOUSE_CONTEXT_NAME, render_plan
    from envport.witness import slurm_job as slurm
    from envport.builders.apptainer.sif_job import render_sif_build
    from envport.engines.slurm import submit
    from envport.plan.cluster import load_cluster

    loaded = load_one(args, args.name)
    profile = load_cluster(args.cluster, project_root(args) if not args.cluster.endswith((".yaml", ".yml"))
                                 else None)
    _use_slurm_conf(profile)
    site = load_site(args.site, loaded.root)
    resolved = resolve(loaded, site, "apptainer")
    job_dir = slurm.new_job_dir(profile, loaded.spec.name)
    context = job_dir / "context"
    rendering = render_plan(resolved.plan, resolved.hash, ("apptainer",), site=site.name)
    text = render_sif_build(loaded.spec.name, resolved.identity.hash12, profile, job_dir, context,
                                  f"{loaded.spec.name}.def", sif_path(site, loaded.root, resolved.identity).resolve())
    if args.dry_run:
        sys.stdout.write(text)
        return 0
    for rel, (data, mode) in rendering.files.items():
        path = context / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        os.chmod(path, mode)
    if any(s.kind == "pip" and s.uses_wheelhouse for s in resolved.plan.steps):
        _shutil.copytree(site.wheelhouse_path(loaded.root, loaded.spec.name), context / WHEELHOUSE_CONTEXT_NAME)
    (job_dir / "job.sbatch").write_text(text)
    job_id, why = submit(job_dir / "job.sbatch")
    if job_id is None:
        print(f"REFUSED  slurm build [sbatch_rejected]: {why}")
        return 3
    print(f"submitted Slurm job {job_id}: {job_dir / 'job.sbatch'} (log {job_dir / 'job.log'})")
    return 0


def run_clusters(args) -> int:
    from envport.plan.cluster import cluster_names, load_cluster
    from envport.commands._common import project_root

    try:
        root = project_root(args)
    except Exception:
        root = None
    rows = []
    for name in cluster_names(root):
        p = load_cluster(name, root)
        rows.append(p.model_dump())
    if args.json:
        json.dump({"command": "slurm clusters", "exit_code": 0, "steps": [], "problems": [], "clusters": rows},
                  sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        for r in rows:
            print(f"{r['name']:<16} partition={r['partition'] or '-'} time={r['time']} cpus={r['cpus']} "
                  f"runtime={r['container_runtime']} max_pending={r['max_pending']:.0f}s  {r['description']}")
    return 0


def run_submit(args) -> int:
    from envport.commands._common import load_one, project_root
    from envport.core.progress import stderr_progress
    from envport.core.verdict import report
    from envport.plan.site import load_site
    from envport.recipe.identity import resolve
    from envport.witness import slurm_job as slurm
    from envport.plan.cluster import load_cluster
    from envport.witness.checks import check_world_size, parse_checks
    from envport.witness.judge import overall
    from envport.witness.plan import WitnessOptions

    only = parse_checks(args.check, "--check")
    check_world_size(args.world_size)
    slots = _check_layout(args)
    loaded = load_one(args, args.name)
    profile = load_cluster(args.cluster, project_root(args) if not args.cluster.endswith((".yaml", ".yml"))
                                 else None)
    _use_slurm_conf(profile)
    site = load_site(args.site, loaded.root)
    identity = resolve(loaded, site, args.target).identity
    opts = WitnessOptions(only=only, world_size=args.world_size or slots, deadline_s=args.deadline,
                          docs=_docs(loaded, args.target, identity.hash))
    job = _job(args, loaded, identity, profile, opts)
    if slots and (wider := [c for c in job.calls if c.world > slots]):
        from envport.core.errors import EnvportError

        raise EnvportError(f"{wider[0].label} needs {wider[0].world} ranks; --nodes {args.nodes} --ntasks-per-node "
                           f"{args.ntasks_per_node} give {slots}: raise them, or --check the other witnesses")
    refusal = slurm.refusal(job, opts, get(args.target).slurm_refusal(profile))
    if args.dry_run:
        return _dry_run(args, job, refusal)
    progress = stderr_progress if not args.json else (lambda line: print(line, file=sys.stderr, flush=True))
    t0 = time.monotonic()
    results, facts = ([refusal], {"cluster": profile.name}) if refusal is not None else \
        slurm.run_job(job, slurm.render(job, slurm.node_cpu_limit(profile.partition)), progress=progress)
    if refusal is None:  # what the allocation's GPUs cannot hold, each SKIPPED with its reason
        results += _plan(loaded.spec, opts, profile).skipped
    result = overall(results, time.monotonic() - t0)
    if not args.no_ledger and refusal is None:
        from envport.report import ledger

        ledger.record(loaded.root, loaded.spec, kind="witness", target=args.target, hash_=identity.hash,
                      result=result, site=site, launcher=f"slurm sbatch+srun on cluster {profile.name}", slurm=facts,
                      options={"only": only, "world_size": args.world_size, "deadline": args.deadline},
                      **({"image": job.image} if job.image else {"sif": job.sif} if job.sif else
                         {"prefix": job.prefix}))
    if args.json:
        json.dump({"command": "slurm submit", "exit_code": result.data["exit_code"], "steps": result.data["steps"],
                   "problems": [], "env": identity.name, "hash": identity.hash, "target": args.target,
                   "cluster": profile.name, "verdict": result.verdict.value,
                   "seconds": round(result.seconds, 3), **facts, "script_path": str(job.script_path)},
                  sys.stdout, indent=2)
        sys.stdout.write("\n")
        return result.data["exit_code"]
    report(results, False)
    where = f"Slurm job {facts['job_id']}" if facts.get("job_id") else "Slurm"
    print(f"{result.verdict.value}: {identity.name} witnesses ({args.target}) as {where} on cluster "
          f"{profile.name} in {result.seconds:.1f}s ({result.detail})")
    return result.data["exit_code"]


def _docs(loaded, target: str, hash_: str) -> list:
    """The spec's docs, run in the job on the nodes (the doc's commands inside the env there, the weights
    from the weights root the nodes share, as the CLI witnesses get them), every time: a job proves the
    nodes, which a pass elsewhere does not."""
    from envport.flow.docs_level import docs_to_check

    return docs_to_check(loaded, loaded.root, target=target, hash_=hash_, rerun=True)


def _check_layout(args) -> int | None:
    """The ranks --nodes x --ntasks-per-node give (None unless both are set); usage errors for the rest."""
    from envport.core.errors import EnvportError

    for flag, value in (("--nodes", args.nodes), ("--ntasks-per-node", args.ntasks_per_node)):
        if value is not None and value < 1:
            raise EnvportError(f"{flag} must be >= 1 (got {value})")
    if not (args.nodes and args.ntasks_per_node):
        return None
    slots = args.nodes * args.ntasks_per_node
    if args.world_size and args.world_size > slots:
        raise EnvportError(f"--world-size {args.world_size} is more ranks than --nodes {args.nodes} x "
                           f"--ntasks-per-node {args.ntasks_per_node} = {slots}")
    return slots


def _use_slurm_conf(profile) -> None:
    """A profile's slurm_conf for every Slurm command this process runs (sbatch, squeue, scontrol, sacct, sinfo,
    scancel) and, through sbatch's environment, for the job's own."""
    if profile.slurm_conf:
        os.environ["SLURM_CONF"] = os.path.expanduser(profile.slurm_conf)


def _plan(spec, opts, profile):
    """The witness calls for the allocation the profile asks for: NCCL worlds from its gres GPUs."""
    from envport.engines.gpu import census_from_gres
    from envport.witness.plan import plan_witnesses

    return plan_witnesses(spec, opts, census_from_gres(profile.gres))


def _job(args, loaded, identity, profile, opts):
    """The batch job for --target: the image the site built (docker) or the env on the nodes (venv)."""
    from envport.witness import slurm_job as slurm
    from envport.witness.scripts.envport_sentinel import FAULT_ENV

    env = {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1", **profile.env}
    if os.environ.get(FAULT_ENV):
        env[FAULT_ENV] = os.environ[FAULT_ENV]  # test-only fault switch, as `envport witness` passes it
    from envport.plan.site import load_site
    from envport.targets.base import SlurmRequest

    where = {"image": None, "prefix": None, "sif": None}
    target = get(args.target)
    where.update(target.slurm_wrap(SlurmRequest(loaded, load_site(args.site, loaded.root), identity, profile,
                                                image=args.image, sif=args.sif, prefix=args.prefix)))
    job = slurm.JobSpec(loaded=loaded, identity=identity, profile=profile, target=args.target,
                        calls=_plan(loaded.spec, opts, profile).calls,
                        job_dir=slurm.new_job_dir(profile, loaded.spec.name), env=env, **where, nodes=args.nodes,
                        ntasks_per_node=args.ntasks_per_node)
    return dataclasses.replace(job, task=target.slurm_task(job))


def _dry_run(args, job, refusal) -> int:
    from envport.witness import slurm_job as slurm

    text = slurm.render(job, slurm.node_cpu_limit(job.profile.partition))
    if args.json:
        json.dump({"command": "slurm submit", "exit_code": 0, "steps": [], "problems": [],
                   "env": job.identity.name, "hash": job.identity.hash, "target": args.target,
                   "cluster": job.profile.name, "script_path": str(job.script_path), "log": str(job.log_path),
                   "script": text, "refused": refusal.to_dict() if refusal else None}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(text)
        if refusal:
            print(f"# note: {refusal.line()}", file=sys.stderr)
    return 0

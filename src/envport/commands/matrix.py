"""`envport matrix`: every spec × target, what each pair needs and whether this host can run it; `--run` runs
`envport up` for each runnable pair (in parallel, one docker pair at a time) and writes JUnit and a markdown
summary; `--format github` writes .github/workflows/envs.yml (report/workflow.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from envport.commands._common import project_root
from envport.core.proc import run as proc_run, spawn
from envport.targets.registry import matrix_rows, ssh_rows

FORMATS = ("table", "json", "github")
TARGET_CHOICES = matrix_rows()  # every target, then the SSH rows (envport.targets.registry)


def register(sub) -> None:
    p = sub.add_parser("matrix", help="every spec x target: what it needs, whether this host can run it; --run them",
                       description="List every pair of spec (specs/*.yaml) and target (docker, apptainer, venv, "
                       "conda, ssh: a venv on each SSH host of the site profile, shown as venv@HOST) with what "
                       "it needs (the docker engine, its base image, GPUs, apptainer or envport's .def builder "
                       "and a SIF runtime, python or conda, an SSH host that answers) and whether this host "
                       "can run it, or why not (a reason token and the fix). Every need shown was checked here; "
                       "one that cannot be checked here says so. --run runs `envport up` for every runnable "
                       "pair, up to --jobs at once (docker pairs one at a time: they share the engine), "
                       "printing each pair's progress prefixed with its name; the pairs it cannot run are "
                       "listed as skipped with the reason. --format github writes .github/workflows/envs.yml "
                       "(one job per pair; `envport render --all --check` reports its drift). Exit code: 0 "
                       "when listing; with --format github 3 when a pair was left out of the workflow "
                       "(REFUSED [lock_source]: its lock pins a file its build's pip sources cannot serve; "
                       "REFUSED [unreachable_host]: an SSH pair, whose host a runner cannot reach as its user); "
                       "with --run 1 when any pair's `up` did not end ok. --run --slurm CLUSTER runs the pairs "
                       "as one Slurm job array instead (several where the cluster's MaxArraySize asks), at most "
                       "--jobs tasks at once, each task `envport up` for its pair on the node it lands on with "
                       "the cluster profile's partition, account and time; the same JUnit and summary, each "
                       "pair's node named, a task that timed out or lost its node named with its reason.")
    p.add_argument("--format", choices=FORMATS, default="table",
                   help="table (default), json (the one --json shape: command, exit_code, steps, problems, "
                   "pairs), or github: write .github/workflows/envs.yml")
    p.add_argument("--json", action="store_true", help="same as --format json")
    p.add_argument("--env", action="append", default=[], metavar="NAME",
                   help="only these specs (repeat or comma-separate; default: every spec in specs/)")
    p.add_argument("--target", action="append", default=[], metavar="T",
                   help=f"only these targets (repeat or comma-separate): {', '.join(TARGET_CHOICES)} (default: all)")
    p.add_argument("--site", default=None, metavar="NAME|FILE", help="site profile (default: local; --format github always uses "
                   "sites/github.yaml)")
    p.add_argument("--run", action="store_true", help="run `envport up` for every runnable pair")
    p.add_argument("--jobs", type=int, default=1, metavar="N", help="--run: pairs at once (default 1); with "
                   "--slurm the array's throttle (sbatch --array=0-N%%K)")
    p.add_argument("--slurm", default=None, metavar="CLUSTER",
                   help="--run: submit the runnable pairs as a Slurm job array on this cluster profile "
                   "(slurm/clusters/<name>.yaml or a path) and follow it, instead of running them here")
    p.add_argument("--junit", default=None, metavar="FILE",
                   help="--run: JUnit XML, one test case per pair and up step (default reports/matrix.xml)")
    p.add_argument("--summary", default=None, metavar="FILE.md",
                   help="--run: the markdown summary table (default reports/matrix-summary.md)")
    p.set_defaults(func=run)


def _split(values: list[str]) -> list[str]:
    return [v.strip() for item in values for v in item.split(",") if v.strip()]


def run(args) -> int:
    from envport.core.errors import EnvportError

    args.json = args.json or args.format == "json"
    if args.json:
        args.format = "json"
    root = project_root(args)
    targets = _split(args.target) or list(TARGET_CHOICES)
    bad = [t for t in targets if t not in TARGET_CHOICES]
    if bad:
        raise EnvportError(f"--target {', '.join(bad)}: not a target; choose from {', '.join(TARGET_CHOICES)}",
                           exit_code=2)
    if args.jobs < 1:
        raise EnvportError("--jobs must be at least 1", exit_code=2)
    if args.slurm and not args.run:
        raise EnvportError("--slurm CLUSTER runs the matrix on a cluster: add --run", exit_code=2)
    if args.format == "github":
        if args.run or args.env or args.target or args.site:
            raise EnvportError("--format github writes the whole matrix (every spec, every target, for the site "
                               "profile `github`); drop --run, --env, --target and --site", exit_code=2)
        return _github(args, root)
    loaded = _load(args, root)
    from envport.plan.site import load_site
    from envport.report.matrix import Probes, judge, pairs

    site = load_site(args.site, root)
    by_name = {ld.spec.name: ld for ld in loaded}
    probes = Probes(site, root)
    judged = [judge(by_name[p.env], p, site, root, probes) for p in pairs(list(by_name), site, tuple(targets))]
    if args.run:
        return _run(args, root, judged, by_name)
    return _list(args, judged)


def _load(args, root: Path) -> list:
    from envport.commands._common import load_selected
    from envport.spec.loader import all_spec_names

    names = _split(args.env)
    ns = type(args)(**{**vars(args), "specs": names, "all": not names, "root": str(root)})
    if not names and not all_spec_names(root):
        from envport.core.errors import EnvportError

        raise EnvportError(f"no specs in {root / 'specs'}", exit_code=2)
    return load_selected(ns)


def _github(args, root: Path) -> int:
    from envport.commands._common import load_selected
    from envport.report import workflow

    loaded = load_selected(type(args)(**{**vars(args), "specs": [], "all": True, "root": str(root)}))
    return workflow.emit(root, loaded)


# --- listing ---------------------------------------------------------------------


def _needs_text(j, notes: dict) -> str:
    """One short cell: a runnable pair's needs by name; an unmet one as its reason token and note number."""
    if not j.runnable:
        return ", ".join(f"{n.reason} [{_note(notes, n)}]" for n in j.needs if n.ok is False)
    unchecked = [n.what for n in j.needs if n.ok is None]
    return ", ".join(n.what for n in j.needs if n.ok) + (f"; not checked here: {', '.join(unchecked)}" if unchecked
                                                         else "")


def _note(notes: dict, need) -> int:
    """The number of NEED's note; pairs with the same fix share one, so each fix is printed once."""
    key = (need.reason, need.fix) if need.fix else (need.reason, need.what, need.detail)
    number, needs = notes.setdefault(key, (len(notes) + 1, []))
    needs.append(need)
    return number


def _note_text(number: int, needs: list) -> str:
    """`[N] reason: what: detail` and its fix; a what or detail the sharing pairs differ in is left out
    rather than shown as every pair's (`--json` has each pair's own)."""
    first = needs[0]
    said = [part for part in ({n.what for n in needs}, {n.detail for n in needs}) if len(part) == 1]
    head = ": ".join([first.reason, *(next(iter(p)) for p in said)])
    return f"[{number}] {head}" + (f"\n    fix: {first.fix}" if first.fix else "")


def _list(args, judged) -> int:
    from envport.core.verdict import StepResult, Verdict, envelope, print_json

    if args.json:
        steps = [StepResult(j.pair.label, Verdict.OK if j.runnable else Verdict.REFUSED,
                            "runnable here" if j.runnable else j.why_not,
                            reason=next((n.reason for n in j.needs if n.ok is False), ""),
                            data=j.to_dict()).to_dict() for j in judged]
        print_json(envelope("matrix", 0, steps=steps, pairs=[j.to_dict() for j in judged]))
        return 0
    # One line per pair (30 pairs of 400-600 characters each repeated the same fix before): the reason
    # token in the table, each distinct fix once below it (`--json` keeps every pair's full why_not).
    notes: dict = {}
    width = max([len(j.pair.label) for j in judged] + [4])
    print(f"{'PAIR':<{width}}  HERE  NEEDS (or why not: reason [note])")
    for j in judged:
        print(f"{j.pair.label:<{width}}  {'yes' if j.runnable else 'no':<4}  {_needs_text(j, notes)}")
    n = sum(j.runnable for j in judged)
    print(f"{n} of {len(judged)} pair(s) runnable here; `envport matrix --run` runs them")
    for number, needs in notes.values():
        print(_note_text(number, needs))
    return 0


# --- running ---------------------------------------------------------------------


def _run(args, root: Path, judged, by_name: dict) -> int:
    from envport.core.verdict import StepResult, Verdict, envelope, print_json
    from envport.report.matrix import PairRun, junit_xml, summary_md

    runs = [PairRun(j) for j in judged]
    start = time.monotonic()
    runnable = [r for r in runs if r.judged.runnable]
    if args.slurm:
        _on_slurm(root, args, runnable, by_name)
    else:
        _schedule(root, args, runnable, args.jobs)
    wall = time.monotonic() - start
    junit = Path(args.junit) if args.junit else root / "reports" / "matrix.xml"
    summary = Path(args.summary) if args.summary else root / "reports" / "matrix-summary.md"
    for path, data in ((junit, junit_xml(runs)), (summary, summary_md(runs, wall, args.jobs).encode())):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    code = 1 if any(r.exit_code not in (None, 0) for r in runs) else 0
    if args.json:
        verdicts = {"OK": Verdict.OK, "skipped": Verdict.SKIPPED, "REFUSED": Verdict.REFUSED}
        steps = [StepResult(r.judged.pair.label, verdicts.get(r.verdict, Verdict.FAILED), r.detail,
                            reason=r.reason, seconds=r.seconds,
                            data={"exit_code": r.exit_code, "size": r.size, "where": r.where, "ran_on": r.ran_on,
                                  "steps": r.steps, **({"slurm": r.slurm} if r.slurm else {})}).to_dict() for r in runs]
        print_json(envelope("matrix", code, steps=steps, junit=str(junit), summary=str(summary),
                            wall_seconds=round(wall, 3), jobs=args.jobs))
        return code
    print(summary_md(runs, wall, args.jobs), end="")
    print(f"junit: {junit}\nsummary: {summary}")
    return code


def _schedule(root: Path, args, runs: list, jobs: int) -> None:
    """Run every pair, up to JOBS at once, never two holding the same lock (the docker engine) together;
    pairs start in their listed order, a locked one waiting while a later free one may start."""
    pending = list(runs)
    held: set = set()
    running = 0
    cond = threading.Condition()
    threads = []

    def work(r):
        nonlocal running
        try:
            _one(root, args, r)
        except Exception as exc:  # a pair that broke here is that pair's failure, never a silent skip
            r.exit_code, r.error = 1, f"envport matrix could not run it: {type(exc).__name__}: {exc}"
        finally:
            with cond:
                running -= 1
                if r.judged.pair.lock:
                    held.discard(r.judged.pair.lock)
                cond.notify_all()

    with cond:
        while pending:
            nxt = next((r for r in pending if r.judged.pair.lock not in held), None) if running < jobs else None
            if nxt is None:
                cond.wait()
                continue
            pending.remove(nxt)
            running += 1
            if nxt.judged.pair.lock:
                held.add(nxt.judged.pair.lock)
            t = threading.Thread(target=work, args=(nxt,), name=nxt.judged.pair.key, daemon=True)
            threads.append(t)
            t.start()
    for t in threads:
        t.join()


_print_lock = threading.Lock()


def _say(label: str, line: str) -> None:
    with _print_lock:
        print(f"[{label}] {line}", file=sys.stderr, flush=True)


def _pair_env(pair, site) -> dict:
    return {**os.environ, **_pair_extra_env(pair, site)}


def _pair_extra_env(pair, site) -> dict:
    """What a pair's `envport up` needs beyond this shell's environment."""
    env: dict = {}
    if pair.target in ssh_rows():
        # The env folder on the host: $ENVPORT_SSH_ENVS_DIR, else (the host is this machine) parity's own
        # separate folder, so the "remote" build never finds the local venv present.
        from envport.engines.ssh import resolve_host
        from envport.report.parity import SAME_MACHINE_SSH_ENVS_DIR, same_machine

        dir_ = os.environ.get("ENVPORT_SSH_ENVS_DIR")
        if not dir_ and same_machine(resolve_host(site, pair.host)):
            dir_ = SAME_MACHINE_SSH_ENVS_DIR
        if dir_:
            env["ENVPORT_ENVS_DIR"] = dir_
    return env


def _one(root: Path, args, r) -> None:
    import json

    from envport.plan.site import load_site

    pair = r.judged.pair
    argv = _up_argv(root, args, pair)
    site = load_site(args.site, root)
    env = _pair_env(pair, site)
    _say(pair.label, "envport " + " ".join(argv[5:]))
    t0 = time.monotonic()
    tail: list[str] = []
    try:
        proc = spawn(argv, cwd=root, env=env, stderr=subprocess.PIPE, text=True, errors="replace")
    except OSError as exc:
        r.exit_code, r.error = 1, f"could not start envport: {exc}"
        return
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.append(proc.stdout.read()), daemon=True)
    reader.start()
    for line in proc.stderr:
        line = line.rstrip("\n")
        tail = (tail + [line])[-20:]
        _say(pair.label, line)
    proc.wait()
    reader.join()
    r.seconds = time.monotonic() - t0
    r.exit_code = proc.returncode
    try:
        data = json.loads("".join(out))
        r.steps = data.get("steps") or []
    except ValueError:
        r.error = f"`envport up` exited {proc.returncode} without its JSON: " + " | ".join(tail[-5:])
        r.exit_code = r.exit_code or 1
    _measure(r, site)
    _say(pair.label, f"{r.verdict} in {r.seconds:.1f}s: {r.detail}")


def _up_argv(root: Path, args, pair) -> list[str]:
    return [sys.executable, "-m", "envport", "-C", str(root), *pair.up_args(), "--json",
            *(["--site", args.site] if args.site else [])]


# --- running on Slurm ----------------------------------------------------------------


def _on_slurm(root: Path, args, runs: list, by_name: dict) -> None:
    """Every runnable pair as a task of one Slurm job array (flow/matrix_slurm.py), followed to its end."""
    import shutil

    from envport.engines.slurm import max_array_size
    from envport.flow import matrix_slurm as array
    from envport.plan.cluster import load_cluster
    from envport.plan.site import load_site
    from envport.recipe.identity import resolve
    from envport.targets.registry import row_target
    from envport.witness.slurm_job import new_job_dir

    profile = load_cluster(args.slurm, None if args.slurm.endswith((".yaml", ".yml")) else root)
    if not runs:
        return None  # nothing runnable here: nothing to submit (the summary lists every pair as skipped)
    if profile.slurm_conf:  # every Slurm command of this process, and (sbatch's environment) the tasks'
        os.environ["SLURM_CONF"] = os.path.expanduser(profile.slurm_conf)
    if shutil.which("sbatch") is None:
        return _refuse_all(runs, "no_slurm", "no sbatch on PATH: run on a Slurm login node "
                           "(Debian: apt-get install slurm-client)")
    site = load_site(args.site, root)
    tasks = []
    for r in runs:
        pair = r.judged.pair
        hash12 = resolve(by_name[pair.env], site, row_target(pair.target)).identity.hash12
        tasks.append(array.Task(r, f"{hash12}-{pair.key}", _up_argv(root, args, pair), _pair_extra_env(pair, site)))
    job_dir = new_job_dir(profile, "matrix")
    arrays = array.plan_arrays(tasks, max_array_size(), args.jobs, job_dir)
    say = _slurm_progress
    why = array.submit_all(arrays, profile, job_dir, say)
    if why:
        return _refuse_all(runs, "sbatch_rejected", f"Slurm refused the matrix's array: {why.splitlines()[-1]} "
                           f"(script {arrays[0].script}; fix: adjust the cluster profile {profile.name})")
    array.follow(arrays, profile, say)
    array.gather(arrays, profile)
    for r in runs:
        _measure(r, site)
        _say(r.judged.pair.label, f"{r.verdict}: {r.detail}" + (f" ({r.ran_on})" if r.ran_on else ""))


def _slurm_progress(line: str) -> None:
    with _print_lock:
        print(line, file=sys.stderr, flush=True)


def _refuse_all(runs: list, reason: str, why: str) -> None:
    for r in runs:
        r.exit_code, r.reason, r.error = 3, reason, why


def _measure(r, site) -> None:
    """The built thing's size: the image's or SIF's from the build step, an env folder's by walking it
    (over SSH: `du -sk` there)."""
    import shlex

    build = next((s for s in r.steps if s.get("step") == "build"), None)
    data = (build or {}).get("data") or {}
    r.where = data.get("image") or data.get("sif") or data.get("prefix") or ""
    if data.get("size"):
        r.size = int(data["size"])
        return
    prefix = data.get("prefix")
    if not prefix:
        return
    if r.judged.pair.host:
        from envport.engines.ssh import resolve_host, ssh_argv

        argv = ssh_argv(resolve_host(site, r.judged.pair.host)) + [f"du -sk {shlex.quote(prefix)}/"]
        ran = proc_run(argv, timeout=120)
        try:
            r.size = int(ran.stdout.split()[0]) * 1024 if ran.ok else None
        except (ValueError, IndexError):
            r.size = None
        return
    r.size = _tree_bytes(Path(prefix))


def _tree_bytes(path: Path) -> int | None:
    try:
        path = path.resolve(strict=True)
    except OSError:
        return None
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_blocks * 512
            except OSError:
                pass
    return total

"""`envport render`: write images/<name>/ from specs, or check for drift."""

from __future__ import annotations

import sys
from pathlib import Path

from envport.commands._common import add_json_arg, add_spec_args, load_selected, project_root

# Kept in step with envport.renderers.TARGETS (tests/test_cli.py checks); the
# renderers import Jinja2, which `--help` should not pay for.
TARGETS = ("docker", "apptainer", "shell")


def register(sub) -> None:
    p = sub.add_parser("render", help="render specs to images/<name>/ (Dockerfile, .def, setup scripts)",
                       description="Render specs to images/<name>/: Dockerfile, <name>.def, setup-venv.sh, "
                       "setup-conda.sh and the shim files they copy. All specs are validated first; on any "
                       "problem nothing is written (exit 2). --check writes nothing and exits 1 listing "
                       "every drifted file; with --all it also fails on images/<d>/ left without a "
                       "specs/<d>.yaml, which `render --all` removes.")
    add_spec_args(p)
    p.add_argument("--target", choices=TARGETS, action="append",
                   help="render only this target (repeatable; default: all)")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if images/ differs")
    add_json_arg(p, "one step per spec (and per stale images/ dir)")
    p.set_defaults(func=run)


def run(args) -> int:
    from envport.core.verdict import StepResult, Verdict, report
    from envport.recipe.render import drift, remove_stale, render_spec, stale_dirs, write
    from envport.spec.loader import all_spec_names
    root = project_root(args)
    targets = tuple(args.target) if args.target else TARGETS
    full = set(targets) == set(TARGETS)
    selected = load_selected(args)
    renderings = [render_spec(loaded, targets) for loaded in selected]
    # Stale dirs are judged only against every spec: `render x` says nothing about images/y/.
    every_spec = getattr(args, "all", False)
    results = []
    if args.check:
        for r in renderings:
            drifted = drift(root, r, full)
            results.append(StepResult(f"render {r.name}", Verdict.FAILED if drifted else Verdict.OK,
                                      f"{len(drifted)} file(s) differ from the spec" if drifted else "matches images/",
                                      lines=drifted))
        # A lock the spec has moved past renders as unlocked recipes: that is drift too.
        from envport.plan.lock import stale
        for problem, loaded in ((stale(loaded), loaded) for loaded in selected):
            if problem:
                results.append(StepResult(f"lock {loaded.spec.name}", Verdict.FAILED, problem.message,
                                          reason=problem.reason,
                                          lines=[f"{loaded.path.with_suffix('.lock').name} [{problem.reason}]: "
                                                 f"{problem.message}"]))
        if every_spec:
            results.extend(_workflow_drift(root, selected, full))
            for d in stale_dirs(root, set(all_spec_names(root))):
                rel = d.relative_to(root)
                results.append(StepResult(f"render {d.name}", Verdict.FAILED,
                                          f"{rel}/ is stale: no specs/{d.name}.yaml",
                                          lines=[f"{rel}/ (stale: run `envport render --all` or `git rm -r {rel}`)"]))
        return _print_check(results, args.json, _render_fix(args, renderings, every_spec))
    for r in renderings:
        changed = write(root, r, full)
        results.append(StepResult(f"render {r.name}", Verdict.OK if changed else Verdict.PRESENT,
                                  f"images/{r.name}/ ({len(changed)} file(s) changed)", lines=changed))
    if every_spec and full:
        for rel in remove_stale(root, set(all_spec_names(root))):
            results.append(StepResult(f"render {Path(rel).name}", Verdict.OK, f"removed {rel}/ (no spec)"))
        from envport.report import workflow
        if (root / workflow.WORKFLOW_PATH).exists():  # regenerated where the project keeps one
            changed = workflow.write(root, workflow.for_project(root, selected))
            results.append(StepResult(f"render {workflow.WORKFLOW_PATH}", Verdict.OK if changed else Verdict.PRESENT,
                                      f"{workflow.WORKFLOW_PATH} ({'changed' if changed else 'unchanged'})"))
    if args.json:
        return report(results, True, command="render")
    for r in results:
        print(f"{r.verdict.value:<8} {r.detail}")
    return 0


def _workflow_drift(root: Path, selected: list, full: bool) -> list:
    """.github/workflows/envs.yml (`envport matrix --format github`) against the specs, where the project has one."""
    from envport.core.verdict import StepResult, Verdict
    from envport.report import workflow
    if not full or not (root / workflow.WORKFLOW_PATH).exists():
        return []
    drifted = workflow.drift(root, workflow.for_project(root, selected))
    return [StepResult(f"render {workflow.WORKFLOW_PATH}", Verdict.FAILED if drifted else Verdict.OK,
                       "differs from the specs" if drifted else "matches the specs", lines=drifted)]


def _render_fix(args, renderings, every_spec: bool) -> str:
    """The one render command that clears every drift --check can report for this selection.

    Drift lines carry no fix of their own: `render NAME` followed by `render --all --check` used to
    print two (`envport matrix --format github` on the workflow, `envport render` below it), and the
    plain `envport render NAME` the user had just run fixes neither the workflow nor a stale images/ dir."""
    targets = "".join(f" --target {t}" for t in (args.target or ()))
    if every_spec:
        return f"envport render --all{targets}"
    return "envport render " + " ".join(r.name for r in renderings) + targets


def _print_check(results, as_json: bool, render_fix: str = "envport render --all") -> int:
    from envport.core.verdict import Verdict, report
    if as_json:
        return report(results, True, command="render")
    failed = [r for r in results if r.verdict is Verdict.FAILED]
    for r in failed:
        for ln in r.lines:
            print(f"drift: {ln}", file=sys.stderr)
    if failed:
        n = sum(len(r.lines) for r in failed)
        # A stale lock renders as unlocked recipes: lock first, then render.
        locks = sorted(r.step.split(" ", 1)[1] for r in failed if r.step.startswith("lock "))
        fix = (f"`envport lock {' '.join(locks)}`, then " if locks else "") + f"`{render_fix}`"
        print(f"FAILED   {n} file(s) differ from the specs; run {fix}", file=sys.stderr)
        return 1
    from envport.report.workflow import WORKFLOW_PATH
    flows = [r for r in results if r.step == f"render {WORKFLOW_PATH}"]
    print(f"OK       {len(results) - len(flows)} spec(s) match images/" + (f"; {WORKFLOW_PATH} matches" if flows else ""))
    return 0

"""`envport import`: an existing Dockerfile, .def, environment.yml, requirements file or install script -> a spec."""

from __future__ import annotations

from pathlib import Path

from envport.commands._common import project_root
from envport.core.verdict import envelope, print_json


def register(sub) -> None:
    p = sub.add_parser(
        "import", help="turn a Dockerfile, .def, environment.yml, requirements file or install script into a spec",
        description="Read an existing recipe and write specs/NAME.yaml (+ the files it copies under "
        "specs/files/NAME/), then print every construct that did not map exactly as FILE:LINE: what: what envport "
        "did: why (fix: ...). Exit 0 when the spec validates, 1 when it was written with fields to fill (marked "
        "FILL) or without a step that installs something it could not read or carry (a here-document RUN, an "
        "unmapped conda package, `pip install .` without --repo), 2 when the input cannot be read or its "
        "spec would pass a spec's bounds (2000 run commands, 64 KiB), 3 when the spec exists (pass --force). docs/import.md says what maps.")
    p.add_argument("file", metavar="FILE", help="the recipe to import")
    p.add_argument("--name", default=None, help="the spec's name (default: from the file or its folder)")
    p.add_argument("--kind", default=None, choices=["dockerfile", "def", "conda", "requirements", "shell"],
                   help="what FILE is (default: detected from its name and content)")
    p.add_argument("--context", default=None, metavar="DIR",
                   help="where COPY/%%files/-r find their files (default: FILE's folder)")
    p.add_argument("--base", default=None, help="the base image, where the source names none (conda, requirements)")
    p.add_argument("--python", default=None, help="the env's python (MAJOR.MINOR), where the source names none")
    p.add_argument("--repo", default=None, metavar="URL",
                   help="the git URL of the project the recipe installs from its checkout (`pip install .`); "
                   "with --commit it becomes `name @ git+URL@SHA`")
    p.add_argument("--commit", default=None, metavar="SHA", help="the full commit of --repo to install")
    p.add_argument("--dry-run", action="store_true", help="print the spec and the report; write nothing")
    p.add_argument("--force", action="store_true", help="replace an existing specs/NAME.yaml")
    p.add_argument("--json", action="store_true", help="print the result as JSON (docs/cli.md)")
    p.set_defaults(func=run)


def next_render(root: Path, name: str) -> str:
    """The render to run after an import. Where the project keeps the generated workflow, `render NAME` would
    leave it without the new spec's jobs and `render --all --check` (CI's drift check) failing: `--all`
    renders the new spec and regenerates the workflow in one step."""
    from envport.report.workflow import WORKFLOW_PATH

    if (root / WORKFLOW_PATH).exists():
        return f"envport render --all (renders images/{name}/ and keeps {WORKFLOW_PATH} in step)"
    return f"envport render {name}"


def run(args) -> int:
    from envport.porting.run import import_recipe

    root = project_root(args)
    result = import_recipe(Path(args.file), root, name=args.name, kind=args.kind,
                           context_dir=Path(args.context) if args.context else None, base=args.base,
                           python=args.python, dry_run=args.dry_run, force=args.force,
                           repo=args.repo, commit=args.commit)
    if args.json:
        print_json(envelope("import", result.exit_code, problems=result.problems, **result.as_dict()))
        return result.exit_code
    if args.dry_run:
        print(result.output.text, end="")
        print("# ---- report (dry run: nothing written) ----")
    mapped = ", ".join(f"{k} ({v})" if k not in ("base", "python") else k for k, v in result.mapped.items())
    print(f"envport import: {Path(args.file).name} ({result.kind}) -> {result.spec_path}")
    print(f"  mapped: {mapped or 'nothing'}")
    for note in result.notes:
        print(str(note))
    for field, why in result.output.fill:
        print(f"FILL     {field}: {why} (the spec holds a placeholder; edit it)")
    for problem in result.problems:
        print(f"FILL     {problem}")
    verb = "would be written" if args.dry_run else "written"
    if not set(result.mapped) - {"run_commands"}:
        print(f"INCOMPLETE {result.spec_path} {verb}: nothing in {Path(args.file).name} mapped exactly; the spec "
              "is a skeleton to finish from the lines above")
    elif result.lost:
        print(f"INCOMPLETE {result.spec_path} {verb}: {len(result.lost)} step(s) that may install something were "
              "not read or cannot be carried into the spec (`dropped (a step that may install something…)` "
              "above); add them to the spec by hand")
    elif result.valid:
        print(f"OK       {result.spec_path} {verb}; it validates (next: {next_render(root, result.name)})")
    else:
        print(f"INCOMPLETE {result.spec_path} {verb} with fields to fill (FILL above); `envport validate "
              f"{result.name}` lists what is left")
    return result.exit_code

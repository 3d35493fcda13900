"""`envport import`: detect the kind, read it into a draft, finish the draft, validate, write.

The imported spec is validated by the real loader (in a scratch project, so a
dry run writes nothing): it either validates, or the result names every field
the user must fill and the written spec marks them.  Nothing here ends in a
traceback: unreadable input is an ImportRefused with the file and the fix.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional

from envport.core.errors import Problem
from envport.porting.context import BuildContext
from envport.porting.report import REPORTED, Draft, Note, turned_into
from envport.porting.source import ImportRefused, read_text
from envport.porting.spec_text import Output, slug, spec_text
from envport.porting.weights import promote_weights
from envport.porting.witnesses import add_import_witnesses
from envport.spec.venv_needs import DISTRO_PYTHON, venv_packages
from envport.spec.yamlfile import MAX_BYTES

KINDS = ("dockerfile", "def", "conda", "requirements", "shell")
# Bounds on what an import writes: the loader refuses a spec file over its own bound (yamlfile.MAX_BYTES),
# so an import that would write a larger one stops with the reason instead of writing one that never loads.
MAX_RUN_COMMANDS = 2000


@dataclass
class Result:
    kind: str
    source: str
    name: str
    spec_path: str  # relative to the project root
    output: Output
    notes: list[Note]
    problems: list[Problem] = field(default_factory=list)  # what the loader refuses, besides the FILL fields
    written: bool = False
    dry_run: bool = False
    mapped: dict[str, int] = field(default_factory=dict)

    lost: list[Note] = field(default_factory=list)  # steps that were not read at all (report.LOST)

    @property
    def valid(self) -> bool:
        return not self.problems and not self.output.fill and not self.lost

    @property
    def exit_code(self) -> int:
        return 0 if self.valid else 1

    def as_dict(self) -> dict:
        """The command's own --json keys (after the envelope's command, exit_code, steps, problems)."""
        return {"kind": self.kind, "source": self.source, "name": self.name,
                "spec": self.spec_path, "written": self.written, "dry_run": self.dry_run, "valid": self.valid,
                "mapped": self.mapped, "fill": [{"field": f, "why": w} for f, w in self.output.fill],
                "lost": [n.as_dict() for n in self.lost],
                "notes": [n.as_dict() for n in self.notes],
                "files": sorted(f"specs/{p}" for p in self.output.files), "spec_text": self.output.text}


def detect(path: Path, text: str) -> str:
    name = path.name.lower()
    if name in ("dockerfile", "containerfile") or name.startswith(("dockerfile.", "containerfile.")) \
            or name.endswith((".dockerfile", ".containerfile")):
        return "dockerfile"
    if name.endswith(".def"):
        return "def"
    if name.endswith((".yml", ".yaml")):
        return "conda"
    if name.endswith((".sh", ".bash")):
        return "shell"
    if re.match(r"^(requirements|constraints).*\.(txt|in)$", name) or name.endswith(".in"):
        return "requirements"
    first = next((ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")), "")
    if text.startswith("#!"):
        return "shell"
    if re.match(r"(?i)^(from|arg)\s", first):
        return "dockerfile"
    if re.match(r"(?i)^bootstrap\s*:", first):
        return "def"
    if re.search(r"(?m)^dependencies\s*:", text):
        return "conda"
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    if lines and all(ln.startswith("-") or _is_requirement(ln) for ln in lines[:200]):
        return "requirements"
    return "shell"


def _is_requirement(line: str) -> bool:
    from packaging.requirements import InvalidRequirement, Requirement

    from envport.core.nesting import too_deep

    if too_deep(line):
        return False  # packaging's marker parser recurses per `(`
    try:
        Requirement(line.split(" #", 1)[0].split(" --", 1)[0].strip())
    except InvalidRequirement:
        return False
    return True


def read(path: Path, kind: Optional[str], context_dir: Optional[Path],
         project_repo: Optional[tuple[str, str]] = None) -> tuple[str, Draft]:
    label = path.name
    text = read_text(path, label)
    kind = kind or detect(path, text)
    context = BuildContext((context_dir or path.parent).resolve())
    draft = Draft(file=label, project_repo=project_repo)
    if kind == "dockerfile":
        from envport.porting.dockerfile import read_dockerfile
        read_dockerfile(text, label, context, draft)
    elif kind == "def":
        from envport.porting.deffile import read_def
        read_def(text, label, context, draft)
    elif kind == "conda":
        from envport.porting.conda import read_environment
        read_environment(text, label, draft, context.opener())
    elif kind == "requirements":
        from envport.porting.report import Phase
        from envport.porting.pip_args import requirements_file
        from envport.porting.requirements import PipContext
        phase = Phase(packages=[], file=label, line=1)
        requirements_file(text, label, PipContext(draft, label, None, context.opener()), phase)
        if phase.packages:
            draft.add_phase(phase)
    elif kind == "shell":
        from envport.porting.script import read_script
        read_script(text, label, draft, context.opener())
    else:
        raise ImportRefused(f"--kind {kind!r}: expected one of {', '.join(KINDS)}")
    return kind, draft


def finish(draft: Draft, base: Optional[str], python: Optional[str]) -> None:
    """Overrides from the command line, python from what the source implies, and order notes."""
    if base:
        draft.base = base
    if python:
        draft.python, draft.python_how, draft.python_guessed = python, "--python", False
    for pkg in draft.system_pkgs:
        m = re.match(r"^python(3\.\d{1,2})(-venv|-dev|-full)?$", pkg)
        if m:
            draft.set_python(m.group(1), f"the apt package {pkg}", None)
    if draft.base:
        m = re.match(r"^(?:[\w.-]+/)*python:(3\.\d{1,2})", draft.base)
        if m:
            draft.set_python(m.group(1), "the base image name", draft.base_line)
        elif draft.python is None:
            for key, version in DISTRO_PYTHON.items():
                if key in draft.base:
                    draft.set_python(version, f"the base's distribution ({key})", draft.base_line, guessed=True)
                    draft.note(draft.base_line, f"base {draft.base}", REPORTED,
                               f"the source names no python; {version} is the distribution's python3",
                               "check `python:` in the spec")
                    break
    if draft.base and draft.python:
        need = venv_packages(draft.base or "", draft.python or "", draft.system_pkgs)
        if need:
            draft.add_system(need)
            draft.note(draft.base_line, f"base {draft.base}", turned_into("system_pkgs"),
                       f"added {', '.join(need)}: envport makes the env with `python{draft.python} -m venv`, which "
                       "this Debian/Ubuntu base cannot run without them")
    _torch_order(draft)
    add_import_witnesses(draft)
    promote_weights(draft)
    last_pip = max((p.seq for p in draft.phases), default=0)
    for cmd, file, line, seq in draft.run_commands:
        if seq < last_pip:
            draft.note(line, cmd, REPORTED, "it ran before a later pip call in the source; envport runs "
                       "run_commands after every pip phase and shim file", "check it does not prepare something a "
                       "pip phase needs (a cloned source, a compiler)", file=file)
    # One reading order for the report: by file (the recipe first), then by line.
    draft.notes.sort(key=lambda n: (n.file != draft.file, n.file, n.line or 0))
    if len(draft.run_commands) > MAX_RUN_COMMANDS:
        raise ImportRefused(f"{draft.file}: {len(draft.run_commands)} run commands, more than an env spec holds "
                            f"({MAX_RUN_COMMANDS} at most); split the recipe, or turn its steps into a script "
                            "shipped as a shim file")


def _torch_order(draft: Draft) -> None:
    """A distribution that compiles against torch when it installs (flash-attn, torch-scatter) must follow the
    phase that installs torch; without one before it, its build fails (no torch to import), so it is lost."""
    from packaging.requirements import Requirement

    from envport.porting.conda import table
    from envport.spec.model import canonical_name

    needs = {canonical_name(n) for n in table()["needs_torch_at_build"]}
    torch_phase = None
    for ph in sorted(draft.phases, key=lambda p: p.seq):
        names = [canonical_name(Requirement(p).name) for p in ph.packages]
        for name, req in zip(names, ph.packages):
            if name not in needs:
                continue
            if torch_phase is not None:
                draft.note(ph.line, req, REPORTED, f"builds against torch when it installs: it must stay in a phase "
                           f"after the one at {torch_phase.file}:{torch_phase.line} that installs torch",
                           "keep the phase order; pin torch there so its build matches", file=ph.file)
            else:
                draft.lose(ph.line, req, "builds against torch when it installs, and no earlier phase installs "
                           "torch: its build fails (no module named torch)", "install torch in a phase before this "
                           "one", file=ph.file)
        if torch_phase is None and "torch" in names:
            torch_phase = ph


def _project_repo(repo: Optional[str], commit: Optional[str]) -> Optional[tuple[str, str]]:
    if repo is None and commit is None:
        return None
    if not repo or not re.match(r"^(https|ssh|file)://\S+$", repo):
        raise ImportRefused(f"--repo {repo!r}: expected the project's git URL (https://…, ssh://…), e.g. "
                            "--repo https://github.com/org/tool")
    if not commit or not re.match(r"^[0-9a-f]{40}$", commit):
        raise ImportRefused(f"--commit {commit!r}: expected the full 40-hex commit (git rev-parse HEAD), so the "
                            "env does not move with a branch")
    return repo, commit


def default_name(path: Path, draft: Draft) -> str:
    if draft.name_hint and slug(draft.name_hint):
        return slug(draft.name_hint)
    stem = path.stem if path.suffix and path.name.lower() not in ("dockerfile", "containerfile") else ""
    if stem.lower() in ("", "dockerfile", "containerfile", "requirements", "environment", "install", "setup"):
        stem = path.resolve().parent.name
    return slug(stem) or "imported"


def validate(out: Output) -> list[Problem]:
    """Problems the real loader finds in the imported spec (in a scratch project; nothing is written),
    their files named as in the project (`specs/NAME.yaml`)."""
    from envport.core.errors import EnvportError, SpecError
    from envport.spec.loader import load_spec

    with tempfile.TemporaryDirectory(prefix="envport-import-") as tmp:
        root = Path(tmp)
        (root / "specs").mkdir()
        (root / "specs" / f"{out.name}.yaml").write_text(out.text, encoding="utf-8")
        for rel, data in out.files.items():
            dest = root / "specs" / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data)
        try:
            load_spec(out.name, root)
        except SpecError as exc:
            here = str(root) + "/"
            return [replace(p, file=p.file.replace(here, ""), message=p.message.replace(here, ""),
                            fix=p.fix.replace(here, "")) for p in exc.problems]
        except EnvportError as exc:
            return [Problem(f"specs/{out.name}.yaml", None, "", str(exc).replace(str(root) + "/", ""))]
    return []


def mapped(draft: Draft) -> dict[str, int]:
    counts = {"base": int(bool(draft.base)), "python": int(bool(draft.python)), "system_pkgs": len(draft.system_pkgs),
              "pip_phases": len(draft.phases), "env": len(draft.env), "run_commands": len(draft.run_commands),
              "shim_files": len(draft.shims) + len(draft.blocks), "labels": len(draft.labels),
              "weight_dirs": len(draft.weight_dirs), "witnesses": len(draft.witness_imports)}
    return {k: v for k, v in counts.items() if v}


def import_recipe(path: Path, root: Path, name: Optional[str] = None, kind: Optional[str] = None,
                  context_dir: Optional[Path] = None, base: Optional[str] = None, python: Optional[str] = None,
                  dry_run: bool = False, force: bool = False, repo: Optional[str] = None,
                  commit: Optional[str] = None) -> Result:
    from envport.core.files import write_atomic
    from envport.spec.model import SLUG_RE

    if kind is not None and kind not in KINDS:
        raise ImportRefused(f"--kind {kind!r}: expected one of {', '.join(KINDS)}")
    kind, draft = read(path, kind, context_dir, _project_repo(repo, commit))
    finish(draft, base, python)
    name = name or default_name(path, draft)
    if not SLUG_RE.match(name):
        raise ImportRefused(f"--name {name!r}: expected lowercase letters, digits and '-' (at most 63), e.g. "
                            "--name my-env")
    out = spec_text(draft, name, kind, path.name)
    size = len(out.text.encode())
    if size > MAX_BYTES:
        raise ImportRefused(f"{draft.file}: the spec would be {size // 1024} KiB, more than a spec "
                            f"file holds ({MAX_BYTES // 1024} KiB at most); split the recipe, or turn its steps "
                            "into a script shipped as a shim file")
    result = Result(kind=kind, source=str(path), name=name, spec_path=f"specs/{name}.yaml", output=out,
                    notes=draft.notes, dry_run=dry_run, mapped=mapped(draft), lost=draft.lost)
    fill_fields = {f for f, _ in out.fill}
    result.problems = [p for p in validate(out) if p.field not in fill_fields]
    if dry_run:
        return result
    spec_path = root / "specs" / f"{name}.yaml"
    files_dir = root / "specs" / "files" / name
    if not force and (spec_path.exists() or spec_path.is_symlink()):
        raise ImportRefused(f"{result.spec_path} exists; envport import never overwrites a spec: pass --force to "
                            "replace it, or --name for another", exit_code=3)
    if not force and out.files and files_dir.exists():
        raise ImportRefused(f"specs/files/{name}/ exists; pass --force to replace it, or --name for another",
                            exit_code=3)
    if out.files and files_dir.exists():
        shutil.rmtree(files_dir)
    for rel, data in sorted(out.files.items()):
        write_atomic(root / "specs" / rel, data, 0o755 if data.startswith(b"#!") else 0o644)
    write_atomic(spec_path, out.text)
    result.written = True
    return result

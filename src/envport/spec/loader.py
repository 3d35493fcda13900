"""Load a spec file: YAML with line numbers, `extends` merging, validation.

Every problem in a file is reported at once, each naming the file, the line,
the field path, what was expected and a fix.  Nothing here writes files.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from envport.core.errors import EnvportError, Problem, SpecError
from envport.spec.model import SLUG_RE, Spec
from envport.spec.yamlfile import RawSpec, read_mapping, unreadable, validate

SPECS_DIR = "specs"

# Keys whose values merge as lists (parent first, then child: ordering is
# load-bearing for pip_phases and run_commands) or as dicts (child wins per key).
LIST_KEYS = ("system_pkgs", "pip_phases", "run_commands")
DICT_KEYS = ("env", "shim_files", "weight_dirs", "labels", "resources")
NOT_INHERITED = ("name", "description", "extends")


def read_yaml(path: Path) -> RawSpec:
    """A spec file as data with lines (bounded, never blocking; see spec/yamlfile)."""
    return read_mapping(path, "spec", "specs/demo-cpu.yaml")


def merge(parent: dict, child: dict) -> dict:
    """Merge a parent spec's fields under a child's (rules in docs/spec.md)."""
    out = {k: v for k, v in parent.items() if k not in NOT_INHERITED}
    for key, value in child.items():
        if key in LIST_KEYS and isinstance(value, list) and isinstance(out.get(key), list):
            merged = list(out[key]) + list(value)
            if key == "system_pkgs":
                merged = list(dict.fromkeys(merged))
            out[key] = merged
        elif key in DICT_KEYS and isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}
        elif key == "witnesses" and isinstance(value, dict) and isinstance(out.get(key), dict):
            w = {**out[key], **value}
            for lk in ("imports", "cli"):
                if isinstance(out[key].get(lk), list) and isinstance(value.get(lk), list):
                    w[lk] = out[key][lk] + [x for x in value[lk] if x not in out[key][lk]]
            out[key] = w
        else:
            out[key] = value
    return out


@dataclass
class Loaded:
    spec: Spec
    path: Path
    root: Path  # the project root holding specs/ and images/
    chain: list[Path]  # this spec first, then each parent it extends
    # The SIF whose embedded spec this is (sif/embedded.py): no project, so no shim file bytes.
    embedded_in: Path | None = None

    @property
    def specs_dir(self) -> Path:
        return self.root / SPECS_DIR

    def shim_bytes(self) -> dict[str, bytes]:
        """Container path -> file bytes, read once, in sorted order."""
        if self.embedded_in is not None:
            raise EnvportError(f"the shim files of {self.spec.name} are not known: its spec comes from "
                               f"{self.embedded_in}, which names them, not their bytes; run in its project")
        return {dest: (self.specs_dir / src).read_bytes() for dest, src in sorted(self.spec.shim_files.items())}


def find_root(start: Path | None = None) -> Path:
    """The nearest directory at or above `start` (default: cwd) holding specs/."""
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        if (d / SPECS_DIR).is_dir():
            return d
    raise EnvportError(
        f"no {SPECS_DIR}/ directory in {here} or any parent; run inside an envport project or pass -C ROOT"
    )


def resolve_ref(ref: str, root: Path | None) -> tuple[Path, Path]:
    """A spec given by name (specs/<name>.yaml) or by path -> (file, project root)."""
    p = Path(ref)
    if p.suffix in (".yaml", ".yml") or "/" in ref:
        # Where the user named it, not where a link points: a link out of specs/ is then refused
        # by _outside_specs instead of making its target's folder the project.
        path = Path(os.path.abspath(p))
        if root is None:
            root = path.parent.parent if path.parent.name == SPECS_DIR else find_root(path.parent)
        return path, root
    root = root or find_root()
    return root / SPECS_DIR / f"{ref}.yaml", root


def _outside_specs(path: Path, specs_dir: Path) -> Path | None:
    """Where PATH really is when that is outside specs/ (a link or `..` out of it), else None.

    Checked before the file is opened: a spec's lines are echoed in its error messages (an unknown
    key, a bad value), so reading /etc/shadow through a link would print its lines."""
    real = _real(path)
    return None if _real(specs_dir) in real.parents else real


def _load_raw_chain(path: Path, specs_dir: Path, seen: tuple[Path, ...] = ()) -> tuple[dict, list[RawSpec]]:
    if (real := _outside_specs(path, specs_dir)) is not None:
        raise SpecError([Problem(str(path), None, "", f"resolves outside {SPECS_DIR}/ (to {real}); envport reads "
                                 f"specs only from the project's {SPECS_DIR}/ and did not open it",
                                 f"copy the spec into {specs_dir}/ as a file (not a link out of it)")])
    raw = read_yaml(path)
    label = str(path)
    parent_name = raw.data.get("extends")
    if parent_name is None:
        return raw.data, [raw]
    if not isinstance(parent_name, str) or not SLUG_RE.match(parent_name):
        written = f", not {parent_name!r}" if isinstance(parent_name, str) else ""
        raise SpecError([Problem(label, raw.lines.get(("extends",)), "extends",
                                 f"expected the name of another spec in {SPECS_DIR}/{written} (a name, not a path)",
                                 "write e.g. `extends: base-cuda` for specs/base-cuda.yaml")])
    parent_path = specs_dir / f"{parent_name}.yaml"
    if (real := _outside_specs(parent_path, specs_dir)) is not None:
        raise SpecError([Problem(label, raw.lines.get(("extends",)), "extends",
                                 f"parent spec {parent_name!r} ({parent_path}) resolves outside {SPECS_DIR}/ "
                                 f"(to {real}); envport did not open it",
                                 f"make {SPECS_DIR}/{parent_name}.yaml a file in {SPECS_DIR}/, not a link out of it")])
    chain = seen + (_real(path),)
    if _real(parent_path) in chain:
        cycle = " -> ".join(p.stem for p in chain + (_real(parent_path),))
        raise SpecError([Problem(label, raw.lines.get(("extends",)), "extends", f"extends cycle: {cycle}",
                                 "remove one of the `extends` links")])
    if not os.path.lexists(parent_path):
        yml = parent_path.with_suffix(".yml")
        raise SpecError([Problem(label, raw.lines.get(("extends",)), "extends",
                                 f"parent spec {parent_name!r} not found at {parent_path}",
                                 f"rename {yml.name} to {parent_path.name} (spec files end in .yaml)"
                                 if os.path.lexists(yml) else
                                 f"create {SPECS_DIR}/{parent_name}.yaml or fix the name")])
    parent_data, parents = _load_raw_chain(parent_path, specs_dir, chain)
    # A parent must be a valid spec on its own, so its errors (shim files included,
    # which the child would otherwise report without a line) name its own file.
    file_problems = _file_problems(parent_data, parents[0], specs_dir, str(parent_path))
    try:
        _validate(parents[0], parent_data, str(parent_path))
    except SpecError as exc:
        raise SpecError(exc.problems + file_problems) from None
    if file_problems:
        raise SpecError(file_problems)
    return merge(parent_data, raw.data), [raw] + parents


def _validate(raw: RawSpec, data: dict, label: str) -> Spec:
    return validate(raw, data, Spec, label)


def _file_problems(data: dict, raw: RawSpec, specs_dir: Path, label: str) -> list[Problem]:
    """Shim sources and the name/file match, checked on the raw data so that they are
    reported together with any schema errors."""
    problems = []
    root = _real(specs_dir)
    shims = data.get("shim_files")
    shims = shims if isinstance(shims, dict) else {}
    for dest, src in shims.items():
        if not isinstance(src, str) or src.startswith("/") or ".." in src.split("/"):
            continue  # the schema reports these

        line = raw.lines.get(("shim_files", dest))
        target = (specs_dir / src)
        if root not in _real(target).parents:
            problems.append(Problem(label, line, f"shim_files.{dest}",
                                    f"source {src!r} resolves outside {SPECS_DIR}/ (a symlink?)",
                                    f"copy the file under {SPECS_DIR}/files/"))
        elif (why := unreadable(target)) is not None:
            message, fix = why
            if message == "file not found":
                message, fix = f"source file {target} does not exist", \
                    f"create it or fix the path (relative to {SPECS_DIR}/)"
            else:
                message = f"source file {target}: {message}"
            problems.append(Problem(label, line, f"shim_files.{dest}", message, fix))
    name = raw.data.get("name")
    if isinstance(name, str) and name != raw.path.stem and _real(raw.path.parent) == root:
        problems.append(Problem(label, raw.lines.get(("name",)), "name",
                                f"name {name!r} differs from the file name {raw.path.stem!r}",
                                f"rename the file to {name}.yaml or set name: {raw.path.stem}"))
    return problems


def load_spec(ref: str, root: Path | None = None) -> Loaded:
    """Load, merge and validate one spec by name or path; raise SpecError with every problem."""
    path, root = resolve_ref(ref, root)
    if path.suffix != ".yaml":
        raise SpecError([Problem(str(path), None, "", "spec files must end in .yaml (`--all` reads only those)",
                                 f"rename it to {path.stem}.yaml")])
    specs_dir = root / SPECS_DIR
    data, raws = _load_raw_chain(path, specs_dir)
    problems = _file_problems(data, raws[0], specs_dir, str(path))
    try:
        spec = _validate(raws[0], data, str(path))
    except SpecError as exc:
        raise SpecError(exc.problems + problems) from None
    if problems:
        raise SpecError(problems)
    return Loaded(spec=spec, path=path, root=root, chain=[r.path for r in raws])


def all_spec_names(root: Path) -> list[str]:
    """Every `specs/*.yaml`: directories, FIFOs and broken links too, so that they are reported, not skipped."""
    return sorted(p.stem for p in (root / SPECS_DIR).glob("*.yaml"))


def stray_spec_problems(root: Path) -> list[Problem]:
    """`specs/*.yml` (and other case variants): refused everywhere, so `--all` never skips a spec silently.

    One extension keeps one name -> one file (`x.yaml` and `x.yml` never both
    claim env `x`), and `extends: x` has one place to look.
    """
    problems = []
    for p in sorted((root / SPECS_DIR).iterdir()) if (root / SPECS_DIR).is_dir() else []:
        if p.suffix.lower() in (".yml", ".yaml") and p.suffix != ".yaml":
            problems.append(Problem(str(p), None, "", "spec files must end in .yaml; this one is not read",
                                    f"rename it to {p.stem}.yaml"))
    return problems


def _real(path: Path) -> Path:
    # Path.resolve() raises RuntimeError on a symlink loop; realpath leaves the loop for the read to report.
    return Path(os.path.realpath(path))


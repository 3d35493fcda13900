"""Load a spec file: YAML with line numbers, `extends` merging, validation.

Every problem in a file is reported at once, each naming the file, the line,
the field path, what was expected and a fix.  Nothing here writes files.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from envport.core.errors import EnvportError, Problem, SpecError
from envport.spec.model import Spec

SPECS_DIR = "specs"

# Keys whose values merge as lists (parent first, then child: ordering is
# load-bearing for pip_phases and run_commands) or as dicts (child wins per key).
LIST_KEYS = ("system_pkgs", "pip_phases", "run_commands")
DICT_KEYS = ("env", "shim_files", "weight_dirs", "labels", "resources")
NOT_INHERITED = ("name", "description", "extends")


class _LineLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys and remembers where each value is."""


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None,
                f"duplicate key {key!r} (first on line {seen[key] + 1}); YAML would silently keep only the last",
                key_node.start_mark,
            )
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=deep)


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _positions(node: yaml.Node, path: tuple = (), out: dict | None = None) -> dict[tuple, int]:
    """Map each field path (('pip_phases', 2, 0), ...) to its 1-based line."""
    out = {} if out is None else out
    out[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = key_node.value
            out[path + (key,)] = key_node.start_mark.line + 1
            _positions(value_node, path + (key,), out)
            out[path + (key,)] = key_node.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _positions(item, path + (i,), out)
    return out


@dataclass
class RawSpec:
    path: Path
    data: dict
    lines: dict[tuple, int] = field(default_factory=dict)


def read_yaml(path: Path) -> RawSpec:
    label = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError([Problem(label, None, "", "file not found", "check the name or path")]) from None
    except UnicodeDecodeError as exc:
        raise SpecError([Problem(label, None, "", f"not UTF-8 text ({exc.reason})", "save it as UTF-8")]) from None
    try:
        node = yaml.compose(text, Loader=_LineLoader)
        data = yaml.load(text, Loader=_LineLoader) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        raise SpecError([Problem(label, line, "", f"invalid YAML: {exc.problem or exc}",
                                 "fix the syntax at that line")]) from None
    except yaml.YAMLError as exc:
        raise SpecError([Problem(label, None, "", f"invalid YAML: {exc}", "fix the syntax")]) from None
    if data is None:
        raise SpecError([Problem(label, None, "", "the file is empty", "start from specs/demo-cpu.yaml")])
    if not isinstance(data, dict):
        raise SpecError([Problem(label, node.start_mark.line + 1, "",
                                 f"expected a mapping of spec fields, got {type(data).__name__}",
                                 "write `name: ...`, `base: ...` at the top level")])
    return RawSpec(path, data, _positions(node))


def format_loc(loc: tuple) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _yaml_loc(loc: tuple, lines: dict[tuple, int]) -> tuple[tuple, int | None]:
    """The field path as the user wrote it, and the line of its nearest known part."""
    loc = tuple(loc)
    # pydantic marks an error in a mapping's key with a trailing "[key]"; the key is the field.
    if loc and loc[-1] == "[key]":
        loc = loc[:-1]
    # A phase written as a bare list has no `packages` key in the YAML.
    if len(loc) >= 3 and loc[0] == "pip_phases" and loc[2] == "packages" and loc[:3] not in lines:
        loc = loc[:2] + loc[3:]
    for n in range(len(loc), -1, -1):
        if loc[:n] in lines:
            return loc, lines[loc[:n]]
    return loc, None


FIXES = {
    "extra_forbidden": "remove it, or check the spelling against docs/spec.md",
    "missing": "add it (see docs/spec.md)",
    "string_type": "write a string (quote it in YAML)",
    "list_type": "write a YAML list",
    "dict_type": "write a YAML mapping",
    "bool_type": "write true or false",
    "int_type": "write a whole number",
    "int_parsing": "write a whole number",
    "too_short": "add at least one entry, or remove the field",
}


def problems_from(exc: ValidationError, raw: RawSpec, label: str) -> list[Problem]:
    problems = []
    for err in exc.errors(include_url=False):
        loc, line = _yaml_loc(err["loc"], raw.lines)
        kind = err["type"]
        msg = err["msg"]
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        if kind == "extra_forbidden":
            msg = f"unknown key {loc[-1]!r}"
        elif kind == "missing":
            msg = "required field is missing"
        problems.append(Problem(label, line, format_loc(loc), msg, FIXES.get(kind, "")))
    return problems


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

    @property
    def specs_dir(self) -> Path:
        return self.root / SPECS_DIR

    def shim_bytes(self) -> dict[str, bytes]:
        """Container path -> file bytes, read once, in sorted order."""
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
        path = p.resolve()
        if root is None:
            root = path.parent.parent if path.parent.name == SPECS_DIR else find_root(path.parent)
        return path, root
    root = root or find_root()
    return root / SPECS_DIR / f"{ref}.yaml", root


def _load_raw_chain(path: Path, specs_dir: Path, seen: tuple[Path, ...] = ()) -> tuple[dict, list[RawSpec]]:
    raw = read_yaml(path)
    label = str(path)
    parent_name = raw.data.get("extends")
    if parent_name is None:
        return raw.data, [raw]
    if not isinstance(parent_name, str):
        raise SpecError([Problem(label, raw.lines.get(("extends",)), "extends",
                                 "expected the name of another spec in specs/", "write e.g. `extends: base-cuda`")])
    parent_path = specs_dir / f"{parent_name}.yaml"
    chain = seen + (path.resolve(),)
    if parent_path.resolve() in chain:
        cycle = " -> ".join(p.stem for p in chain + (parent_path.resolve(),))
        raise SpecError([Problem(label, raw.lines.get(("extends",)), "extends", f"extends cycle: {cycle}",
                                 "remove one of the `extends` links")])
    if not parent_path.is_file():
        raise SpecError([Problem(label, raw.lines.get(("extends",)), "extends",
                                 f"parent spec {parent_name!r} not found at {parent_path}",
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
    try:
        return Spec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(problems_from(exc, raw, label)) from None


def _file_problems(data: dict, raw: RawSpec, specs_dir: Path, label: str) -> list[Problem]:
    """Shim sources and the name/file match, checked on the raw data so that they are
    reported together with any schema errors."""
    problems = []
    root = specs_dir.resolve()
    shims = data.get("shim_files")
    shims = shims if isinstance(shims, dict) else {}
    for dest, src in shims.items():
        if not isinstance(src, str) or src.startswith("/") or ".." in src.split("/"):
            continue  # the schema reports these

        line = raw.lines.get(("shim_files", dest))
        target = (specs_dir / src)
        resolved = target.resolve()
        if root not in resolved.parents:
            problems.append(Problem(label, line, f"shim_files.{dest}",
                                    f"source {src!r} resolves outside {SPECS_DIR}/ (a symlink?)",
                                    f"copy the file under {SPECS_DIR}/files/"))
        elif not target.is_file():
            problems.append(Problem(label, line, f"shim_files.{dest}", f"source file {target} does not exist",
                                    f"create it or fix the path (relative to {SPECS_DIR}/)"))
    name = raw.data.get("name")
    if isinstance(name, str) and name != raw.path.stem and raw.path.parent.resolve() == root:
        problems.append(Problem(label, raw.lines.get(("name",)), "name",
                                f"name {name!r} differs from the file name {raw.path.stem!r}",
                                f"rename the file to {name}.yaml or set name: {raw.path.stem}"))
    return problems


def load_spec(ref: str, root: Path | None = None) -> Loaded:
    """Load, merge and validate one spec by name or path; raise SpecError with every problem."""
    path, root = resolve_ref(ref, root)
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
    return sorted(p.stem for p in (root / SPECS_DIR).glob("*.yaml"))


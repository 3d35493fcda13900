"""YAML with line numbers -> a pydantic model -> Problems: one helper for specs, sites and clusters.

A spec, a site profile or a cluster profile is small text a person wrote, so
everything here is bounded and every failure is a Problem naming FILE[:LINE]:

- the file is checked with stat before it is opened and opened non-blocking:
  a FIFO, a directory, a symlink loop or an unreadable file is a problem, never
  a hang or a traceback;
- aliases and anchors are refused (`&a`/`*a`): nested aliases expand
  exponentially (a 399-byte file took 1.1 GB), and a spec never needs them;
- nesting deeper than MAX_DEPTH is refused before Python's recursion limit is;
- the document is composed once and walked once: the walk builds the data,
  each path's line and each plain scalar's source text (so a message can say
  "quote it: '0755'" with what the user wrote, not what YAML made of it).
"""

from __future__ import annotations

import difflib
import errno
import os
import stat
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from envport.core.errors import Problem, SpecError

# Far above any real spec (the largest committed one is ~3 KB); a bound, not a style rule.
MAX_BYTES = 64 * 1024
MAX_DEPTH = 32
# A number or date written with more characters than this is not one a person meant
# (YAML would build a 100k-digit int from `59:59:...`, slowly); refused before it is built.
MAX_NUMBER_CHARS = 100


@dataclass
class RawSpec:
    """One YAML file as data, with where each field path is and how each plain scalar was written."""

    path: Path
    data: Any
    lines: dict[tuple, int] = field(default_factory=dict)
    plain: dict[tuple, str] = field(default_factory=dict)  # path -> source text of an unquoted scalar


def _problem(label: str, message: str, fix: str, line: int | None = None) -> SpecError:
    return SpecError([Problem(label, line, "", message, fix)])


def read_bytes(path: Path, label: str | None = None, limit: int = MAX_BYTES) -> bytes:
    """A regular file's bytes, or a SpecError saying why not: never blocks, never a traceback."""
    label = label or str(path)
    try:
        st = os.stat(path)
    except OSError as exc:
        raise _problem(label, *_os_reason(exc)) from None
    if (why := _not_a_file(st.st_mode)) is not None:
        raise _problem(label, *why)
    try:
        # O_NONBLOCK: the file may have been swapped for a FIFO since the stat.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise _problem(label, *_os_reason(exc)) from None
    try:
        if (why := _not_a_file(os.fstat(fd).st_mode)) is not None:
            raise _problem(label, *why)
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise _problem(label, *_os_reason(exc)) from None
    finally:
        os.close(fd)
    if size > limit:
        raise _problem(label, f"is larger than {limit // 1024} KiB; not a hand-written YAML file",
                       "check the path")
    return b"".join(chunks)


def _not_a_file(mode: int) -> tuple[str, str] | None:
    if stat.S_ISDIR(mode):
        return "is a directory, not a file", "remove or rename the directory"
    if not stat.S_ISREG(mode):
        return "is not a regular file (a FIFO, socket or device); reading it could block", \
            "replace it with a regular file"
    return None


def _os_reason(exc: OSError) -> tuple[str, str]:
    if exc.errno == errno.ENOENT:
        return "file not found", "check the name or path"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "permission denied", "make it readable (chmod a+r), or run as a user who can read it"
    if exc.errno == errno.ELOOP:
        return "symlink loop (too many levels of symbolic links)", "point the link at a real file"
    if exc.errno == errno.EISDIR:
        return "is a directory, not a file", "remove or rename the directory"
    if exc.errno == errno.ENAMETOOLONG:
        return "file name too long", "check the path"
    return f"cannot read it: {exc.strerror or exc}", "check the file"


def unreadable(path: Path) -> tuple[str, str] | None:
    """Why a file that will be read later (a shim source) cannot be: (message, fix), or None."""
    try:
        if (why := _not_a_file(os.stat(path).st_mode)) is not None:
            return why
        os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)))
    except OSError as exc:
        return _os_reason(exc)
    return None


def read_text(path: Path, label: str | None = None) -> str:
    label = label or str(path)
    data = read_bytes(path, label)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise _problem(label, f"not UTF-8 text (byte 0x{data[exc.start]:02x} at line {line})",
                       "save it as UTF-8", line) from None


class _Refused(yaml.composer.ComposerError):
    """Valid YAML that envport does not read (aliases, anchors, depth): (message, fix) and the line."""

    def __init__(self, message: str, fix: str, mark):
        super().__init__(None, None, message, mark)
        self.fix = fix


class _Composer(yaml.SafeLoader):
    """Composes nodes only: refuses aliases and nesting deeper than MAX_DEPTH."""

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise _Refused(f"YAML alias *{event.anchor} is not supported (aliases can expand exponentially)",
                           "write the value out", event.start_mark)
        event = self.peek_event()
        if getattr(event, "anchor", None):
            raise _Refused(f"YAML anchor &{event.anchor} is not supported (aliases can expand exponentially)",
                           "write the value out where it is used", event.start_mark)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _Refused(f"nested deeper than {MAX_DEPTH} levels", "flatten the structure", event.start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


_TAG_PREFIX = "tag:yaml.org,2002:"
_SCALAR_TAGS = {f"{_TAG_PREFIX}{t}" for t in ("str", "int", "float", "bool", "null", "timestamp")}
_NUMBER_TAGS = {f"{_TAG_PREFIX}{t}" for t in ("int", "float", "timestamp")}


class _Walk:
    """Node tree -> data, lines and plain-scalar text, in one pass (no alias: each node is seen once)."""

    def __init__(self, label: str):
        self.label = label
        self.constructor = yaml.SafeLoader("")
        self.lines: dict[tuple, int] = {}
        self.plain: dict[tuple, str] = {}

    def value(self, node: yaml.Node, path: tuple) -> Any:
        self.lines.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            self.tag(node, "map", path)
            return self.mapping(node, path)
        if isinstance(node, yaml.SequenceNode):
            self.tag(node, "seq", path)
            return [self.value(item, path + (i,)) for i, item in enumerate(node.value)]
        if node.style is None and node.tag != f"{_TAG_PREFIX}str":
            self.plain[path] = node.value
        return self.scalar(node, path)

    def tag(self, node: yaml.Node, kind: str, path: tuple) -> None:
        if node.tag != f"{_TAG_PREFIX}{kind}":
            raise self.error(node, f"YAML tag {node.tag!r} is not supported", "remove the tag", path)

    def scalar(self, node: yaml.Node, path: tuple) -> Any:
        if not isinstance(node, yaml.ScalarNode):
            raise self.error(node, "a mapping key must be a plain value, not a list or mapping",
                             "write `key: value`", path)
        if node.tag not in _SCALAR_TAGS:
            raise self.error(node, f"YAML tag {node.tag!r} is not supported", "remove the tag", path)
        if node.tag in _NUMBER_TAGS and len(node.value) > MAX_NUMBER_CHARS:
            kind = {"int": "a whole number", "float": "a number"}.get(node.tag[len(_TAG_PREFIX):], "a date")
            raise self.error(node, f"{kind} written with {len(node.value)} characters (at most {MAX_NUMBER_CHARS})",
                             "quote it if it is text", path)
        try:
            return self.constructor.construct_object(node)
        except (yaml.YAMLError, ValueError, OverflowError) as exc:
            raise self.error(node, f"cannot read the value {node.value[:40]!r}: {exc}", "quote it", path) from None

    def mapping(self, node: yaml.MappingNode, path: tuple) -> dict:
        out: dict = {}
        for key_node, value_node in node.value:
            if key_node.tag == f"{_TAG_PREFIX}merge":
                raise self.error(key_node, "YAML merge keys (<<) are not supported", "write the keys out", path)
            key = self.scalar(key_node, path)
            if key is None:
                raise self.error(key_node, "a mapping key must not be empty", "write `key: value`", path)
            if key in out:
                read_as = "" if key_node.value == key else f", both read by YAML as {key!r}"
                raise self.error(key_node, f"duplicate key {key_node.value!r} (first on line "
                                 f"{self.lines[path + (key,)]}{read_as}); YAML would silently keep only the last",
                                 "remove one of them (or quote the keys)", path)
            if not isinstance(key, str) and key_node.style is None:
                self.plain[path + (key, "[key]")] = key_node.value  # `ON:` is the key True in YAML 1.1
            # A key's own line, not its value's, names the field (`env:` above its mapping).
            self.lines[path + (key,)] = key_node.start_mark.line + 1
            out[key] = self.value(value_node, path + (key,))
        return out

    def error(self, node: yaml.Node, message: str, fix: str, path: tuple) -> SpecError:
        return SpecError([Problem(self.label, node.start_mark.line + 1, format_loc(path), message, fix)])


def compose(text: str, label: str) -> yaml.Node | None:
    """YAML text -> its node tree, bounded (size, depth, no aliases), or a SpecError naming the line.

    The one way envport reads YAML a person gave it: specs, site and cluster profiles here, an
    import's environment.yml in porting/conda (which walks the nodes for their lines)."""
    if len(text) > MAX_BYTES:
        raise _problem(label, f"is larger than {MAX_BYTES // 1024} KiB; not a hand-written YAML file",
                       "check the path")
    loader = None
    try:
        loader = _Composer(text)
        return loader.get_single_node()
    except _Refused as exc:
        raise _problem(label, exc.problem, exc.fix, exc.problem_mark.line + 1) from None
    except yaml.reader.ReaderError as exc:
        line = text[:exc.position].count("\n") + 1
        raise _problem(label, f"character {exc.character:#06x} is not allowed in YAML",
                       "remove it (control characters cannot be written in a spec)", line) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        raise _problem(label, f"invalid YAML: {exc.problem or exc}", "fix the syntax at that line",
                       mark.line + 1 if mark else None) from None
    except yaml.YAMLError as exc:
        raise _problem(label, f"invalid YAML: {exc}", "fix the syntax") from None
    except RecursionError:
        raise _problem(label, "nested too deeply", f"keep nesting under {MAX_DEPTH} levels") from None
    finally:
        if loader is not None:
            loader.dispose()


def parse(text: str, path: Path, label: str | None = None) -> RawSpec:
    """YAML text -> RawSpec, or a SpecError naming the line."""
    label = label or str(path)
    node = compose(text, label)
    if node is None:
        return RawSpec(path, None)
    walk = _Walk(label)
    data = walk.value(node, ())
    return RawSpec(path, data, walk.lines, walk.plain)


def read_mapping(path: Path, what: str, example: str) -> RawSpec:
    """A file that must hold one YAML mapping (a spec, a site or cluster profile)."""
    label = str(path)
    raw = parse(read_text(path, label), path, label)
    if raw.data is None:
        raise _problem(label, "the file is empty", f"start from {example}")
    if not isinstance(raw.data, dict):
        raise _problem(label, f"expected a mapping of {what} fields, got {type(raw.data).__name__}",
                       "write `key: value` lines at the top level", raw.lines.get(()))
    return raw


# ---- pydantic errors -> Problems ---------------------------------------------------------------

FIXES = {
    "extra_forbidden": "remove it, or check the spelling against docs/spec.md",
    "missing": "add it (see docs/spec.md)",
    "string_type": "write a string (quote it in YAML)",
    "list_type": "write a YAML list",
    "dict_type": "write a YAML mapping",
    "bool_type": "write true or false (unquoted)",
    "int_type": "write a whole number",
    "int_parsing": "write a whole number",
    "too_short": "add at least one entry, or remove the field",
}


def format_loc(loc: tuple) -> str:
    text = ""
    for part in loc:
        index = isinstance(part, int) and not isinstance(part, bool)
        text += f"[{part}]" if index else (f".{part}" if text else str(part))
    return text


def yaml_loc(loc: tuple, lines: dict[tuple, int]) -> tuple[tuple, int | None]:
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


def _unwrap(tp: Any) -> Any:
    """The model or container type behind Annotated[...] / Optional[...]."""
    while True:
        origin = typing.get_origin(tp)
        if origin is typing.Annotated:
            tp = typing.get_args(tp)[0]
        elif origin is typing.Union:
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            models = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
            tp = models[0] if models else args[0]
        else:
            return tp


def known_keys(model: type[BaseModel], loc: tuple) -> list[str]:
    """The field names allowed at `loc` (the mapping that holds the bad key), [] when unknown."""
    tp: Any = model
    for part in loc:
        tp = _unwrap(tp)
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            if part not in tp.model_fields:
                return []
            tp = tp.model_fields[part].annotation
        elif typing.get_origin(tp) in (list, tuple) and isinstance(part, int):
            tp = typing.get_args(tp)[0]
        elif typing.get_origin(tp) is dict:
            tp = typing.get_args(tp)[1]
        else:
            return []
    tp = _unwrap(tp)
    return sorted(tp.model_fields) if isinstance(tp, type) and issubclass(tp, BaseModel) else []


def _yaml_reading(text: str, value: Any) -> str:
    if value is None:
        return f"{text!r} is read by YAML as null"
    kind = {bool: "a boolean", int: "a number", float: "a number"}.get(type(value))
    return f"{text!r} is read by YAML as {kind} ({value!r})" if kind else f"{text!r} is read by YAML as a date ({value})"


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def problems_from(exc: ValidationError, raw: RawSpec, label: str, model: type[BaseModel] | None = None) -> list[Problem]:
    problems = []
    for err in exc.errors(include_url=False):
        plain = raw.plain.get(tuple(err["loc"]))  # a scalar's (or a key's) source text, if YAML changed it
        loc, line = yaml_loc(err["loc"], raw.lines)
        if plain is not None and err["loc"][-1] == "[key]":
            loc = loc[:-1] + (plain,)  # name the key as written (`ON`), not as YAML read it (True)
        kind = err["type"]
        msg = err["msg"]
        fix = FIXES.get(kind, "")
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        if kind == "extra_forbidden":
            msg = f"unknown key {loc[-1]!r}"
            close = difflib.get_close_matches(str(loc[-1]), known_keys(model, loc[:-1]), n=1) if model else []
            if close:
                msg += f"; did you mean {close[0]!r}?"
        elif kind == "missing":
            msg = "required field is missing"
        elif kind == "string_type" and plain is not None:
            # The user wrote text; YAML 1.1 made it something else (0755 -> 493, yes -> true).
            msg = f"expected text, but {_yaml_reading(_short(plain), err.get('input'))}"
            fix = f"quote it: '{_short(plain)}'"
        problems.append(Problem(label, line, format_loc(loc), msg, fix))
    return problems


def load_model(path: Path, model: type[BaseModel], what: str, example: str):
    """Read a YAML mapping file and validate it as `model`; a SpecError carries every problem."""
    raw = read_mapping(path, what, example)
    return validate(raw, raw.data, model, str(path))


def validate(raw: RawSpec, data: dict, model: type[BaseModel], label: str):
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise SpecError(problems_from(exc, raw, label, model)) from None

"""What changed between two builds of one env, in words: spec fields and distribution versions, old -> new.

One walk over two JSON-shaped spec dumps (`Spec.model_dump(mode="json")`), and one comparison of two
`{name: version}` sets: `envport inspect` names a stale SIF's changed fields with it, `envport lock` what
moved between two locks, `envport build` what a rebuild changed since the env it replaces.  Pure: the
callers find the two sides (a SIF's embedded spec, the lock before, the ledger's record of the old build).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Mapping, Union

ABSENT = object()  # a key one side has and the other has not
# The name a package or requirement is known by (`scipy==1.17.1`, `libgomp1=12.2.0-14`, `torch @ URL`),
# so an edited pin reads as one change, not a removal and an addition.
_NAME = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._+-]*)")


@dataclass(frozen=True)
class Change:
    path: str  # `env.OMP_NUM_THREADS`, `pip_phases[1].packages`, `system_pkgs`
    old: Any  # ABSENT when the field was added
    new: Any  # ABSENT when it was removed

    @property
    def kind(self) -> str:
        return "added" if self.old is ABSENT else "removed" if self.new is ABSENT else "changed"

    def line(self) -> str:
        """`path: old -> new`; a list of names says what entered and left it (`system_pkgs: + libgomp1`)."""
        if self.kind == "added":
            return f"{self.path}: added, {_show(self.new)}"
        if self.kind == "removed":
            return f"{self.path}: removed (was {_show(self.old)})"
        if _names_list(self.old) and _names_list(self.new):
            return f"{self.path}: {_list_moves(self.old, self.new)}"
        return f"{self.path}: {_show(self.old)} -> {_show(self.new)}"


def field_changes(old: Any, new: Any, path: str = "") -> list[Change]:
    """Every field that differs between two JSON-like spec dumps, keys in sorted order.
    A list of names (packages, requirements) is one field; other lists are compared item by item."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for key in sorted(set(old) | set(new)):
            sub = f"{path}.{key}" if path else str(key)
            a, b = old.get(key, ABSENT), new.get(key, ABSENT)
            out += field_changes(a, b, sub) if a is not ABSENT and b is not ABSENT else [Change(sub, a, b)]
        return out
    if isinstance(old, list) and isinstance(new, list) and not (_names_list(old) and _names_list(new)):
        out = [c for i, (a, b) in enumerate(zip(old, new)) for c in field_changes(a, b, f"{path}[{i}]")]
        out += [Change(f"{path}[{i}]", ABSENT, b) for i, b in enumerate(new[len(old):], len(old))]
        out += [Change(f"{path}[{i}]", a, ABSENT) for i, a in enumerate(old[len(new):], len(new))]
        return out
    return [] if old == new else [Change(path or "(whole spec)", old, new)]


def changed_paths(old: Any, new: Any) -> list[str]:
    """The changed fields by path alone (`env.X`, `env.Y (added)`): a one-line summary."""
    return [c.path if c.kind == "changed" else f"{c.path} ({c.kind})" for c in field_changes(old, new)]


def spec_lines(old: Any, new: Any) -> list[str]:
    """One `path: old -> new` line per changed field."""
    return [c.line() for c in field_changes(old, new)]


Dist = Union[str, tuple]  # a version, or (version, sha256 of its file)


def dist_lines(was: Mapping[str, Dist], now: Mapping[str, Dist]) -> list[str]:
    """Every distribution that moved, sorted by name: `name: old -> new`, `name: new, v`, `name: gone (was v)`;
    with file digests, the same version from another file is a change too."""
    out = []
    for name in sorted(set(was) | set(now)):
        a, b = _dist(was.get(name)), _dist(now.get(name))
        if a is None:
            out.append(f"{name}: new, {b[0]}")
        elif b is None:
            out.append(f"{name}: gone (was {a[0]})")
        elif a[0] != b[0]:
            out.append(f"{name}: {a[0]} -> {b[0]}")
        elif a[1] and b[1] and a[1] != b[1]:
            out.append(f"{name}: {a[0]}, another file (sha256 {a[1][:12]} -> {b[1][:12]})")
    return out


def _dist(value: Dist | None) -> tuple[str, str] | None:
    if value is None:
        return None
    return (value, "") if isinstance(value, str) else (str(value[0]), str(value[1] or ""))


def _names_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _name(item: str) -> str:
    m = _NAME.match(item)
    return re.sub(r"[-_.]+", "-", m.group(1) if m else item).lower()


def _list_moves(old: list[str], new: list[str]) -> str:
    """`a==1 -> a==2, + b, - c`; the same items in another order is `reordered` (phases and commands run in
    order)."""
    gone = [x for x in old if x not in new]
    came = [x for x in new if x not in old]
    parts = []
    for item in list(gone):
        twin = next((c for c in came if _name(c) == _name(item)), None)
        if twin is not None:
            parts.append(f"{item} -> {twin}")
            gone.remove(item)
            came.remove(twin)
    parts += [f"+ {x}" for x in came] + [f"- {x}" for x in gone]
    return ", ".join(parts) if parts else f"reordered: {', '.join(new)}"


def _show(value: Any) -> str:
    """A value as the spec writes it: a string bare, anything else as compact JSON without its empty fields
    (an added pip phase reads `{"packages":["x==1"]}`, not every default)."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        value = {k: v for k, v in value.items() if v not in (None, False, [], {}, "")}
    return json.dumps(value, sort_keys=True, separators=(",", ":"))

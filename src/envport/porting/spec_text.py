"""A draft -> the spec's YAML text and the shim files it names, deterministic.

Scalars are written as JSON strings (valid YAML, every character explicit),
so a value YAML would read as a number or a bool (`"8"`, `"on"`) stays a
string.  Each pip phase and run command carries a comment naming its source
line; fields the user must fill hold a placeholder the spec refuses and a
`# FILL:` comment saying what goes there.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Optional

from envport.porting.report import Draft

FILL_BASE = "<fill: base image, e.g. debian:bookworm-slim>"
FILL_PYTHON = "<fill: MAJOR.MINOR, e.g. 3.11>"


@dataclass
class Output:
    name: str
    text: str
    files: dict[str, bytes] = field(default_factory=dict)  # path relative to specs/ -> bytes
    fill: list[tuple[str, str]] = field(default_factory=list)  # (field, why)


def q(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value, ensure_ascii=False)


def _key(key: str) -> str:
    return key if re.match(r"^[A-Za-z_/][A-Za-z0-9_./-]*$", key) and not key.endswith(":") else q(key)


def _where(file: str, line: Optional[int]) -> str:
    return f"{file}:{line}" if line else file


def _shim_names(draft: Draft, name: str) -> dict[str, tuple[str, bytes]]:
    """container path -> (source under specs/, bytes), one file name per source, collisions numbered."""
    out, used = {}, set()
    items = [(dest, host.read_bytes()) for dest, (host, _, _) in sorted(draft.shims.items())]
    items += [(dest, data) for dest, (data, _, _) in sorted(draft.blocks.items())]
    for dest, data in items:
        base = re.sub(r"[^A-Za-z0-9._+@=,%-]+", "-", dest.rsplit("/", 1)[-1]).strip("-.") or "file"
        candidate, n = base, 1
        while candidate in used:
            n += 1
            candidate = f"{n}-{base}"
        used.add(candidate)
        out[dest] = (f"files/{name}/{candidate}", data)
    return out


def spec_text(draft: Draft, name: str, kind: str, source_label: str) -> Output:
    out = Output(name=name, text="")
    lines = _header(name, kind, source_label)
    for section in SECTIONS:
        lines += section(draft, out)
    out.text = "\n".join(lines) + "\n"
    return out


def _header(name: str, kind: str, source_label: str) -> list[str]:
    return ["# yaml-language-server: $schema=../docs/spec.schema.json",
            f"# Imported by `envport import` from {source_label} ({kind}); `envport import` printed what did not",
            "# map exactly, with FILE:LINE. Edit this file, not the source recipe.",
            f"name: {q(name)}",
            f"description: {q(f'Imported from {source_label} by envport import.')}"]


# One writer per spec field, in the spec's field order: (draft, out) -> its lines ([] when the draft has none).
# A writer that cannot fill its field adds to out.fill; shim_files adds the files it names to out.files.
def _base(draft: Draft, out: Output) -> list[str]:
    if draft.base:
        return [f"base: {q(draft.base)}"]
    out.fill.append(("base", "no base image could be read from the source"))
    return [f"base: {q(FILL_BASE)}  # FILL: the docker image the env starts from"]


def _python(draft: Draft, out: Output) -> list[str]:
    if draft.python:
        where = f" at {draft.python_where}" if draft.python_where else ""
        how = (f"  # {'guessed from' if draft.python_guessed else 'from'} {draft.python_how}{where}"
               if draft.python_how else "")
        return [f"python: {q(draft.python)}{how}"]
    out.fill.append(("python", "no python version could be read from the source"))
    return [f"python: {q(FILL_PYTHON)}  # FILL: the env's python, MAJOR.MINOR"]


def _system_pkgs(draft: Draft, out: Output) -> list[str]:
    if not draft.system_pkgs:
        return []
    return ["system_pkgs: [" + ", ".join(q(p) for p in draft.system_pkgs) + "]"]


def _pip_phases(draft: Draft, out: Output) -> list[str]:
    if not draft.phases:
        return []
    lines = ["pip_phases:"]
    for ph in draft.phases:
        lines.append(f"  # {_where(ph.file, ph.line)}")
        value = ph.as_spec()
        if isinstance(value, list):
            lines.append("  - [" + ", ".join(q(p) for p in value) + "]")
        else:
            lines.append("  - packages: [" + ", ".join(q(p) for p in value["packages"]) + "]")
            for k, v in value.items():
                if k != "packages":
                    lines.append(f"    {k}: " + ("[" + ", ".join(q(x) for x in v) + "]" if isinstance(v, list)
                                                 else q(v)))
    return lines


def _env(draft: Draft, out: Output) -> list[str]:
    if not draft.env:
        return []
    return ["env:", *(f"  {_key(k)}: {q(v)}" for k, v in sorted(draft.env.items()))]


def _run_commands(draft: Draft, out: Output) -> list[str]:
    if not draft.run_commands:
        return []
    lines = ["run_commands:"]
    for cmd, file, line, _ in draft.run_commands:
        lines.append(f"  # {_where(file, line)}")
        lines.append(f"  - {q(cmd)}")
    return lines


def _shim_files(draft: Draft, out: Output) -> list[str]:
    shims = _shim_names(draft, out.name)
    if not shims:
        return []
    lines = ["shim_files:"]
    for dest, (src, data) in sorted(shims.items()):
        lines.append(f"  {_key(dest)}: {q(src)}")
        out.files[src] = data
    return lines


def _weight_dirs(draft: Draft, out: Output) -> list[str]:
    if not draft.weight_dirs:
        return []
    lines = ["weight_dirs:"]
    for wname, w in sorted(draft.weight_dirs.items()):
        lines.append(f"  {wname}:")
        lines += [f"    {k}: {q(v)}" for k, v in w.items()]
    return lines


def _witnesses(draft: Draft, out: Output) -> list[str]:
    if not draft.witness_imports:
        return []
    kernel = ["  kernel: [" + ", ".join(draft.witness_kernel) + "]"] if draft.witness_kernel else []
    return ["witnesses:", "  imports: [" + ", ".join(q(m) for m in draft.witness_imports) + "]", *kernel]


def _labels(draft: Draft, out: Output) -> list[str]:
    if not draft.labels:
        return []
    return ["labels:", *(f"  {_key(k)}: {q(v)}" for k, v in sorted(draft.labels.items()))]


def _suggested_weights(draft: Draft, out: Output) -> list[str]:
    """Commented out: the user checks each download before it becomes a weight_dirs entry."""
    if not draft.suggested_weights:
        return []
    lines = ["# Weights the source downloaded during its build: envport never bakes them. Check and",
             "# uncomment (merge into weight_dirs above if it exists); `source` fetches them at run time.",
             "# weight_dirs:"]
    seen = set()
    for wname, w in draft.suggested_weights:
        while wname in seen or wname in draft.weight_dirs:
            wname += "-2"
        seen.add(wname)
        lines.append(f"#   {wname}:")
        lines += [f"#     {k}: {q(v)}" for k, v in w.items()]
    return lines


SECTIONS = (_base, _python, _system_pkgs, _pip_phases, _env, _run_commands, _shim_files, _weight_dirs, _witnesses,
            _labels, _suggested_weights)


def slug(text: str) -> str:
    s = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    return s[:63].strip("-")

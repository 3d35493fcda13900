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
    lines = ["# yaml-language-server: $schema=../docs/spec.schema.json",
             f"# Imported by `envport import` from {source_label} ({kind}); `envport import` printed what did not",
             "# map exactly, with FILE:LINE. Edit this file, not the source recipe.",
             f"name: {q(name)}",
             f"description: {q(f'Imported from {source_label} by envport import.')}"]
    if draft.base:
        lines.append(f"base: {q(draft.base)}")
    else:
        lines.append(f"base: {q(FILL_BASE)}  # FILL: the docker image the env starts from")
        out.fill.append(("base", "no base image could be read from the source"))
    if draft.python:
        where = f" at {draft.python_where}" if draft.python_where else ""
        how = (f"  # {'guessed from' if draft.python_guessed else 'from'} {draft.python_how}{where}"
               if draft.python_how else "")
        lines.append(f"python: {q(draft.python)}{how}")
    else:
        lines.append(f"python: {q(FILL_PYTHON)}  # FILL: the env's python, MAJOR.MINOR")
        out.fill.append(("python", "no python version could be read from the source"))
    if draft.system_pkgs:
        lines.append("system_pkgs: [" + ", ".join(q(p) for p in draft.system_pkgs) + "]")
    if draft.phases:
        lines.append("pip_phases:")
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
    if draft.env:
        lines.append("env:")
        lines += [f"  {_key(k)}: {q(v)}" for k, v in sorted(draft.env.items())]
    if draft.run_commands:
        lines.append("run_commands:")
        for cmd, file, line, _ in draft.run_commands:
            lines.append(f"  # {_where(file, line)}")
            lines.append(f"  - {q(cmd)}")
    shims = _shim_names(draft, name)
    if shims:
        lines.append("shim_files:")
        for dest, (src, data) in sorted(shims.items()):
            lines.append(f"  {_key(dest)}: {q(src)}")
            out.files[src] = data
    if draft.weight_dirs:
        lines.append("weight_dirs:")
        for wname, w in sorted(draft.weight_dirs.items()):
            lines.append(f"  {wname}:")
            lines += [f"    {k}: {q(v)}" for k, v in w.items()]
    if draft.witness_imports:
        lines.append("witnesses:")
        lines.append("  imports: [" + ", ".join(q(m) for m in draft.witness_imports) + "]")
    if draft.labels:
        lines.append("labels:")
        lines += [f"  {_key(k)}: {q(v)}" for k, v in sorted(draft.labels.items())]
    if draft.suggested_weights:
        lines.append("# Weights the source downloaded during its build: envport never bakes them. Check and")
        lines.append("# uncomment (merge into weight_dirs above if it exists); `source` fetches them at run time.")
        lines.append("# weight_dirs:")
        seen = set()
        for wname, w in draft.suggested_weights:
            while wname in seen or wname in draft.weight_dirs:
                wname += "-2"
            seen.add(wname)
            lines.append(f"#   {wname}:")
            lines += [f"#     {k}: {q(v)}" for k, v in w.items()]
    out.text = "\n".join(lines) + "\n"
    return out


def slug(text: str) -> str:
    s = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    return s[:63].strip("-")

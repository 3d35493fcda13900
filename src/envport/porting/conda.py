"""environment.yml (and `conda create`/`conda install` words) -> python, pip phases, and a list of conda packages.

envport has no conda solver in its containers, so each conda package goes
through a maintained table (conda_map.yaml, data with its source and rules):
a Debian package -> system_pkgs, a PyPI distribution -> a pip phase before
the pip: sections, torch's CUDA build -> torch's index; every mapping is
noted, and a package the table does not know is lost (exit 1).  `pip:`
sections are pip calls and map exactly, as phases after the conda part;
`variables:` become env.  The YAML is composed by the spec reader
(spec/yamlfile.compose: the same size, depth and no-alias bounds as a spec)
and walked for line numbers, so every note names its line.
"""

from __future__ import annotations

import functools
import re
from typing import Callable, Optional

import yaml

from envport.porting.envvars import add_env
from envport.porting.report import DROPPED, REPORTED, Draft, Phase, turned_into
from envport.porting.pip_args import requirements_file
from envport.porting.requirements import PipContext
from envport.porting.source import ImportRefused

MAP_FILE = "conda_map.yaml"


@functools.lru_cache(maxsize=1)
def table() -> dict:
    """The conda table (porting/conda_map.yaml: data, with its source and rules at its top)."""
    from importlib.resources import files

    return yaml.safe_load(files("envport.porting").joinpath(MAP_FILE).read_text(encoding="utf-8"))


def _pip_version(spec: str) -> str:
    """conda `1.26` / `1.26.4` / `>=1.2` / `1.26.4=py311_0` -> a pip specifier."""
    spec = spec.split("=", 1)[0] if re.match(r"^\d", spec) and spec.count("=") else spec
    if not spec:
        return ""
    if re.match(r"^\d", spec):
        return f"=={spec}" if spec.count(".") >= 2 or "*" in spec else f"=={spec}.*"
    return spec


TORCH = {"torch", "torchvision", "torchaudio"}


def conda_packages(pkgs: list[str], draft: Draft, file: str, line: Optional[int],
                   phase: Optional[Phase] = None) -> None:
    """Map conda package specs through the table: Debian ones into system_pkgs, PyPI ones into PHASE (a new
    phase added to the draft when None), torch's CUDA build as its index; unmapped ones are lost (exit 1)."""
    own = phase is None
    phase = phase if phase is not None else Phase(packages=[], file=file, line=line)
    t = table()
    for pkg in pkgs:
        m = re.match(r"^(?:[\w.-]+::)?([A-Za-z0-9_.-]+)\s*(?:=)?(.*)$", pkg.strip())
        if not m:
            draft.note(line, pkg, DROPPED, "not a conda package spec envport can read", file=file)
            continue
        name, version = m.group(1).lower(), m.group(2).strip()
        if name == "python":
            v = re.match(r"^=?(3\.\d{1,2})", version)
            if v:
                draft.set_python(v.group(1), f"conda's python={version.lstrip('=')}", line, file)
            else:
                draft.note(line, pkg, DROPPED, "a python spec without MAJOR.MINOR", "set `python:` in the spec",
                           file=file)
            continue
        if name in t["skip"]:
            continue  # every envport venv has pip; setuptools/wheel come with builds that need them
        where = f"conda package {pkg}"
        if name in t["debian"]:
            draft.add_system([t["debian"][name]])
            draft.note(line, where, turned_into("system_pkgs"), f"the conda table ({MAP_FILE}) maps it to the "
                       f"Debian package {t['debian'][name]}; the base's release chooses its version", file=file)
        elif name in t["pypi"]:
            req = t["pypi"][name] + _pip_version(version.lstrip("=") if version.startswith("=") and not
                                                 version.startswith("==") else version)
            phase.packages.append(req)
            if line:
                phase.package_lines[req] = line
            draft.note(line, where, turned_into("a pip phase"), f"the conda table ({MAP_FILE}) maps it to the "
                       f"PyPI distribution {req}", file=file)
        elif name in t["torch_index"]:
            tag = _torch_tag(t["torch_index"][name], version)
            if tag:
                phase.index_url = f"https://download.pytorch.org/whl/{tag}"
                draft.note(line, where, turned_into("index_url of the torch phase"), f"conda's {name} chooses "
                           f"torch's {'CPU' if tag == 'cpu' else 'CUDA'} build, which pip takes from "
                           f"{phase.index_url}", "check the base image's CUDA is at least that version", file=file)
            else:
                draft.lose(line, where, "a CUDA build of torch without a version: the index is unknown",
                           "write torch's index as a phase's index_url (https://download.pytorch.org/whl/cuXYZ)",
                           file=file)
        elif name in t["base_image"]:
            draft.note(line, where, REPORTED, "comes with the base image, not a package", t["base_image"][name],
                       file=file)
        else:
            draft.lose(line, where, f"not in the conda table ({MAP_FILE}): envport has no conda solver, so "
                       "the env would lack it", "add it to system_pkgs (a Debian package) or a pip phase (a PyPI "
                       f"distribution), or add a line to {MAP_FILE}", file=file)
    if own:
        add_conda_phase(phase, draft)


def add_conda_phase(phase: Phase, draft: Draft) -> None:
    """PHASE as one phase, or two when it holds torch from its own index (that index has torch, not the rest)."""
    if not phase.packages:
        return
    if phase.index_url:
        torch = [p for p in phase.packages if re.split(r"[<>=!~ ;\[]", p, maxsplit=1)[0].lower() in TORCH]
        rest = [p for p in phase.packages if p not in torch]
        lines = phase.package_lines
        if torch:
            draft.add_phase(Phase(packages=torch, file=phase.file, line=lines.get(torch[0], phase.line),
                                  index_url=phase.index_url))
        phase = Phase(packages=rest, file=phase.file, line=lines.get(rest[0], phase.line) if rest else phase.line)
        if not rest:
            return
    draft.add_phase(phase)


def _torch_tag(kind: str, version: str) -> str:
    if kind == "cpu":
        return "cpu"
    v = re.match(r"^=?(\d+)\.(\d)", version)
    return f"cu{v.group(1)}{v.group(2)}" if v else ""


def _scalar(node) -> Optional[str]:
    return node.value if isinstance(node, yaml.ScalarNode) else None


def read_environment(text: str, label: str, draft: Draft,
                     open_file: Callable[[str], Optional[tuple[str, str]]] = lambda p: None) -> None:
    from envport.core.errors import SpecError
    from envport.spec.yamlfile import compose

    try:
        root = compose(text, label)
    except SpecError as exc:
        p = exc.problems[0]
        where = f"{label}:{p.line}" if p.line else label
        raise ImportRefused(f"{where}: not YAML envport can read ({p.message}); {p.fix or 'fix the file'} and "
                            "import again") from None
    if not isinstance(root, yaml.MappingNode):
        raise ImportRefused(f"{label}: an environment.yml is a mapping with `dependencies:`; this file is not one")
    for key_node, value in root.value:
        key = _scalar(key_node)
        line = key_node.start_mark.line + 1
        if key == "name" and _scalar(value):
            draft.name_hint = _scalar(value)
        elif key == "channels":
            pass  # only meaningful to a conda solver; each package below is reported on its own
        elif key == "variables" and isinstance(value, yaml.MappingNode):
            for k, v in value.value:
                if _scalar(k) is not None and _scalar(v) is not None:
                    add_env(draft, _scalar(k), _scalar(v), k.start_mark.line + 1, label)
        elif key == "dependencies" and isinstance(value, yaml.SequenceNode):
            _dependencies(value, label, draft, open_file)
        elif key == "prefix":
            draft.note(line, f"prefix: {_scalar(value)}", DROPPED, "envport chooses where the env lives",
                       file=label)
        else:
            draft.note(line, f"{key}:", DROPPED, "not a conda environment key envport maps", file=label)


def _dependencies(seq: yaml.SequenceNode, label: str, draft: Draft, open_file) -> None:
    pip_sections = []
    conda = Phase(packages=[], file=label, line=None)  # conda's own packages that are on PyPI: one call
    for item in seq.value:
        line = item.start_mark.line + 1
        if _scalar(item) is not None:
            conda_packages([_scalar(item)], draft, label, line, phase=conda)
            if conda.packages and conda.line is None:
                conda.line = line
        elif isinstance(item, yaml.MappingNode):
            for k, v in item.value:
                if _scalar(k) == "pip" and isinstance(v, yaml.SequenceNode):
                    pip_sections.append((k.start_mark.line + 1, v))
                else:
                    draft.note(k.start_mark.line + 1, f"{_scalar(k)}:", DROPPED, "not a dependency list envport "
                               "knows (only `pip:`)", file=label)
    # conda installs everything before pip runs, wherever the pip: section is written.
    add_conda_phase(conda, draft)
    for line, section in pip_sections:
        phase = Phase(packages=[], file=label, line=line)
        ctx = PipContext(draft, label, line, open_file, {}, python=draft.python or "3.11")
        for entry in section.value:
            if _scalar(entry) is not None:
                requirements_file(_scalar(entry), label, ctx, phase, first_line=entry.start_mark.line + 1)
        if phase.packages:
            draft.add_phase(phase)
        else:
            draft.note(line, "pip:", DROPPED, "no requirement in this pip section maps onto the spec", file=label)

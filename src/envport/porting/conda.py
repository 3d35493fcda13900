"""environment.yml (and `conda create`/`conda install` words) -> python, pip phases, and a list of conda packages.

envport has no conda solver in its containers, so conda packages are never
silently turned into something else: each one is reported with the
system_pkgs or pip equivalent where a well-known one exists.  `pip:`
sections are pip calls and map exactly, as phases after the conda part;
`variables:` become env.  The YAML is composed by the spec reader
(spec/yamlfile.compose: the same size, depth and no-alias bounds as a spec)
and walked for line numbers, so every note names its line.
"""

from __future__ import annotations

import re
from typing import Callable, Optional

import yaml

from envport.porting.envvars import add_env
from envport.porting.report import DROPPED, Draft, Phase
from envport.porting.pip_args import requirements_file
from envport.porting.requirements import PipContext
from envport.porting.source import ImportRefused

# conda package -> Debian package (system_pkgs): build tools and C libraries conda ships.
TO_APT = {
    "git": "git", "cmake": "cmake", "make": "make", "gcc": "gcc", "gxx": "g++", "c-compiler": "gcc",
    "cxx-compiler": "g++", "compilers": "build-essential", "gfortran": "gfortran", "openmpi": "libopenmpi-dev",
    "mpich": "libmpich-dev", "hdf5": "libhdf5-dev", "openblas": "libopenblas-dev", "fftw": "libfftw3-dev",
    "boost": "libboost-dev", "zlib": "zlib1g-dev", "curl": "curl", "wget": "wget", "unzip": "unzip",
    "ffmpeg": "ffmpeg", "graphviz": "graphviz", "openjdk": "default-jdk", "nodejs": "nodejs", "sqlite": "sqlite3",
    "pkg-config": "pkg-config", "swig": "swig", "hmmer": "hmmer", "kalign": "kalign", "hhsuite": "hhsuite",
    "libxml2": "libxml2-dev", "r-base": "r-base",
}
# conda package -> PyPI name where they differ.
TO_PIP = {"pytorch": "torch", "pytorch-cpu": "torch", "py-opencv": "opencv-python", "opencv": "opencv-python",
          "pyyaml": "PyYAML", "tensorflow-gpu": "tensorflow", "pytables": "tables", "matplotlib-base": "matplotlib"}
NOT_A_PACKAGE = {
    "cudatoolkit": "the CUDA runtime comes with the base image: pick an nvidia/cuda tag with that version",
    "cuda-toolkit": "the CUDA runtime comes with the base image: pick an nvidia/cuda tag with that version",
    "cuda-version": "the CUDA runtime comes with the base image: pick an nvidia/cuda tag with that version",
    "cudnn": "cuDNN comes with the base image: pick an nvidia/cuda `-cudnn` tag",
    "pytorch-cuda": "torch's CUDA build comes from its own index: a phase with index_url "
                    "https://download.pytorch.org/whl/cuXYZ",
    "cpuonly": "torch's CPU build comes from its own index: index_url https://download.pytorch.org/whl/cpu",
}


def _pip_version(spec: str) -> str:
    """conda `1.26` / `1.26.4` / `>=1.2` / `1.26.4=py311_0` -> a pip specifier."""
    spec = spec.split("=", 1)[0] if re.match(r"^\d", spec) and spec.count("=") else spec
    if not spec:
        return ""
    if re.match(r"^\d", spec):
        return f"=={spec}" if spec.count(".") >= 2 or "*" in spec else f"=={spec}.*"
    return spec


def conda_packages(pkgs: list[str], draft: Draft, file: str, line: Optional[int]) -> None:
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
        if name in ("pip", "setuptools", "wheel"):
            continue  # every envport venv has pip; setuptools/wheel come with builds that need them
        if name in NOT_A_PACKAGE:
            fix = NOT_A_PACKAGE[name]
        elif name in TO_APT:
            fix = f"system_pkgs equivalent: {TO_APT[name]}"
        else:
            pip_name = TO_PIP.get(name, name)
            pip_spec = _pip_version(version.lstrip("=") if version.startswith("=") and not
                                    version.startswith("==") else version)
            same = "" if name in TO_PIP else " if PyPI has it under the same name"
            fix = f"pip equivalent{same}: {pip_name}{pip_spec}"
        draft.note(line, f"conda package {pkg}", DROPPED, "envport has no conda solver; conda packages are not "
                   "installed", fix, file=file)


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
    for item in seq.value:
        line = item.start_mark.line + 1
        if _scalar(item) is not None:
            conda_packages([_scalar(item)], draft, label, line)
        elif isinstance(item, yaml.MappingNode):
            for k, v in item.value:
                if _scalar(k) == "pip" and isinstance(v, yaml.SequenceNode):
                    pip_sections.append((k.start_mark.line + 1, v))
                else:
                    draft.note(k.start_mark.line + 1, f"{_scalar(k)}:", DROPPED, "not a dependency list envport "
                               "knows (only `pip:`)", file=label)
    # conda installs everything before pip runs, wherever the pip: section is written.
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

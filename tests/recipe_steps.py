"""Recover the plan's ordered step list from a rendered recipe.

The parity test uses this on every rendering: if a renderer drops, reorders
or merges a step, the recovered list differs from `Plan.markers()`.  The
Dockerfile is read by dockerfile-parse and the `.def` by spython's
SingularityParser, by what each instruction *does*, not by envport's step
comments; the setup scripts by their own `# envport-step` markers.
"""

from __future__ import annotations

import re
import shlex
import tempfile
from pathlib import Path

from envport.renderers.bytecode import COMPILE_SITE_PACKAGES

# The line each recipe runs after a phase that compiles its bytecode at build.
COMPILE_LINE = "python -c " + shlex.quote(COMPILE_SITE_PACKAGES)
PIP_PREFIX = ["python", "-m", "pip", "install", "--no-cache-dir", "--disable-pip-version-check"]


def _run_kind(command: str) -> str:
    if command.startswith("apt-get update"):
        return "system"
    if re.match(r"^python3?\.?\d*\.?\d* -m venv ", command):
        return "python"
    if command.startswith(("python -m pip install", "/opt/envport-tools/uv pip install")):
        return "pip"
    if command.startswith("mkdir -p "):
        return "weights"
    return "run"


def pip_args_of(command: str) -> list[str]:
    """`python -m pip install <fixed flags> ARGS && rm -rf ...` -> ARGS."""
    words = shlex.split(command.split(" && rm -rf /root/.cache/pip")[0].replace("\\\n", " "))
    assert words[: len(PIP_PREFIX)] == PIP_PREFIX, words
    return words[len(PIP_PREFIX):]


def dockerfile_steps(text: str) -> list[tuple[str, str]]:
    """[(marker, instruction value)] from a Dockerfile."""
    from dockerfile_parse import DockerfileParser

    with tempfile.TemporaryDirectory() as tmp:
        parser = DockerfileParser(str(Path(tmp) / "Dockerfile"))
        parser.content = text
        structure = parser.structure
    steps: list[tuple[str, str]] = []
    pip_n = 0
    for ins in structure:
        kind, value = ins["instruction"], ins["value"]
        if kind == "FROM":
            steps.append(("base", value))
        elif kind == "RUN":
            value = re.sub(r"^(--mount=\S+\s+)+", "", value)
            k = _run_kind(value)
            if k == "pip":
                pip_n += 1
                k = f"pip-{pip_n}"
            steps.append((k, value))
        elif kind == "ENV":
            if value.startswith(("VIRTUAL_ENV=", "ENVPORT_HASH=", "PIP_CERT=")):
                continue  # part of the python / labels / ca step
            steps.append(("env", value))
        elif kind == "COPY" and '"/opt/envport/locks/' in value:
            continue  # a locked phase's requirements: part of the pip step whose RUN follows
        elif kind == "COPY" and value.startswith('["ca-bundle.crt"'):
            steps.append(("ca", value))
        elif kind == "COPY":
            if not steps or steps[-1][0] != "files":
                steps.append(("files", value))
        elif kind == "LABEL":
            steps.append(("labels", value))
    return steps


def def_recipe(text: str):
    from spython.main.parse.parsers import SingularityParser

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "recipe.def"
        path.write_text(text, encoding="utf-8")
        recipe = SingularityParser(str(path)).recipe
    return next(iter(recipe.values()))


def def_markers(text: str) -> list[str]:
    """Steps from a `.def`: %post commands grouped at each `echo 'envport: step'`
    line and classified by what they run; %files and %labels must exist when
    their steps do."""
    stage = def_recipe(text)
    steps: list[str] = []
    pip_n = 0
    for line in stage.install:
        if line.startswith("#") or line.startswith("echo 'envport: step") or line == "set -eu":
            continue
        if line.startswith(": base image"):
            kind = "base"
        elif line.startswith("export PIP_CERT="):
            kind = "ca"
        elif line.startswith("export DEBIAN_FRONTEND"):
            kind = "system"
        elif re.match(r"^python\d\.\d+ -m venv ", line):
            kind = "python"
        elif line.startswith(("python -m pip install", "/opt/envport-build/uv pip install")):
            pip_n += 1
            kind = f"pip-{pip_n}"
        elif line.startswith("chmod "):
            kind = "files"
        elif line.startswith("mkdir -p "):
            kind = "weights"
        elif line.startswith("export ENVPORT_HASH=") or line == "rm -rf /opt/envport-build":
            kind = "labels"
        elif line.startswith("export ") and steps and steps[-1] in ("python", "env"):
            kind = "env" if not line.startswith(("export VIRTUAL_ENV=", "export PATH=")) else "python"
        elif steps and steps[-1] in ("system", "labels") or line.startswith("rm -rf /root/.cache/pip") \
                or line.startswith("export ENVPORT_NAME=") or line == COMPILE_LINE:
            continue  # the rest of an apt, pip (its bytecode compiled after it) or labels step
        else:
            kind = "run"
        if not steps or steps[-1] != kind:
            steps.append(kind)
    if "files" in steps and not stage.files:
        raise AssertionError("%post sets shim file modes but %files is empty")
    if "labels" in steps and not any(lb.startswith("envport.hash ") for lb in stage.labels):
        raise AssertionError("%labels lacks envport.hash")
    return steps


SCRIPT_MARKER = re.compile(r"^# envport-step (\d+)/(\d+) (\S+) ([0-9a-f]{16})$", re.M)


def script_markers(text: str) -> list[str]:
    return [m.group(3) for m in SCRIPT_MARKER.finditer(text)]

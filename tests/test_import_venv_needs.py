"""`python3.X -m venv` on Debian/Ubuntu needs python3.X-venv: the import adds it, a venv build refuses early.

The import side is covered by tests/import/venv-package-added.txt; here the table itself, and the
preflight probe of this machine's interpreter.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from envport.builders.preflight import Context, check_runtime
from envport.spec.loader import load_spec
from envport.spec.venv_needs import venv_packages
from envport.targets.registry import get

from .support import REPO


@pytest.mark.parametrize("base, python, have, need", [
    ("ubuntu:22.04", "3.10", [], ["python3.10", "python3.10-venv"]),
    ("ubuntu:22.04", "3.10", ["python3-venv"], []),  # jammy's own python3 is 3.10
    ("ubuntu:22.04", "3.11", ["python3-venv"], ["python3.11", "python3.11-venv"]),  # deadsnakes' is another
    ("nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04", "3.11", ["python3.11", "python3.11-venv"], []),
    ("debian:bookworm-slim", "3.11", ["python3.11"], ["python3.11-venv"]),
    ("python:3.11-slim-bookworm", "3.11", [], []),  # python.org's build carries venv whole
    ("envport/debian-bookworm:base", "3.11", [], []),  # an image of unknown make is not judged
])
def test_the_packages_venv_needs_on_a_debian_base(base, python, have, need):
    assert venv_packages(base, python, have) == need


def test_every_spec_here_already_lists_what_venv_needs():
    for path in sorted((REPO / "specs").glob("*.yaml")):
        spec = load_spec(path.stem, REPO).spec
        assert venv_packages(spec.base, spec.python, list(spec.system_pkgs)) == [], path.name


def test_a_venv_build_refuses_early_when_this_python_has_no_ensurepip(tmp_path: Path, monkeypatch):
    # A stand-in interpreter (this machine's python has ensurepip, and removing it would change the
    # host): a python3.X on PATH whose `import ensurepip` fails as Debian's does without python3.X-venv.
    spec = load_spec("demo-cpu", REPO).spec
    py = f"python{spec.python}"
    fake = tmp_path / py
    fake.write_text(f"#!/bin/sh\nexec {sys.executable} -c \"raise ModuleNotFoundError('No module named ensurepip')\"\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert shutil.which(py) == str(fake)
    found = check_runtime(Context(spec=spec, target="venv", runtime=get("venv").runtime_findings))
    assert [f.reason for f in found] == ["runtime_missing"], found
    assert f"the package {py}-venv is missing" in found[0].evidence
    assert f"apt-get install {py}-venv" in found[0].fix


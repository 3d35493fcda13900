"""The bytecode step every recipe runs after a phase that compiles at build (renderers/bytecode.py), run as
the recipes run it: `python -c COMPILE_SITE_PACKAGES` with a real venv's python, over a real site-packages.

- Two builds of the same tree write the same .pyc bytes, whatever the parent's PYTHONHASHSEED and the
  sources' mtimes (each build extracts its wheels at its own time).  The tree holds what moved demo-cpu's
  SIF (issue 39): a module every interpreter imports at startup through a .pth file, as setuptools'
  `_distutils_hack` is, whose timestamp .pyc the importer writes before the step runs; and a module of
  frozenset/set constants and many shared names.
- A phase that adds one module compiles that module and rewrites no other .pyc.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from envport.renderers.bytecode import COMPILE_SITE_PACKAGES

TAG = sys.implementation.cache_tag  # the venv's python is this one
WORDS = [f"name_{i}" for i in range(40)]
CONSTANTS = "\n\n".join(
    ["KEYWORDS = frozenset({%s})" % ", ".join(map(repr, WORDS)),
     "def known(x):\n    return x in {%s}" % ", ".join(repr(w + "_x") for w in WORDS)]
    + [f"def f{i}(a, b):\n    return {{'key': a, 'path': b, 'name': {i}, {WORDS[i]!r}: KEYWORDS}}" for i in range(30)]
) + "\n"
TREE = {
    # imported by every interpreter at startup, before the step's own code runs (as _distutils_hack is)
    "startup_hook/__init__.py": "def add_shim():\n    return {'setuptools', 'pip', 'distutils'}\n",
    "startup-hook.pth": "import startup_hook; startup_hook.add_shim()\n",
    "consts_mod.py": CONSTANTS,
    "pkg/__init__.py": "from .inner import VALUE\n",
    "pkg/inner.py": "VALUE = frozenset({1.5, 'a', (1, 'b'), b'c'})\n",
    # does not compile: left without bytecode, as pip leaves it, and the step still succeeds
    "pkg/legacy.py": "print 'python 2'\n",
}


@pytest.fixture
def venv(tmp_path) -> Path:
    env = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, timeout=120)
    return env


def _purelib(env: Path) -> Path:
    return next(env.glob("lib/python*/site-packages"))


def _write_tree(site: Path, files: dict[str, str], mtime: int) -> None:
    for rel, text in files.items():
        path = site / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        os.utime(path, (mtime, mtime))


def _compile(env: Path, **extra: str) -> None:
    """The step as a recipe runs it.  The importer writes bytecode in a build (this project's CI sets
    PYTHONDONTWRITEBYTECODE, which would hide what it does there)."""
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "SOURCE_DATE_EPOCH")}
    proc = subprocess.run([str(env / "bin" / "python"), "-c", COMPILE_SITE_PACKAGES], env={**environ, **extra},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr


def _pycs(site: Path) -> dict[str, bytes]:
    return {str(p.relative_to(site)): p.read_bytes() for p in sorted(site.rglob("*.pyc"))}


def test_two_builds_of_the_same_tree_write_the_same_bytecode(venv):
    site = _purelib(venv)
    builds = []
    for seed, mtime in (("1", 1_700_000_000), ("2", 1_700_086_400)):
        for cache in site.rglob("__pycache__"):
            shutil.rmtree(cache)
        _write_tree(site, TREE, mtime)
        _compile(venv, SOURCE_DATE_EPOCH="1600000000", PYTHONHASHSEED=seed)
        builds.append(_pycs(site))
    first, second = builds
    want = {f"startup_hook/__pycache__/__init__.{TAG}.pyc", f"__pycache__/consts_mod.{TAG}.pyc",
            f"pkg/__pycache__/inner.{TAG}.pyc"}
    assert want <= first.keys(), sorted(first)
    assert not any("legacy" in p for p in first), sorted(first)
    differ = sorted(p for p in first.keys() | second.keys() if first.get(p) != second.get(p))
    assert not differ, f"two builds of one tree wrote different bytecode: {differ}"
    # SOURCE_DATE_EPOCH: every .pyc is checked-hash (flags 3), the importer's timestamp one included.
    assert {p: data[4:8] for p, data in first.items()} == {p: b"\x03\0\0\0" for p in first}


@pytest.mark.parametrize("source_date_epoch", ["1600000000", None], ids=["checked-hash", "timestamp"])
def test_a_phase_adding_one_module_compiles_only_that_module(venv, source_date_epoch):
    site = _purelib(venv)
    extra = {"SOURCE_DATE_EPOCH": source_date_epoch} if source_date_epoch else {}
    _write_tree(site, TREE, 1_700_000_000)
    _compile(venv, **extra)
    before = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in site.rglob("*.pyc")}
    assert len(before) >= 4, sorted(before)
    _write_tree(site, {"added_mod.py": "ADDED = {'x', 'y'}\n"}, 1_700_000_100)
    _compile(venv, **extra)
    after = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in site.rglob("*.pyc")}
    assert sorted(p.name for p in after.keys() - before.keys()) == [f"added_mod.{TAG}.pyc"]
    rewritten = sorted(str(p.relative_to(site)) for p in before if after[p] != before[p])
    assert not rewritten, f"a phase that added one module rewrote: {rewritten}"

"""core/files: the one atomic write. A file envport replaces is never seen half-written under its name,
and only core/files renames a file over another (the AST check below)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest

from envport.core.files import replacing, write_atomic

from .support import REPO

SRC = REPO / "src" / "envport"
# Renames that replace no file's content: a folder swapped whole, a corrupt file set aside as evidence,
# apptainer's own history rename, and the SIF apptainer itself wrote (no bytes of envport's in between).
RENAMES_ALLOWED = {
    "core/files.py": "the one place",
    "recipe/render.py": "swaps the images/<name>/ folder whole",
    "report/ledger.py": "sets a corrupt ledger aside, beside itself",
    "builders/apptainer/singularity_d.py": "moves /.singularity.d to its history, as apptainer does",
    "builders/apptainer/binary.py": "renames the SIF `apptainer build` wrote; a failed build unlinks it",
    "builders/apptainer/phase_cache.py": "publishes a cache entry's folder whole (rename of .tmp-KEY.PID) and "
                                         "renames one aside before removing it: folders, not files",
}


def renames(source: str) -> list[int]:
    """Lines of os.replace/os.rename(...) and X.replace/X.rename(...) with one argument that is not a str
    literal (a Path's rename; str.replace takes two)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("replace", "rename"):
            on_os = isinstance(node.func.value, ast.Name) and node.func.value.id == "os"
            one_path = len(node.args) == 1 and not node.keywords and \
                not (isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str))
            if on_os or one_path:
                found.append(node.lineno)
    return sorted(found)


def test_only_core_files_replaces_a_file():
    offenders = [f"src/envport/{p.relative_to(SRC).as_posix()}:{line}"
                 for p in sorted(SRC.rglob("*.py")) if p.relative_to(SRC).as_posix() not in RENAMES_ALLOWED
                 and "witness/scripts/" not in p.as_posix()
                 for line in renames(p.read_text(encoding="utf-8"))]
    assert not offenders, "replace files with envport.core.files (write_atomic or replacing):\n" + \
        "\n".join(offenders)
    for rel in RENAMES_ALLOWED:
        assert (SRC / rel).is_file(), f"tests/test_files.py allows src/envport/{rel}, which is gone"


def test_the_check_sees_a_rename_and_not_a_str_replace():
    assert renames("import os\nos.replace(a, b)\np.replace(q)\ns.replace('a', 'b')\nt.replace('x')\n"
                   "dataclasses.replace(d, x=1)\n") == [2, 3]


def test_write_atomic_replaces_whole_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "deep" / "ledger.json"
    write_atomic(target, "one\n")
    write_atomic(target, b"two\n", mode=0o600)
    assert target.read_text() == "two\n" and (target.stat().st_mode & 0o777) == 0o600
    assert sorted(p.name for p in target.parent.iterdir()) == ["ledger.json"]


def test_replacing_keeps_the_old_file_when_the_writer_fails(tmp_path):
    target = tmp_path / "out.sif"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with replacing(target) as partial:
            partial.write_bytes(b"half")
            raise RuntimeError("the writer broke")
    assert target.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["out.sif"]
    with replacing(target, mode=0o755) as partial:
        assert not partial.exists() and partial.name == f".out.sif.partial-{os.getpid()}"
        partial.write_bytes(b"new")
    assert target.read_bytes() == b"new" and (target.stat().st_mode & 0o777) == 0o755


def test_replacing_removes_the_partials_of_a_killed_writer(tmp_path):
    target = tmp_path / "out.sif"
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = tmp_path / f".out.sif.partial-{gone.stdout.strip()}"
    alive = tmp_path / f".out.sif.partial-{os.getppid()}"  # a live process's partial is its own business
    dead.write_bytes(b"x")
    alive.write_bytes(b"y")
    with replacing(target) as partial:
        partial.write_bytes(b"z")
    assert not dead.exists() and alive.exists()

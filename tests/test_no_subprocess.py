"""Every external command envport runs goes through core/proc (a timeout, "not installed" told apart from
"failed", no child left when envport is killed); only the in-env witness scripts, which import the stdlib
and torch alone, start their own. The check reads each module's AST: a call, not a mention in a comment."""

from __future__ import annotations

import ast

from .support import REPO

SRC = REPO / "src" / "envport"
STARTERS = {"run", "Popen", "call", "check_call", "check_output", "getoutput", "getstatusoutput"}
ALLOWED = {
    "core/proc.py": "the one place",
    "witness/scripts": "runs inside the env: stdlib and torch only, no envport",
}


def direct_starts(source: str) -> list[tuple[int, str]]:
    """(line, call) for each process started in SOURCE without core/proc: subprocess.X(...) for X in
    STARTERS, a name imported from subprocess, os.system/os.popen/os.exec*/os.spawn*."""
    tree = ast.parse(source)
    imported = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                and n.module == "subprocess" for a in n.names if a.name in STARTERS}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
            mod, name = f.value.id, f.attr
            if (mod == "subprocess" and name in STARTERS) or \
                    (mod == "os" and (name in ("system", "popen") or name.startswith(("exec", "spawn")))):
                found.append((node.lineno, f"{mod}.{name}"))
        elif isinstance(f, ast.Name) and f.id in imported:
            found.append((node.lineno, f.id))
    return sorted(found)


def _allowed(rel: str) -> bool:
    return any(rel == k or rel.startswith(k + "/") for k in ALLOWED)


def test_no_module_starts_a_process_but_core_proc():
    offenders = [f"src/envport/{p.relative_to(SRC).as_posix()}:{line}: {call}"
                 for p in sorted(SRC.rglob("*.py")) if not _allowed(p.relative_to(SRC).as_posix())
                 for line, call in direct_starts(p.read_text(encoding="utf-8"))]
    assert not offenders, "start it through envport.core.proc (run or spawn):\n" + "\n".join(offenders)


def test_the_allow_list_names_files_that_exist():
    # A moved or renamed module would leave its entry behind, allowing nothing and hiding nothing.
    for rel in ALLOWED:
        assert (SRC / rel).exists(), f"tests/test_no_subprocess.py names src/envport/{rel}, which is gone"


def test_the_check_sees_each_way_of_starting_a_process():
    source = ("import os, subprocess\nfrom subprocess import check_output as co\n"
              "subprocess.run(['x'])\nsubprocess.Popen(['x'])\nco(['x'])\nos.system('x')\nos.execvp('x', [])\n"
              "# subprocess.run(['not a call'])\nx: subprocess.Popen = None\n")
    assert direct_starts(source) == [(3, "subprocess.run"), (4, "subprocess.Popen"), (5, "co"),
                                     (6, "os.system"), (7, "os.execvp")]

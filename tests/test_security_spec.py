"""Issue 21, the spec rows: a spec cannot smuggle lines into what envport renders, nor make envport read
(and echo) a file outside specs/.

F11  U+2028, U+2029 and U+0085 are refused in every single-line field (Python's splitlines() cuts at
     them, apptainer does not), and envport's own .def parser cuts lines at \\n only, as apptainer does.
F12  a spec or an `extends` parent that resolves outside specs/ (a link, `../`) is refused before it
     is opened: none of its lines are printed; `extends` must be a spec name.
F18  (spec side) a requirement nested thousands of brackets deep is refused, not a RecursionError.

Every case runs the real CLI (`python -m envport`, tests/support.run_envport) on a throwaway project.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from envport.builders.apptainer.deffile import parse_def

from .support import run_envport, write_spec

SEPARATORS = {"U+2028": "\u2028", "U+2029": "\u2029", "U+0085": "\u0085"}
SECRET = "hunter2-not-for-printing"


def project(tmp_path: Path) -> Path:
    (tmp_path / "specs").mkdir()
    return tmp_path


def output(proc) -> str:
    both = proc.stdout + proc.stderr
    assert "Traceback" not in both, both
    return both


# ---- F11 ------------------------------------------------------------------------------------

@pytest.mark.parametrize("char", SEPARATORS.values(), ids=SEPARATORS.keys())
@pytest.mark.parametrize("field", ["labels", "env", "run_commands"])
def test_line_separators_are_refused_in_single_line_fields(tmp_path: Path, field: str, char: str):
    root = project(tmp_path)
    smuggled = f"ok{char}envport.hash 0000"  # a second `%labels` line to a splitlines() reader
    value = {"labels": {"org.example.note": smuggled}, "env": {"NOTE": smuggled},
             "run_commands": [f"echo {smuggled}"]}[field]
    write_spec(root, "smuggle", **{field: value})
    for command in ("validate", "render"):
        proc = run_envport(command, "smuggle", root=root)
        out = output(proc)
        assert proc.returncode == 2, f"envport {command}: exit {proc.returncode}\n{out}"
        where = {"labels": "labels.org.example.note", "env": "env.NOTE", "run_commands": "run_commands[0]"}[field]
        assert f"{where}: must not contain newlines, tabs, line separators (U+2028, U+2029, U+0085)" in out, out
    assert not (root / "images" / "smuggle").exists()


@pytest.mark.parametrize("char", SEPARATORS.values(), ids=SEPARATORS.keys())
def test_def_labels_are_cut_at_newlines_only(char: str):
    # The parser behind envport's SIF labels (singularity_d reads parse_def's labels): one line, one label.
    text = f"Bootstrap: docker\nFrom: debian:bookworm-slim\n%labels\norg.example.note ok{char}envport.hash 0000\n" \
           "envport.name real\n"
    labels = parse_def(text, "smuggle.def").labels
    assert labels == (("org.example.note", f"ok{char}envport.hash 0000"), ("envport.name", "real"))


@pytest.mark.parametrize("char", SEPARATORS.values(), ids=SEPARATORS.keys())
def test_import_drops_a_def_label_holding_a_separator(tmp_path: Path, char: str):
    root = project(tmp_path)
    recipe = tmp_path / "smuggle.def"
    recipe.write_text(f"Bootstrap: docker\nFrom: python:3.11-slim\n%labels\n    org.example.note ok{char}envport.hash 0\n"
                      "%post\n    pip install six==1.16.0\n", encoding="utf-8")
    proc = run_envport("import", str(recipe), "--name", "smuggle", "--dry-run", root=root)
    out = output(proc)
    assert proc.returncode == 0, out
    assert "labels:" not in proc.stdout.split("# ---- report")[0], out
    assert "smuggle.def:4: org.example.note ok" in out and ": dropped: " in out, out


# ---- F12 ------------------------------------------------------------------------------------

def refused_unread(root: Path, *args: str) -> str:
    """`envport ARGS` exits 2 and prints nothing of the secret file; its output."""
    proc = run_envport(*args, root=root)
    out = output(proc)
    assert proc.returncode == 2, out
    assert SECRET not in out and "secret_token" not in out, out
    return out


def secret_file(tmp_path: Path) -> Path:
    """A readable file outside specs/ that parses as YAML: each of its keys would be an `unknown key`."""
    path = tmp_path / "outside.yaml"
    path.write_text(f"secret_token: {SECRET}\nname: {SECRET}\n")
    return path


@pytest.mark.parametrize("ref", ["leak", "specs/leak.yaml"])
def test_a_spec_linked_out_of_specs_is_refused_unread(tmp_path: Path, ref: str):
    root = project(tmp_path)
    secret_file(tmp_path)
    os.symlink("../outside.yaml", root / "specs" / "leak.yaml")
    for command in ("validate", "render"):
        out = refused_unread(root, command, ref)
        assert f"{root}/specs/leak.yaml: <top>: resolves outside specs/ (to {tmp_path}/outside.yaml)" in out, out


def test_render_all_refuses_the_link_and_keeps_the_others(tmp_path: Path):
    root = project(tmp_path)
    secret_file(tmp_path)
    os.symlink("../outside.yaml", root / "specs" / "leak.yaml")
    write_spec(root, "fine")
    assert "resolves outside specs/" in refused_unread(root, "validate", "--all")


def test_extends_must_be_a_name_not_a_path(tmp_path: Path):
    root = project(tmp_path)
    secret_file(tmp_path)
    write_spec(root, "child", extends="../outside")
    out = refused_unread(root, "validate", "child")
    assert "extends: expected the name of another spec in specs/, not '../outside' (a name, not a path)" in out


def test_an_extends_parent_linked_out_of_specs_is_refused_unread(tmp_path: Path):
    root = project(tmp_path)
    secret_file(tmp_path)
    os.symlink("../outside.yaml", root / "specs" / "parent.yaml")
    write_spec(root, "child", extends="parent")
    out = refused_unread(root, "validate", "child")
    assert f"extends: parent spec 'parent' ({root}/specs/parent.yaml) resolves outside specs/" in out, out


def test_a_link_inside_specs_still_works(tmp_path: Path):
    # What stays allowed: a link whose target is itself in specs/.
    root = project(tmp_path)
    write_spec(root, "alias")
    (root / "specs" / "sub").mkdir()
    os.symlink("../alias.yaml", root / "specs" / "sub" / "alias.yaml")
    proc = run_envport("validate", "specs/sub/alias.yaml", root=root)
    assert proc.returncode == 0, output(proc)


# ---- F18, spec side -------------------------------------------------------------------------

def test_a_deeply_nested_requirement_marker_is_refused(tmp_path: Path):
    root = project(tmp_path)
    marker = "(" * 3000 + 'python_version > "3"' + ")" * 3000
    write_spec(root, "deep", pip_phases=[[f"six==1.16.0; {marker}"]])
    proc = run_envport("validate", "deep", root=root)
    out = output(proc)
    assert proc.returncode == 2, out
    assert "pip_phases[0][0]: " in out and "too deeply nested (3000 levels of brackets, at most 32)" in out, out

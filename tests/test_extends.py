"""`extends`: the merge rules of docs/spec.md, and its errors.

- `name`, `description`, `extends` are never inherited;
- `system_pkgs`: parent's, then the child's, duplicates dropped;
- `pip_phases`, `run_commands`: parent's first, then the child's, nothing dropped;
- `env`, `shim_files`, `weight_dirs`, `labels`, `resources`: per key, the child wins
  (a weight dir is one key: the child's replaces the parent's whole);
- `witnesses`: `imports` and `cli` concatenated (the child's duplicates dropped),
  every other witness key: the child wins;
- every other field: the child's if set, else the parent's;
- a missing parent and a cycle are errors; a parent must be valid on its own and
  its problems name its own file.

Each case writes a throwaway project (specs/*.yaml) and loads it the way the CLI
does (`load_spec`); the error cases also go through the real CLI.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from envport.core.errors import SpecError
from envport.spec.loader import load_spec
from envport.plan.steps import make_plan
from envport.recipe.render import render_spec
from envport.recipe.identity import portable

from .support import run_envport

BASE = {"base": "debian:bookworm-slim", "python": "3.11"}


def write_specs(root: Path, specs: dict[str, dict | str], files: dict[str, bytes] | None = None) -> Path:
    (root / "specs" / "files").mkdir(parents=True, exist_ok=True)
    for name, data in specs.items():
        text = data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False)
        (root / "specs" / f"{name}.yaml").write_text(text, encoding="utf-8")
    for rel, data in (files or {}).items():
        (root / "specs" / rel).write_bytes(data)
    return root


def problems(root: Path, name: str) -> list:
    with pytest.raises(SpecError) as info:
        load_spec(name, root)
    return info.value.problems


PARENT = {
    "name": "parent", "description": "the parent", **BASE,
    "system_pkgs": ["git", "curl"],
    "pip_phases": [{"packages": ["torch==2.4.1"], "index_url": "https://download.pytorch.org/whl/cu124"}],
    "env": {"A": "parent", "B": "parent"},
    "run_commands": ["echo parent"],
    "shim_files": {"/opt/a.py": "files/a.py", "/opt/b.py": "files/b.py"},
    "weight_dirs": {"hf": {"path": "/weights/hf", "env": "HF_HOME", "size_gb": 5},
                    "tiny": {"path": "/weights/tiny"}},
    "witnesses": {"imports": ["torch"], "cli": [{"cmd": "python -V", "expect": "Python"}], "kernel": True,
                  "dtensor": {"mesh": [2, 2]}, "collectives": {"world_size": 4}},
    "resources": {"cpus": 8, "mem_gib": 32, "gpus": 1},
    "sm_range": ["sm_80", "sm_90"],
    "labels": {"org.example.team": "parent", "org.example.tier": "gpu"},
}
CHILD = {
    "name": "child", "extends": "parent",
    "system_pkgs": ["curl", "jq", "git"],
    "pip_phases": [["peptdeep==1.3.0"], {"packages": ["numpy==1.26.4"], "no_deps": True}],
    "env": {"B": "child", "C": "child"},
    "run_commands": ["echo child", "echo parent"],
    "shim_files": {"/opt/b.py": "files/b2.py", "/opt/c.py": "files/c.py"},
    "weight_dirs": {"hf": {"path": "/data/hf"}},
    "witnesses": {"imports": ["peptdeep", "torch"], "cli": [{"cmd": "python -V", "expect": "Python"},
                                                             {"cmd": "peptdeep --help", "expect": "usage"}],
                  "kernel": False},
    "resources": {"gpus": 0},
    "labels": {"org.example.team": "child"},
}
SHIMS = {f"files/{n}.py": f"# {n}\n".encode() for n in ("a", "b", "b2", "c")}


@pytest.fixture
def family(tmp_path: Path):
    write_specs(tmp_path, {"parent": PARENT, "child": CHILD}, SHIMS)
    return load_spec("child", tmp_path)


def test_name_description_and_extends_are_not_inherited(family):
    assert family.spec.name == "child"
    assert family.spec.description == ""
    assert family.spec.extends == "parent"  # its own field, not the parent's (None)


def test_system_pkgs_parent_first_without_duplicates(family):
    assert family.spec.system_pkgs == ["git", "curl", "jq"]


def test_pip_phases_and_run_commands_concatenate_parent_first(family):
    phases = family.spec.pip_phases
    assert [p.packages for p in phases] == [["torch==2.4.1"], ["peptdeep==1.3.0"], ["numpy==1.26.4"]]
    assert phases[0].index_url == "https://download.pytorch.org/whl/cu124"
    assert phases[2].no_deps and not phases[1].no_deps
    # Nothing is dropped from an ordered list: the child's repeat runs again, after its own.
    assert family.spec.run_commands == ["echo parent", "echo child", "echo parent"]
    # And the plan keeps that order: pip-1 is the parent's phase.
    pips = [s for s in make_plan(family).steps if s.kind == "pip"]
    assert [s.index for s in pips] == [1, 2, 3] and pips[0].packages == ("torch==2.4.1",)


def test_mappings_merge_per_key_child_wins(family):
    spec = family.spec
    assert spec.env == {"A": "parent", "B": "child", "C": "child"}
    assert spec.shim_files == {"/opt/a.py": "files/a.py", "/opt/b.py": "files/b2.py", "/opt/c.py": "files/c.py"}
    assert spec.labels == {"org.example.team": "child", "org.example.tier": "gpu"}
    assert spec.resources.model_dump() == {"cpus": 8, "mem_gib": 32, "gpus": 0}
    # A weight dir is one key: the child's `hf` replaces the parent's whole (no env, no size).
    assert spec.weight_dirs["hf"].model_dump(exclude_defaults=True) == {"path": "/data/hf"}
    assert spec.weight_dirs["tiny"].path == "/weights/tiny"
    # The shim bytes that reach the recipe are the child's file for /opt/b.py.
    assert family.shim_bytes()["/opt/b.py"] == b"# b2\n"


def test_witness_lists_concatenate_other_keys_child_wins(family):
    w = family.spec.witnesses
    assert w.imports == ["torch", "peptdeep"]
    assert [(c.cmd, c.expect) for c in w.cli] == [("python -V", "Python"), ("peptdeep --help", "usage")]
    assert w.kernel is False  # the child's
    assert w.dtensor.mesh == [2, 2] and w.collectives.world_size == 4  # the parent's, unset in the child


def test_other_fields_come_from_the_parent_unless_set(tmp_path: Path):
    write_specs(tmp_path, {
        "parent": PARENT,
        "plain": {"name": "plain", "extends": "parent"},
        "own": {"name": "own", "extends": "parent", "base": "ubuntu:22.04", "python": "3.12",
                "sm_range": ["sm_70", "sm_75"]},
    }, SHIMS)
    plain = load_spec("plain", tmp_path).spec
    assert (plain.base, plain.python, plain.sm_range) == ("debian:bookworm-slim", "3.11", ["sm_80", "sm_90"])
    own = load_spec("own", tmp_path).spec
    assert (own.base, own.python, own.sm_range) == ("ubuntu:22.04", "3.12", ["sm_70", "sm_75"])


def test_three_levels_merge_in_chain_order(tmp_path: Path):
    write_specs(tmp_path, {
        "grand": {"name": "grand", **BASE, "pip_phases": [["six==1.16.0"]], "run_commands": ["echo grand"],
                  "env": {"X": "grand", "Y": "grand"}},
        "mid": {"name": "mid", "extends": "grand", "pip_phases": [["tqdm==4.66.0"]], "run_commands": ["echo mid"],
                "env": {"Y": "mid"}},
        "leaf": {"name": "leaf", "extends": "mid", "pip_phases": [["rich==13.7.0"]], "run_commands": ["echo leaf"]},
    })
    leaf = load_spec("leaf", tmp_path)
    assert [p.packages[0] for p in leaf.spec.pip_phases] == ["six==1.16.0", "tqdm==4.66.0", "rich==13.7.0"]
    assert leaf.spec.run_commands == ["echo grand", "echo mid", "echo leaf"]
    assert leaf.spec.env == {"X": "grand", "Y": "mid"}
    assert [p.stem for p in leaf.chain] == ["leaf", "mid", "grand"]


def test_a_parent_change_changes_the_child_hash_and_rendering(tmp_path: Path):
    write_specs(tmp_path, {"parent": PARENT, "child": CHILD}, SHIMS)
    before = load_spec("child", tmp_path)
    changed = {**PARENT, "pip_phases": [["torch==2.4.0"]]}
    write_specs(tmp_path, {"parent": changed})
    after = load_spec("child", tmp_path)
    assert portable(after).hash != portable(before).hash
    assert b"torch==2.4.0" in render_spec(after).files["Dockerfile"][0]
    # The description is for people: a parent's new description changes nothing.
    write_specs(tmp_path, {"parent": {**changed, "description": "reworded"}})
    assert portable(load_spec("child", tmp_path)).hash == portable(after).hash


def test_missing_parent_is_an_error_on_the_extends_line(tmp_path: Path):
    write_specs(tmp_path, {"orphan": f"name: orphan\n{yaml.safe_dump(BASE)}extends: nowhere\n"})
    [p] = problems(tmp_path, "orphan")
    assert (Path(p.file).name, p.line, p.field) == ("orphan.yaml", 4, "extends")
    assert "'nowhere' not found" in p.message


@pytest.mark.parametrize("links", [{"a": "a"}, {"a": "b", "b": "a"}, {"a": "b", "b": "c", "c": "a"}],
                         ids=["self", "a-b-a", "a-b-c-a"])
def test_cycles_are_errors(tmp_path: Path, links: dict[str, str]):
    write_specs(tmp_path, {n: {"name": n, "extends": parent, **BASE} for n, parent in links.items()})
    [p] = problems(tmp_path, "a")
    chain = ["a"]
    while links[chain[-1]] != "a":
        chain.append(links[chain[-1]])
    # Reported where the cycle closes: the last spec's `extends` line.
    assert (Path(p.file).name, p.line, p.field) == (f"{chain[-1]}.yaml", 2, "extends")
    assert p.message == "extends cycle: " + " -> ".join(chain + ["a"])


def test_parent_problems_name_the_parent_file(tmp_path: Path):
    write_specs(tmp_path, {
        "parent": {"name": "parent", **BASE, "pip_phases": [["torch=2.4"]], "witnesses": {"import": ["x"]}},
        "child": {"name": "child", "extends": "parent", "pip_phases": [["six==1.16.0"]]},
    })
    found = problems(tmp_path, "child")
    assert {(Path(p.file).name, p.field) for p in found} == {("parent.yaml", "pip_phases[0][0]"),
                                                            ("parent.yaml", "witnesses.import")}
    assert all(p.line for p in found)


def test_a_parent_must_be_valid_on_its_own(tmp_path: Path):
    """A parent without `python` is not completed by its child: its file is named."""
    write_specs(tmp_path, {
        "parent": {"name": "parent", "base": "debian:bookworm-slim"},
        "child": {"name": "child", "extends": "parent", "python": "3.11"},
    })
    [p] = problems(tmp_path, "child")
    assert (Path(p.file).name, p.field, p.message) == ("parent.yaml", "python", "required field is missing")


def test_a_parent_missing_shim_file_names_the_parent(tmp_path: Path):
    write_specs(tmp_path, {
        "parent": {"name": "parent", **BASE, "shim_files": {"/opt/run.py": "files/missing.py"}},
        "child": {"name": "child", "extends": "parent"},
    })
    [p] = problems(tmp_path, "child")
    assert (Path(p.file).name, p.line, p.field) == ("parent.yaml", 5, "shim_files./opt/run.py")


def test_child_problems_name_the_child_file(tmp_path: Path):
    write_specs(tmp_path, {"parent": PARENT, "child": {**CHILD, "env": {"B": "line\nbreak"}}}, SHIMS)
    found = problems(tmp_path, "child")
    assert [(Path(p.file).name, p.field) for p in found] == [("child.yaml", "env.B")]


def test_cli_reports_extends_errors_with_exit_2_and_writes_nothing(tmp_path: Path):
    write_specs(tmp_path, {
        "a": {"name": "a", "extends": "b", **BASE},
        "b": {"name": "b", "extends": "a", **BASE},
        "orphan": {"name": "orphan", "extends": "nowhere", **BASE},
        "bad-parent": {"name": "bad-parent", **BASE, "system_pkgs": ["Not A Package"]},
        "kid": {"name": "kid", "extends": "bad-parent"},
    })
    for name, where in (("a", "b.yaml:2: extends: "), ("orphan", "orphan.yaml:2: extends: "),
                        ("kid", "bad-parent.yaml:5: system_pkgs[0]: ")):
        for command in ("validate", "render"):
            proc = run_envport(command, name, root=tmp_path, timeout=120)
            assert proc.returncode == 2, proc.stdout + proc.stderr
            assert f"{tmp_path.resolve() / 'specs' / where}" in proc.stderr, proc.stderr
    assert not (tmp_path / "images").exists()


@pytest.mark.parametrize("kind", ["symlink-loop", "directory", "fifo", "alias"])
def test_a_parent_that_cannot_be_read_is_one_problem_naming_it(tmp_path: Path, kind: str):
    import os

    write_specs(tmp_path, {"child": {"name": "child", "extends": "parent", **BASE}})
    parent = tmp_path / "specs" / "parent.yaml"
    if kind == "symlink-loop":
        os.symlink("parent.yaml", parent)
    elif kind == "directory":
        parent.mkdir()
    elif kind == "fifo":
        os.mkfifo(parent)  # opened blocking, this would hang the load forever
    else:
        parent.write_text(f"name: parent\n{yaml.safe_dump(BASE)}system_pkgs: &p [git]\nrun_commands: *p\n")
    [p] = problems(tmp_path, "child")
    assert Path(p.file).name == "parent.yaml"
    assert {"symlink-loop": "symlink loop", "directory": "is a directory", "fifo": "not a regular file",
            "alias": "YAML anchor &p is not supported"}[kind] in p.message

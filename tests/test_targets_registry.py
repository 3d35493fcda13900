"""One module per target, one registry: nothing outside src/envport/targets/ lists target names or branches on one.

Read from the source with `ast` (tests/test_layers.py reads the import graph
the same way): a tuple/list/set or dict keys naming two or more targets, or a
comparison of something called `target` with a target's name, outside targets/
is a second list that the next backend (podman) would have to find and edit.
The orchestration modules (up, build, verify, witness, parity, matrix) reach a
backend only through the registry: they import no backend's builder, verify
connection or witness launcher.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from envport.targets import registry
from envport.targets.base import OPERATIONS, Target, Unsupported
from envport.core.verdict import Verdict

from .support import as_json, run_envport
from .test_layers import SRC, graph, module_files

NAMES = frozenset(registry.NAMES) | frozenset(registry.ssh_rows())

# Foreign vocabulary that spells like a target: binaries, recipe kinds, a cluster's runtimes. No target branch
# is left outside targets/; the list only shrinks. Anything not here fails.
KNOWN = {
    ("report/doctor.py", "tools"): "doctor: the binaries it looks for (docker, apptainer), not targets",
    ("renderers/__init__.py", "<module>"): "renderers: recipe kinds, not targets (docker, apptainer, shell)",
    ("renderers/shell.py", "<module>"): "renderers: the setup script's two flavours",
    ("recipe/render.py", "render_plan"): "recipe: the recipe kinds rendered together",
    ("plan/cluster.py", "<module>"): "a cluster profile's container_runtime: the runtimes its nodes have (a field's allowed values), not a target list",
    ("commands/render.py", "<module>"): "recipe kinds (docker, apptainer, shell), kept in step with renderers",
}

# The per-target implementations the orchestration modules must reach only through targets/.
BACKENDS = {
    "envport.builders.docker.builder", "envport.builders.apptainer.builder", "envport.builders.shell",
    "envport.verify.docker", "envport.verify.sif", "envport.verify.backends",
    "envport.witness.launchers.docker", "envport.witness.launchers.sif", "envport.witness.launchers.local",
    "envport.witness.launchers.ssh",
}
ORCHESTRATION = ("envport.commands.build", "envport.commands.up", "envport.commands.verify",
                 "envport.commands.witness", "envport.commands.parity", "envport.commands.matrix",
                 "envport.report.matrix", "envport.report.parity", "envport.report.workflow", "envport.flow.up",
                 "envport.flow.parity")


def _names_in(node) -> set[str]:
    elts = node.keys if isinstance(node, ast.Dict) else getattr(node, "elts", [])
    return {e.value for e in elts if isinstance(e, ast.Constant) and e.value in NAMES}


def _is_target(node) -> bool:
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return name == "target" or name.endswith("_target")


def findings(source: str, label: str) -> list[tuple[str, str, str]]:
    """(label, enclosing function, what) for every target list or target branch in SOURCE."""
    tree = ast.parse(source)
    out = []
    scopes = [(n, n.name) for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]

    def scope_of(node) -> str:
        inner = [name for fn, name in scopes
                 if fn.lineno <= node.lineno <= (fn.end_lineno or fn.lineno) and fn is not node]
        return inner[-1] if inner else "<module>"

    for node in ast.walk(tree):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)) and len(_names_in(node)) >= 2:
            out.append((label, scope_of(node), f"line {node.lineno}: lists {sorted(_names_in(node))}"))
        elif isinstance(node, ast.Compare) and (_is_target(node.left) or any(map(_is_target, node.comparators))):
            for other in [node.left, *node.comparators]:
                hit = ({other.value} & NAMES if isinstance(other, ast.Constant) else _names_in(other)
                       if isinstance(other, (ast.Tuple, ast.List, ast.Set)) else set())
                if hit:
                    out.append((label, scope_of(node), f"line {node.lineno}: compares a target with {sorted(hit)}"))
    return out


def _every_finding():
    out = []
    for path in sorted(module_files().values()):
        rel = path.relative_to(SRC) if SRC in path.parents else Path("renderers") / path.name
        if rel.parts[0] == "targets":
            continue
        out.extend(findings(path.read_text(), rel.as_posix()))
    return out


def test_no_module_outside_targets_lists_or_branches_on_target_names():
    bad = [f"{label} ({fn}) {what}" for label, fn, what in _every_finding() if (label, fn) not in KNOWN]
    assert not bad, ("target names listed or compared outside src/envport/targets/ (ask envport.targets.registry "
                     "or the Target instead):\n" + "\n".join(bad))


def test_the_fast_path_answers_only_for_registered_targets():
    """commands/fast.py keeps no list of its own: the targets that answer a no-op build early are targets/fast's."""
    from envport.targets.fast import ANSWERS

    assert ANSWERS and set(ANSWERS) <= set(registry.NAMES), sorted(set(ANSWERS) - set(registry.NAMES))


def test_the_known_list_only_names_places_that_still_list_targets():
    seen = {(label, fn) for label, fn, _ in _every_finding()}
    stale = sorted(k for k in KNOWN if k not in seen)
    assert not stale, f"fixed: remove from KNOWN: {stale}"


def test_orchestration_reaches_backends_only_through_targets():
    g = graph()
    bad = sorted(f"{m} imports {d}" for m in ORCHESTRATION for d in g.get(m, ()) if d in BACKENDS)
    assert not bad, "import a backend through envport.targets, not directly:\n" + "\n".join(bad)


@pytest.mark.parametrize("snippet, expected", [
    ('T = ("docker", "venv")', "lists"),
    ('def f(args):\n    if args.target == "conda":\n        pass', "compares"),
    ('def f(t):\n    return t.target in ("apptainer",)', "compares"),
    ('W = {"docker": 1, "apptainer": 2}', "lists"),
])
def test_the_checker_sees_lists_and_branches(snippet, expected):
    """The oracle itself: each way of writing a second target list is found."""
    assert [what for _, _, what in findings(snippet, "x.py") if expected in what]


def test_the_checker_leaves_one_name_and_other_words_alone():
    assert findings('IMAGE = "docker"\nKINDS = ("def", "shell")\nif kind == "docker": pass', "x.py") == []


def test_every_target_module_defines_one_target_and_is_listed():
    modules = {p.stem for p in (SRC / "targets").glob("*.py")} - {"__init__", "base", "registry", "needs", "host", "gc",
                                                                  "fast", "push", "sbom"}
    assert modules == set(registry.NAMES)
    for t in registry.every():
        assert isinstance(t, Target) and t.name in registry.NAMES and t.summary and t.recipe
        assert set(t.unsupported) <= set(OPERATIONS), f"{t.name}: unknown operations {set(t.unsupported)}"


def test_an_unsupported_operation_says_why():
    conda = registry.get("conda")
    with pytest.raises(Unsupported) as caught:
        conda.launcher(None)
    r = caught.value.result("witness demo-cpu")
    assert r.verdict is Verdict.REFUSED and r.reason == "unsupported" and "no witness launcher" in r.detail


def test_the_docs_target_table_is_the_registry():
    doc = (SRC.parents[1] / "docs" / "cli.md").read_text()
    block = doc.split("<!-- targets:begin -->\n", 1)[1].split("<!-- targets:end -->", 1)[0]
    assert block == registry.docs_table(), "docs/cli.md's target table drifted: paste registry.docs_table()"


def test_witness_on_a_target_without_a_launcher_says_why(project):
    """`witness --target conda` was not a choice (argparse: exit 2, no reason); now it is REFUSED with the reason."""
    proc = run_envport("witness", "demo-cpu", "--target", "conda", "--json", root=project)
    out = as_json(proc)
    assert proc.returncode == 3, proc.stderr
    step = out["steps"][0]
    assert step["verdict"] == "REFUSED" and step["reason"] == "unsupported"
    assert registry.get("conda").unsupported["witness"] in step["detail"]


def test_every_command_offers_every_target_the_registry_names():
    from envport.commands import build, up, verify, witness

    for command in (build.BUILD_TARGETS, up.TARGETS, verify.VERIFY_TARGETS, witness.TARGETS):
        assert command == registry.NAMES


@pytest.mark.parametrize("command", ["push", "sbom"])
def test_push_and_sbom_of_a_target_without_them_say_why(project, command):
    """`push`/`sbom --target conda` were argparse errors (exit 2, no reason): now REFUSED [unsupported] with why,
    from the target's own `unsupported` table (the command keeps no list of its own)."""
    extra = ["--to", "oras://127.0.0.1:1/envport/x", "--json"] if command == "push" else []
    proc = run_envport(command, "demo-cpu", "--target", "conda", *extra, root=project)
    assert proc.returncode == 3, (proc.stdout, proc.stderr)
    why = registry.get("conda").unsupported[command]
    if command == "push":
        step = as_json(proc)["steps"][0]
        assert step["verdict"] == "REFUSED" and step["reason"] == "unsupported" and why in step["detail"]
    else:
        assert "REFUSED" in proc.stderr and "[unsupported]" in proc.stderr and why[:60] in proc.stderr, proc.stderr


def test_push_and_sbom_are_asked_of_the_targets():
    assert set(registry.names("push")) == {"docker", "apptainer", "podman"}
    assert set(registry.names("sbom")) == {"docker", "apptainer", "venv", "podman"}

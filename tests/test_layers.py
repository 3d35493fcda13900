"""The package's folders are the data flow: each layer imports only from layers before it.

The import graph is read with `ast` from the source (function-local imports
included: hiding an import inside a function does not hide the dependency),
so a cycle or an upward import fails here before it confuses a reader.
docs/architecture.md describes the same order; a test below keeps them in step.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "envport"

# The one declaration of the layer order (earliest first). A module may import
# from its own layer or any earlier one, never from a later one.
LAYERS = [
    "core",
    "spec",
    "plan",
    "renderers",   # top-level renderers/, installed as envport.renderers
    "recipe",
    "engines",
    "sif",         # the SIF format: signatures (DSSE, PGP) over sif/format.py reader
    "builders",
    "verify",
    "witness",
    "targets",     # one module per backend, one registry: the only place target names are listed
    "report",
    "porting",
    "flow",        # up, parity, matrix orchestration as typed steps over targets
    "commands",
    "cli",         # envport/cli.py, __main__.py, __init__.py
]


def module_files() -> dict[str, Path]:
    mods = {}
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC)
        if rel.parts[:2] == ("witness", "scripts"):
            continue  # in-env scripts: stdlib + torch only, run inside the built env
        parts = ["envport", *rel.with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = path
    for path in (ROOT / "renderers").glob("*.py"):
        name = "envport.renderers" if path.stem == "__init__" else f"envport.renderers.{path.stem}"
        mods[name] = path
    return mods


def layer_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1 or parts[1] in ("cli", "__main__"):
        return "cli"
    return parts[1]


def imports_of(module: str, path: Path, known: set[str]) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.name == "__init__.py"
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_pkg else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            names = [prefix] + [f"{prefix}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            # the longest known module the name points into
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module and name != "envport":
                found.add(name)
    return found


def graph() -> dict[str, set[str]]:
    mods = module_files()
    known = set(mods)
    return {m: imports_of(m, p, known) for m, p in mods.items()}


def test_every_module_is_in_a_declared_layer():
    unknown = sorted(m for m in graph() if layer_of(m) not in LAYERS)
    assert not unknown, f"modules outside the declared layers {LAYERS}: {unknown}"


def test_no_import_reaches_a_later_layer():
    rank = {name: i for i, name in enumerate(LAYERS)}
    upward = []
    for module, deps in sorted(graph().items()):
        for dep in sorted(deps):
            if rank[layer_of(dep)] > rank[layer_of(module)]:
                upward.append(f"{module} ({layer_of(module)}) imports {dep} ({layer_of(dep)})")
    assert not upward, "imports against the layer order:\n" + "\n".join(upward)


def test_no_import_cycle():
    g = graph()
    state: dict[str, int] = {}
    cycles = []

    def visit(node, stack):
        state[node] = 1
        stack.append(node)
        for dep in sorted(g.get(node, ())):
            if state.get(dep) == 1:
                cycles.append(" -> ".join(stack[stack.index(dep):] + [dep]))
            elif dep not in state:
                visit(dep, stack)
        stack.pop()
        state[node] = 2

    for node in sorted(g):
        if node not in state:
            visit(node, [])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_checker_sees_function_local_and_relative_imports(tmp_path):
    """The oracle itself: an upward import hidden in a function is still an edge."""
    src = tmp_path / "mod.py"
    src.write_text("def f():\n    from ..report import ledger\n    import envport.commands.build\n")
    known = {"envport.report.ledger", "envport.commands.build", "envport.core.mod"}
    assert imports_of("envport.core.mod", src, known) == {"envport.report.ledger", "envport.commands.build"}


def test_architecture_doc_lists_the_same_layers():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    block = re.search(r"```layers\n(.*?)```", doc, re.S)
    assert block, "docs/architecture.md needs a ```layers block naming the layer order"
    named = [line.split()[0].rstrip("/") for line in block.group(1).splitlines() if line.strip()]
    assert named == LAYERS, f"docs/architecture.md says {named}, tests/test_layers.py says {LAYERS}"


SLURM_CLIENT = {"sbatch", "squeue", "scontrol", "sacct", "scancel", "sinfo"}


def test_the_witness_layer_holds_no_slurm_client_profiles_or_sif_build():
    """witness/ holds only witnessing: the Slurm client is engines/slurm, cluster profiles plan/cluster,
    the SIF build job builders/apptainer/sif_job (issue 24).  launchers/ (srun) is the launcher's own."""
    found = []
    for path in sorted((SRC / "witness").rglob("*.py")):
        rel = path.relative_to(SRC / "witness")
        if rel.parts[0] in ("scripts", "launchers"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.List) and node.elts and isinstance(node.elts[0], ast.Constant)
                    and node.elts[0].value in SLURM_CLIENT):
                found.append(f"witness/{rel}:{node.lineno}: runs {node.elts[0].value}")
            if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name in (
                    "ClusterProfile", "load_cluster", "render_sif_build"):
                found.append(f"witness/{rel}:{node.lineno}: defines {node.name}")
    assert not found, "\n".join(found)

"""`envport import` scenario files: tests/import/*.txt, one behaviour each (as cog's txtar integration tests).

A scenario holds its header (`# args:`, `# exit:`), the recipe (the first
`-- FILE --` section; later ones are build-context files next to it), the
spec the import must write (`-- expect spec --`, compared as YAML data) and
the exact report it prints (`-- expect report --`, every line).  A scenario
that maps (exit 0) must also `envport validate` and `envport render`.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from envport.cli import main

HERE = Path(__file__).parent / "import"
SCENARIOS = sorted(HERE.glob("*.txt"))


def parse(path: Path) -> tuple[dict, list[tuple[str, str]]]:
    """({header key: value}, [(section name, body)]) of one scenario file."""
    header, sections, current = {}, [], None
    for line in path.read_text(encoding="utf-8").split("\n"):
        if line.startswith("-- ") and line.endswith(" --"):
            current = [line[3:-3], []]
            sections.append(current)
        elif current is not None:
            current[1].append(line)
        elif (m := re.match(r"# ([a-z]+):(.*)$", line)):
            # A header key written twice would silently take the last value: refuse it.
            assert m.group(1) not in header, f"{path.name}: header `# {m.group(1)}:` is written twice"
            header[m.group(1)] = m.group(2).strip()
    return header, [(name, "\n".join(body).rstrip("\n") + "\n") for name, body in sections]


def run_scenario(path: Path, tmp: Path, capsys) -> dict:
    header, sections = parse(path)
    inputs = [(n, b) for n, b in sections if not n.startswith("expect")]
    ctx, proj = tmp / "ctx", tmp / "proj"
    (proj / "specs").mkdir(parents=True)
    for name, body in inputs:
        dest = ctx / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(body, encoding="utf-8")
    capsys.readouterr()
    rc = main(["-C", str(proj), "import", str(ctx / inputs[0][0]), *shlex.split(header.get("args", ""))])
    out = capsys.readouterr().out
    return {"header": header, "sections": dict(sections), "rc": rc, "out": out, "proj": proj}


def test_there_are_scenarios_for_every_kind():
    kinds = {parse(p)[0].get("kind") for p in SCENARIOS}
    assert {"dockerfile", "def", "conda", "requirements", "shell"} <= kinds


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_scenario(path: Path, tmp_path: Path, capsys):
    got = run_scenario(path, tmp_path, capsys)
    header, sections = got["header"], got["sections"]
    assert got["out"] == sections["expect report"], f"{path.name}: the report differs:\n{got['out']}"
    assert got["rc"] == int(header["exit"]), got["out"]
    name = header["name"]
    spec_file = got["proj"] / "specs" / f"{name}.yaml"
    assert yaml.safe_load(spec_file.read_text()) == yaml.safe_load(sections["expect spec"]), spec_file.read_text()
    for section, body in sections.items():
        if section.startswith("expect file "):
            assert (got["proj"] / section[len("expect file "):]).read_text() == body
    if got["rc"] == 0:
        # `envport import … && envport render NAME` works for every scenario that maps.
        assert main(["-C", str(got["proj"]), "validate", name]) == 0
        assert main(["-C", str(got["proj"]), "render", name]) == 0
        assert (got["proj"] / "images" / name / "Dockerfile").is_file()

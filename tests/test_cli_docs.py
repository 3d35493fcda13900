"""Docs that cannot drift (issue 36 item 5).

- docs/cli.md's command table and target table are generated (envport.commands.clidoc, `just docs`) from the
  argparse parser and the target registry: the file must be what the generator writes now;
- every `--target` list a doc spells out (`--target a|b|c`) is inside that generated table, nowhere else;
- README.md's Layout block names folders that exist, every top-level folder of the checkout, and every
  package of src/envport.
"""

from __future__ import annotations

import argparse
import re
import subprocess

from envport.cli import build_parser
from envport.commands import clidoc
from envport.targets import registry

from .support import REPO

CLI_MD = REPO / "docs" / "cli.md"


def _block(text: str, name: str) -> str:
    m = re.search(rf"<!-- {name}:begin -->\n(.*?)<!-- {name}:end -->", text, re.S)
    assert m, f"docs/cli.md has no {name} markers"
    return m.group(1)


def test_cli_md_generated_tables_are_current():
    text = CLI_MD.read_text()
    assert clidoc.render(text, build_parser()) == text, "docs/cli.md drifted from the parser/registry: run `just docs`"


def test_the_command_table_lists_every_command_and_its_target_choices():
    table = _block(CLI_MD.read_text(), "commands")
    parser = build_parser()
    for cmd, synopsis, _help in clidoc._rows(parser, "envport"):
        assert f"| `{clidoc._cell(synopsis)}` |" in table, cmd
    # Every --target choice list comes from the registry's targets, each named once.
    for _name, _help, sp in clidoc._subcommands(parser):
        for a in sp._actions:
            if "--target" in a.option_strings and a.choices:
                assert set(a.choices) <= set(registry.NAMES) | {"shell"} and len(set(a.choices)) == len(a.choices)


def test_a_generated_block_without_markers_is_an_error():
    try:
        clidoc.render("no markers here\n", argparse.ArgumentParser(prog="envport"))
    except ValueError as exc:
        assert "markers" in str(exc)
    else:
        raise AssertionError("render accepted a file without its markers")


def test_no_doc_spells_out_a_target_list_by_hand():
    spelled = re.compile(r"--target [a-z]+(?:\\?\|[a-z]+)+")
    found = []
    for path in [REPO / "README.md", REPO / "tests" / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = path.read_text()
        if path == CLI_MD:
            text = text.replace(_block(text, "commands"), "").replace(_block(text, "targets"), "")
        found += [f"{path.relative_to(REPO)}: {m.group(0)}" for m in spelled.finditer(text)]
    assert not found, "write `--target T` and let docs/cli.md's generated table list them: " + "; ".join(found)


def _layout() -> list[str]:
    text = (REPO / "README.md").read_text()
    m = re.search(r"^## Layout\n\n```\n(.*?)```", text, re.S | re.M)
    assert m, "README.md has no Layout block"
    return m.group(1).splitlines()


def test_readme_layout_matches_the_tree():
    lines = _layout()
    named = [ln.split()[0] for ln in lines if ln and not ln.startswith(" ")]
    missing = [n for n in named if not (REPO / n).exists()]
    assert not missing, f"README.md's Layout names what the tree lacks: {missing}"
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    folders = {p.split("/")[0] + "/" for p in tracked.splitlines() if "/" in p}
    folders -= {".github/"}  # the CI workflow, not the project's layout
    assert not folders - {n.split("/")[0] + "/" for n in named}, \
        f"top-level folders missing from README.md's Layout: {sorted(folders - set(named))}"
    # The src/envport/ entry lists every package, in the layers' order (docs/architecture.md).
    i = next(k for k, ln in enumerate(lines) if ln.startswith("src/envport/"))
    listed = re.findall(r"\b([a-z_]+)/", lines[i + 1])
    packages = {p.name for p in (REPO / "src" / "envport").iterdir() if (p / "__init__.py").is_file()}
    assert set(listed) == packages, f"README.md lists {sorted(listed)}, src/envport has {sorted(packages)}"
    arch = (REPO / "docs" / "architecture.md").read_text()
    layers = re.search(r"```layers\n(.*?)```", arch, re.S).group(1)
    order = [ln.split()[0].rstrip("/") for ln in layers.splitlines() if ln.strip()]
    assert listed == [p for p in order if p in packages], f"README.md's order {listed}, the layers' {order}"

"""The conda table (porting/conda_map.yaml) and the torch-at-build-time order check.

Scenario tests/import/conda-mapped.txt covers a whole environment.yml; here the table's own shape,
and the case the scenario cannot hold at once: flash-attn with no torch before it.
"""

from __future__ import annotations

from pathlib import Path

from envport.cli import main
from envport.porting.conda import table


def test_the_table_has_its_sections_and_no_name_twice():
    t = table()
    assert set(t) == {"debian", "pypi", "torch_index", "base_image", "skip", "needs_torch_at_build"}
    mapped = [*t["debian"], *t["pypi"], *t["torch_index"], *t["base_image"], *t["skip"]]
    assert len(mapped) == len(set(mapped)), "a conda name in two sections"
    assert all(isinstance(v, str) and v for section in ("debian", "pypi") for v in t[section].values())


def test_a_torch_extension_with_no_torch_before_it_is_lost(tmp_path: Path, capsys):
    (tmp_path / "specs").mkdir()
    recipe = tmp_path / "Dockerfile"
    recipe.write_text("FROM python:3.11-slim\n"
                      "RUN pip install --no-cache-dir flash-attn==2.5.6 --no-build-isolation\n"
                      "RUN pip install --no-cache-dir torch==2.2.1\n")
    rc = main(["-C", str(tmp_path), "import", str(recipe), "--name", "fa", "--dry-run"])
    out = capsys.readouterr().out
    assert rc == 1, out
    assert ("Dockerfile:2: flash-attn==2.5.6: dropped (a step that may install something; the spec lacks it): "
            "builds against torch when it installs, and no earlier phase installs torch") in out, out

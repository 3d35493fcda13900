"""`envport wheelhouse`: real pip downloads through the host's pip configuration."""

from __future__ import annotations

import json

from envport.spec.loader import load_spec
from envport.plan.site import Site
from envport.core.verdict import Verdict
from envport.builders.wheelhouse import MANIFEST, ensure_wheelhouse

SPEC = """\
name: tiny
base: envport/debian-bookworm:base
python: "{py}"
pip_phases:
  - ["six==1.16.0"]
  - {phase2}
"""


def _project(tmp_path, phase2: str):
    import sys
    (tmp_path / "specs").mkdir(exist_ok=True)
    py = "%d.%d" % sys.version_info[:2]
    (tmp_path / "specs" / "tiny.yaml").write_text(SPEC.format(py=py, phase2=phase2))
    return load_spec("tiny", tmp_path)


def test_downloads_each_phase_once_and_only_edited_phases_again(tmp_path):
    site = Site(name="t", wheelhouse=True, wheelhouse_dir="wh")
    lines: list[str] = []
    first = ensure_wheelhouse(_project(tmp_path, '["idna==3.7"]'), site, tmp_path, lines.append)
    assert first.verdict is Verdict.OK, first.lines
    files = sorted(p.name for p in (tmp_path / "wh" / "tiny").iterdir())
    assert any(f.startswith("six-1.16.0") for f in files) and any(f.startswith("idna-3.7") for f in files)
    assert len(lines) == 2

    again = ensure_wheelhouse(_project(tmp_path, '["idna==3.7"]'), site, tmp_path, lines.append)
    assert again.verdict is Verdict.PRESENT and len(lines) == 2

    # Editing only the last phase downloads only that phase.
    lines.clear()
    edited = ensure_wheelhouse(_project(tmp_path, '["idna==3.6"]'), site, tmp_path, lines.append)
    assert edited.verdict is Verdict.OK
    assert len(lines) == 1 and "idna==3.6" in lines[0]
    manifest = json.loads((tmp_path / "wh" / "tiny" / MANIFEST).read_text())
    assert len(manifest["phases"]) == 3


def test_a_failed_download_is_failed_with_pips_lines(tmp_path):
    site = Site(name="t", wheelhouse=True, wheelhouse_dir="wh")
    result = ensure_wheelhouse(_project(tmp_path, '["envport-no-such-package-xyz==0.0.1"]'), site, tmp_path,
                               lambda _: None)
    assert result.verdict is Verdict.FAILED
    assert "phase 2" in result.detail
    assert any("envport-no-such-package-xyz" in ln for ln in result.lines)

"""Reproducible SIFs and the cache keys behind the phase cache.

No build here: how %post is cut into steps and what each step's key depends on, on the rendered demo-cpu
.def; where the build time comes from; `envport rebuild-check` refusing a SIF without an embedded spec.
The builds (two from nothing with the same bytes; `rebuild-check` of a SIF built through the cache
finding the same sha256) are tests/test_sif_phase_cache.py's, sharing its builds.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from envport.builders.apptainer import phases as ph
from envport.builders.apptainer.builder import SPEC_EPOCH_SPAN, SPEC_EPOCH_START, source_date, spec_epoch
from envport.builders.apptainer.deffile import parse_def
from envport.plan.site import load_site
from envport.recipe.identity import resolve
from envport.recipe.render import render_plan
from envport.sif.format import write_sif
from envport.spec.loader import load_spec

from .sif_fixtures import sif_env
from .support import REPO, as_json, copy_project, run_envport, write_spec

def _def(root: Path, name: str, site: str = "local"):
    loaded = load_spec(name, root)
    resolved = resolve(loaded, load_site(site, root), "apptainer")
    rendering = render_plan(resolved.plan, resolved.hash, ("apptainer",), site=site)
    return parse_def(rendering.files[f"{name}.def"][0].decode(), f"{name}.def"), rendering


def _context(tmp: Path, rendering) -> Path:
    for rel, (data, _mode) in rendering.files.items():
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp / rel).write_bytes(data)
    return tmp


def test_post_is_cut_into_its_plan_steps_each_carrying_the_exports_before_it():
    deffile, _ = _def(REPO, "demo-cpu")
    cut = ph.split(deffile)
    assert not cut.why_whole
    assert [s.marker for s in cut.steps] == [s.marker for s in deffile.steps]
    # kept: python (the step before the first pip phase), then each pip phase; files/weights/labels re-run
    assert [cut.steps[n - 1].marker for n in cut.kept()] == ["env", "pip-1", "pip-2"]
    pip2 = cut.script(next(s.n for s in cut.steps if s.marker == "pip-2"))
    assert pip2.startswith(cut.prologue) and 'export PATH="/opt/envport/venv/bin:$PATH"' in pip2
    assert "python3.11 -m venv" not in pip2 and "torch" not in pip2.split("step 5/")[-1].split("\n", 1)[-1]
    # run one after another, the steps are %post: nothing dropped, nothing added but state lines
    assert "".join(s.body for s in cut.steps) == deffile.script("post")[len(cut.prologue):]


def test_post_with_other_shell_state_runs_whole():
    deffile, _ = _def(REPO, "demo-cpu")
    body = deffile.script("post").replace("    python3.11 -m venv", "    cd /opt\n    python3.11 -m venv", 1)
    text = deffile.text.replace(deffile.script("post"), body)
    cut = ph.split(parse_def(text, "x.def"))
    assert "cd /opt" in cut.why_whole and not cut.steps


def test_an_edit_to_the_last_pip_phase_keeps_every_earlier_key(tmp_path):
    root = copy_project(tmp_path / "p")
    write_spec(root, "keyed", pip_phases=[["six==1.16.0"], ["idna==3.7"]], shim_files={"/opt/k/run.py": "files/demo_run.py"})
    before, r1 = _def(root, "keyed")
    keys1 = ph.keys(before, ph.split(before), "base-id", _context(tmp_path / "c1", r1))
    write_spec(root, "keyed", pip_phases=[["six==1.16.0"], ["idna==3.6"]], shim_files={"/opt/k/run.py": "files/demo_run.py"})
    after, r2 = _def(root, "keyed")
    cut = ph.split(after)
    keys2 = ph.keys(after, cut, "base-id", _context(tmp_path / "c2", r2))
    pip2 = next(s.n for s in cut.steps if s.marker == "pip-2")
    assert [keys1[n] == keys2[n] for n in sorted(keys1)] == [n < pip2 for n in sorted(keys1)]
    # another base changes every key; a shim file's bytes only the step that names it and later
    assert ph.keys(after, cut, "other-base", _context(tmp_path / "c3", r2))[1] != keys2[1]
    (tmp_path / "c2" / "files" / "demo_run.py").write_text("print('edited')\n")
    keys3 = ph.keys(after, cut, "base-id", tmp_path / "c2")
    files = next(s.n for s in cut.steps if s.marker == "files")
    assert [keys2[n] == keys3[n] for n in sorted(keys2)] == [n < files for n in sorted(keys2)]


def test_build_inputs_are_owned_by_no_step_and_copied_afresh_on_every_restore():
    deffile, _ = _def(REPO, "demo-cpu")
    cut = ph.split(deffile)
    owners = {f.dst: ph.owner(f, cut) for f in deffile.files}
    assert owners["/opt/envport-build/wheelhouse"] == 0
    assert owners["/opt/envport/locks/pip-2.txt"] == next(s.n for s in cut.steps if s.marker == "pip-2")
    later = ph.later_files(deffile, cut, next(s.n for s in cut.steps if s.marker == "pip-1"))
    assert {f.dst for f in later.files} == {"/opt/envport-build/wheelhouse", "/opt/envport-build/ca-bundle.crt",
                                            "/opt/envport/locks/pip-2.txt", "/opt/demo/run.py"}


def test_the_build_time_is_source_date_epoch_else_derived_from_the_hash(monkeypatch):
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    t, why = source_date("ab" * 32)
    assert t == spec_epoch("ab" * 32) and SPEC_EPOCH_START <= t < SPEC_EPOCH_START + SPEC_EPOCH_SPAN
    assert why == "derived from the env hash" and source_date("cd" * 32)[0] != t
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    assert source_date("ab" * 32) == (1700000000, "SOURCE_DATE_EPOCH")
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "yesterday")
    from envport.sif.format import SifError

    with pytest.raises(SifError, match="SOURCE_DATE_EPOCH='yesterday'"):
        source_date("ab" * 32)


def test_rebuild_check_refuses_a_sif_without_an_embedded_spec(tmp_path):
    if shutil.which("mksquashfs") is None:
        pytest.skip("mksquashfs not installed (apt-get install squashfs-tools)")
    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / "hello").write_text("hi\n")
    subprocess.run(["mksquashfs", str(tmp_path / "tree"), str(tmp_path / "t.sqfs"), "-noappend", "-quiet"],
                   check=True, capture_output=True)
    sif = tmp_path / "bare.sif"
    write_sif(sif, deffile=b"Bootstrap: scratch\n", inspect_metadata=b"{}", squashfs_path=tmp_path / "t.sqfs",
              created=0, uuid=bytes(16))
    proc = run_envport("rebuild-check", str(sif), "--json", root=tmp_path, env=sif_env(), timeout=120)
    out = as_json(proc)
    assert proc.returncode == 3 and out["steps"][-1]["reason"] == "no_embedded_spec", out


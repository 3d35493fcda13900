"""`envport inspect FILE.sif`: a SIF read without apptainer, compared with its spec.

The SIFs are real (tests/sif_fixtures.py, built by envport's builder); the malformed ones are
real SIFs cut short or patched, and files that are not SIFs at all.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from envport.builders.apptainer.singularity_d import inspect_metadata
from envport.sif.format import DESCRIPTOR, DESCRIPTORS_OFFSET, read_sif, write_sif

from .sif_fixtures import BuiltSif
from .support import REPO, as_json, run_envport

pytest_plugins = ["tests.sif_fixtures"]


def _inspect(path: Path, root: Path, *extra: str) -> subprocess.CompletedProcess:
    return run_envport("inspect", str(path), *extra, root=root, timeout=120)


def test_demo_sif_matches_its_spec(demo_sif: BuiltSif):
    proc = _inspect(demo_sif.path, demo_sif.root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert f"label        envport.hash={demo_sif.hash}" in out
    assert "environment  export DEMO_GREETING='hello from demo-cpu'  (90-environment.sh)" in out
    assert "object 4     FS Squashfs Primary system amd64 (group 1," in out
    assert out.rstrip().splitlines()[-1].startswith("OK       inspect ")
    # The verdict comes from the partition's own files, not from the labels (issue 21 F3).
    assert f"env          labels claim demo-cpu@{demo_sif.hash[:12]} (/.singularity.d/labels.json)" in out
    assert f"matches specs/demo-cpu.yaml from the content (demo-cpu@{demo_sif.hash[:12]}): python 3.11." in out
    last = out.rstrip().splitlines()[-1]
    at_lock = last.split("python 3.11.")[1].split(", ", 1)[1]
    n, total = at_lock.split(" ")[0].split("/")
    assert n == total and int(total) > 1 and at_lock.endswith("distributions at the lock"), last
    assert "risks        0 (none)" in out and "risk         " not in out
    assert "check        integrity: OK: partition sha256" in out
    data = as_json(_inspect(demo_sif.path, demo_sif.root, "--json"))
    assert data["sif"]["risks"] == [] and data["sif"]["content"]["distributions"]["torch"]


def test_edited_spec_is_stale_naming_the_field(demo_sif: BuiltSif, tmp_path: Path):
    for d in ("specs", "sites", "images"):
        shutil.copytree(demo_sif.root / d, tmp_path / d)
    spec_path = tmp_path / "specs" / "demo-cpu.yaml"
    data = yaml.safe_load(spec_path.read_text())
    data["env"]["DEMO_GREETING"] = "hello from an edited spec"
    spec_path.write_text(yaml.safe_dump(data, sort_keys=False))
    proc = _inspect(demo_sif.path, tmp_path, "--json")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    step = as_json(proc)["steps"][0]
    assert step["verdict"] == "REFUSED" and step["reason"] == "stale"
    assert step["data"]["changed"] == ["env.DEMO_GREETING"]
    assert "env.DEMO_GREETING" in step["detail"]
    text = _inspect(demo_sif.path, tmp_path).stdout
    assert "[stale]" in text and "changed: env.DEMO_GREETING" in text


def test_truncated_sif_says_so(tiny_sif: BuiltSif, tmp_path: Path):
    cut = tmp_path / "cut.sif"
    with open(tiny_sif.path, "rb") as src, open(cut, "wb") as dst:
        dst.write(src.read(tiny_sif.path.stat().st_size // 2))
    proc = _inspect(cut, tiny_sif.root, "--json")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    step = as_json(proc)["steps"][0]
    assert (step["verdict"], step["reason"]) == ("FAILED", "truncated")
    assert "cut short" in step["detail"]


@pytest.mark.parametrize("make,reason", [
    (lambda p: p.write_bytes((REPO / "README.md").read_bytes()), "not_a_sif"),
    (lambda p: p.write_bytes(b""), "empty_file"),
    (lambda p: p.mkdir(), "not_a_file"),
    (lambda p: None, "not_found"),
], ids=["text-file", "empty", "directory", "missing"])
def test_foreign_files_fail_with_their_reason(make, reason, tmp_path: Path):
    path = tmp_path / "x.sif"
    make(path)
    proc = _inspect(path, REPO, "--json")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert as_json(proc)["steps"][0]["reason"] == reason


def test_foreign_arch_is_refused(tiny_sif: BuiltSif, tmp_path: Path):
    foreign = tmp_path / "arm.sif"
    shutil.copyfile(tiny_sif.path, foreign)
    part = [d for d in read_sif(foreign).descriptors if d.datatype_name == "FS"][0]
    with open(foreign, "r+b") as fh:
        fh.seek(45)  # the header's arch field
        fh.write(b"04")  # arm64
        fh.seek(DESCRIPTORS_OFFSET + (part.id - 1) * DESCRIPTOR.size + 201 + 8)  # the partition's arch
        fh.write(b"04")
    proc = _inspect(foreign, tiny_sif.root, "--json")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    out = as_json(proc)
    assert out["steps"][0]["reason"] == "foreign_arch" and "arm64" in out["steps"][0]["detail"]
    assert out["sif"]["labels"]["envport.name"] == "tiny-sif"  # what could be read is still shown


def test_sif_not_built_by_envport_is_refused(tmp_path: Path):
    if shutil.which("mksquashfs") is None:
        pytest.skip("mksquashfs not installed (apt-get install squashfs-tools)")
    tree = tmp_path / "tree"
    (tree / "bin").mkdir(parents=True)
    sqfs = tmp_path / "x.sqfs"
    subprocess.run(["mksquashfs", str(tree), str(sqfs), "-noappend", "-quiet", "-no-progress"], check=True)
    deffile = "Bootstrap: docker\nFrom: debian:bookworm\n"
    sif = tmp_path / "other.sif"
    write_sif(sif, deffile=deffile.encode(), inspect_metadata=inspect_metadata(
        deffile=deffile, labels={"maintainer": "someone else"}, environment={}), squashfs_path=sqfs,
        created=0, uuid=b"\0" * 16)
    proc = _inspect(sif, REPO, "--json")
    assert proc.returncode == 3
    out = as_json(proc)
    assert out["steps"][0]["reason"] == "not_envport" and out["sif"]["labels"] == {"maintainer": "someone else"}
    assert json.dumps(out)  # the whole report is JSON


def test_outside_a_project_the_demo_sif_is_judged_against_the_lock_it_embeds(demo_sif: BuiltSif, tmp_path: Path):
    """Issue 37 U9: an admin's folder holding only the SIF (no specs/): inspect judges its content against the
    spec and lock it embeds (before: SKIPPED "not compared: no specs/ directory")."""
    from envport.plan.lock import load_for
    from envport.spec.loader import load_spec

    admin = tmp_path / "admin"
    admin.mkdir()
    proc = _inspect(demo_sif.path, admin, "--json")
    step = as_json(proc)["steps"][0]
    assert proc.returncode == 0 and step["verdict"] == "OK", step
    locked = len(load_for(load_spec("demo-cpu", demo_sif.root)).final())
    assert f"matches the spec and lock it embeds (envport-spec.json: demo-cpu@{demo_sif.hash[:12]})" in step["detail"]
    assert f"{locked}/{locked} distributions at the lock" in step["detail"], step["detail"]


def test_outside_a_project_an_embedded_pin_the_content_breaks_is_named(tiny_sif: BuiltSif, tmp_path: Path):
    """A SIF whose spec object (no lock embedded: the spec's == pins) promises six 1.15.0 while the partition
    holds 1.16.0: content_mismatch naming it (the object edited in place, same length: nothing else moved)."""
    sif = tmp_path / "admin" / tiny_sif.path.name
    sif.parent.mkdir()
    shutil.copyfile(tiny_sif.path, sif)
    obj = next(d for d in read_sif(sif).descriptors if d.name == "envport-spec.json")
    with open(sif, "r+b") as fh:
        fh.seek(obj.offset)
        data = fh.read(obj.size)
        assert data.count(b"six==1.16.0") == 1 and b'"lock"' not in data
        fh.seek(obj.offset)
        fh.write(data.replace(b"six==1.16.0", b"six==1.15.0"))
    good = as_json(_inspect(tiny_sif.path, sif.parent, "--json"))["steps"][0]
    assert good["verdict"] == "OK" and "no lock embedded: the spec's == pins" in good["detail"], good
    proc = _inspect(sif, sif.parent, "--json")
    step = as_json(proc)["steps"][0]
    assert proc.returncode == 3 and step["reason"] == "content_mismatch", step
    assert "six 1.16.0, the spec says 1.15.0" in step["lines"], step["lines"]

"""An admin holding only a `.sif` (sif/embedded.py, issue 27 row 5): `witness` and `verify`
with `--sif` and no project use the spec the SIF embeds and say so; a project's spec and a SIF built from
another version of it are named with the changed fields; `inspect`'s advice fits a reader who cannot build.

The SIF is the session's real `tiny-sif` (tests/sif_fixtures.py); the tampered ones are that file with
its embedded spec object patched in place (same size: the layout and the partition stay).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from envport.sif.format import SPEC_OBJECT
from envport.sif.format import DATA_GENERIC_JSON, read_json_object, read_sif

from .sif_fixtures import BuiltSif, sif_env
from .support import as_json, copy_project, fail_with, run_envport, write_site, write_spec

pytest_plugins = ["tests.sif_fixtures"]


def _admin(cwd: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """`envport ARGS` run in CWD as an admin runs it: no -C, no project above."""
    return subprocess.run([sys.executable, "-m", "envport", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600, env=env or sif_env())


@pytest.fixture
def admin_dir(tmp_path: Path) -> Path:
    d = tmp_path / "admin"
    d.mkdir()
    return d


def _patched(tiny_sif: BuiltSif, dest: Path, change) -> Path:
    """tiny-sif with its embedded spec document changed by CHANGE(doc), written over the same bytes."""
    info = read_sif(tiny_sif.path)
    doc = read_json_object(info, SPEC_OBJECT)
    change(doc)
    desc = info.find(datatype=DATA_GENERIC_JSON, name=SPEC_OBJECT)
    new = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    assert len(new) <= desc.size, "the patch must fit the object"
    whole = bytearray(tiny_sif.path.read_bytes())
    whole[desc.offset:desc.offset + desc.size] = new.ljust(desc.size)
    dest.write_bytes(bytes(whole))
    return dest


def test_witness_and_verify_with_only_the_sif_use_its_embedded_spec(tiny_sif: BuiltSif, admin_dir: Path):
    sif = str(tiny_sif.path)
    said = f"spec: the one {tiny_sif.path.name} embeds ({SPEC_OBJECT}; no specs/tiny-sif.yaml here): " \
           f"tiny-sif@{tiny_sif.hash[:12]}, the image's own labels name the same env and hash, its partition is " \
           "the one it records (sha256)"
    proc = _admin(admin_dir, "witness", "tiny-sif", "--target", "apptainer", "--sif", sif)
    assert proc.returncode == 0, fail_with(proc, "witness --sif outside a project")
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(f"envport witness tiny-sif@{tiny_sif.hash[:12]} --target apptainer"), lines
    assert lines[1].startswith(said), lines
    assert lines[-1].startswith("OK: tiny-sif witnesses on apptainer"), lines
    data = as_json(_admin(admin_dir, "witness", "tiny-sif", "--target", "apptainer", "--sif", sif, "--json"))
    assert (data["spec_source"], data["hash"], data["verdict"]) == ("embedded", tiny_sif.hash, "OK"), data

    junit = admin_dir.parent / "verify.xml"
    proc = _admin(admin_dir, "verify", "tiny-sif", "--target", "apptainer", "--sif", sif, "--junit", str(junit))
    assert proc.returncode == 0, fail_with(proc, "verify --sif outside a project")
    assert proc.stdout.splitlines()[0].startswith(said), proc.stdout
    proc = _admin(admin_dir, "verify", "tiny-sif", "--target", "apptainer", "--sif", sif, "--junit", str(junit),
                  "--json")
    step = as_json(proc)["steps"][0]
    assert step["verdict"] == "OK" and step["data"]["spec_source"] == "embedded", step
    outcomes = {c["id"]: c["outcome"] for c in step["data"]["checks"]}
    # The spec's own promises, checked in the SIF: pins, env, and the hash label under its built hash.
    assert outcomes["pip[six==1.16.0]"] == outcomes["env[TINY_GREETING]"] == "passed", outcomes
    assert outcomes["label[envport.hash]"] == "passed", outcomes
    # The admin's folder is not a project: the runs leave nothing in it (pytest's cache, .benchmarks).
    assert sorted(p.name for p in admin_dir.iterdir()) == [], "left in the admin's folder"


def test_a_name_the_sif_does_not_embed_is_refused(tiny_sif: BuiltSif, admin_dir: Path):
    proc = _admin(admin_dir, "witness", "demo-cpu", "--target", "apptainer", "--sif", str(tiny_sif.path))
    assert proc.returncode == 2, fail_with(proc, "witness demo-cpu --sif tiny-sif")
    assert f"{tiny_sif.path} embeds the spec of tiny-sif, not demo-cpu" in proc.stderr, proc.stderr
    assert "envport witness tiny-sif --target apptainer --sif" in proc.stderr


def test_an_embedded_spec_that_is_not_the_image_is_refused(tiny_sif: BuiltSif, admin_dir: Path, tmp_path: Path):
    # The hash the spec object claims, one digit changed: the image's own labels say otherwise.
    other = _patched(tiny_sif, tmp_path / "other.sif",
                     lambda d: d.update(hash=("0" if d["hash"][0] != "0" else "1") + d["hash"][1:]))
    proc = _admin(admin_dir, "verify", "tiny-sif", "--target", "apptainer", "--sif", str(other), "--json")
    step = as_json(proc)["steps"][0]
    assert proc.returncode == 3 and step["reason"] == "embedded_spec_mismatch", step
    assert "the spec object is not this image's" in step["detail"]
    # A field no spec has: refused as a spec file's typo is, naming where it came from.
    typo = _patched(tiny_sif, tmp_path / "typo.sif", lambda d: d["spec"].update(pyhton=d["spec"].pop("python")))
    proc = _admin(admin_dir, "witness", "tiny-sif", "--target", "apptainer", "--sif", str(typo))
    assert proc.returncode == 2 and f"{typo} ({SPEC_OBJECT})" in proc.stderr and "pyhton" in proc.stderr, \
        fail_with(proc, "witness with a typo in the embedded spec")
    gone = _patched(tiny_sif, tmp_path / "gone.sif", lambda d: d.pop("spec"))
    proc = _admin(admin_dir, "witness", "tiny-sif", "--target", "apptainer", "--sif", str(gone), "--json")
    step = as_json(proc)["steps"][0]
    assert proc.returncode == 3 and step["reason"] == "no_embedded_spec", step


def _edited_project(tmp_path: Path) -> Path:
    """A copy of the project with tiny-sif's env edited after its SIF was built."""
    root = copy_project(tmp_path / "edited")
    write_site(root, "sif-fast", apptainer={"compression": "lz4"})
    write_spec(root, "tiny-sif", env={"TINY_GREETING": "hello from an edited spec"})
    return root


def test_a_sif_of_another_spec_version_is_named_with_the_changed_fields(tiny_sif: BuiltSif, tmp_path: Path):
    root = _edited_project(tmp_path)
    from envport.plan.site import load_site
    from envport.recipe.identity import resolve
    from envport.spec.loader import load_spec

    now = resolve(load_spec("tiny-sif", root), load_site("sif-fast", root), "apptainer").hash
    said = f"spec: {tiny_sif.path.name} was built as tiny-sif@{tiny_sif.hash[:12]}, specs/tiny-sif.yaml is " \
           f"tiny-sif@{now[:12]} now; changed: env.TINY_GREETING"
    args = ("--target", "apptainer", "--site", "sif-fast", "--sif", str(tiny_sif.path))
    proc = run_envport("witness", "tiny-sif", *args, root=root, env=sif_env(), timeout=600)
    assert proc.returncode == 0, fail_with(proc, "witness with an edited spec")
    assert said in proc.stdout.splitlines(), proc.stdout
    data = as_json(run_envport("witness", "tiny-sif", *args, "--json", root=root, env=sif_env(), timeout=600))
    assert data["sif_difference"]["changed"] == ["env.TINY_GREETING"], data
    assert (data["sif_difference"]["sif_hash"], data["sif_difference"]["spec_hash"]) == (tiny_sif.hash, now)
    proc = run_envport("verify", "tiny-sif", *args, "--junit", str(tmp_path / "v.xml"), root=root, env=sif_env(),
                       timeout=600)
    assert said in proc.stdout.splitlines(), fail_with(proc, "verify with an edited spec")
    assert proc.returncode == 1, "the edited env var is not what the SIF holds"
    # What ran is recorded under the SIF's own hash, the spec's beside it.
    ledger = as_json(run_envport("ledger", "tiny-sif", "--json", root=root, env=sif_env(), timeout=120))
    runs = [r for r in ledger["records"] if r["kind"] in ("witness", "verify")]
    assert runs and all((r["hash"], r["spec_hash"]) == (tiny_sif.hash, now) for r in runs), runs


def _no_builder_path(tmp_path: Path) -> str:
    """A PATH where inspect can read a squashfs (unsquashfs) but no SIF can be built (no mksquashfs, no
    bwrap, no apptainer): an admin's login node."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    os.symlink(shutil.which("unsquashfs"), bin_dir / "unsquashfs")
    return str(bin_dir)


def test_inspect_advice_fits_the_reader(tiny_sif: BuiltSif, admin_dir: Path, tmp_path: Path):
    sif = str(tiny_sif.path)
    run = f"envport witness tiny-sif --target apptainer --sif {sif}"
    # No project: judged against the spec it embeds (issue 37 U9); how to run it instead of a build.
    proc = _admin(admin_dir, "inspect", sif)
    assert "matches the spec it embeds" in proc.stdout, proc.stdout
    assert f"    | to run it: {run} (with the spec it embeds)" in proc.stdout.splitlines(), proc.stdout
    root = _edited_project(tmp_path)
    # A project, and a host that cannot build: ask for a rebuild, or run it with the spec it embeds.
    proc = run_envport("inspect", sif, "--site", "sif-fast", root=root,
                       env=sif_env(PATH=_no_builder_path(tmp_path)), timeout=120)
    assert proc.returncode == 3 and "[stale]" in proc.stdout, fail_with(proc, "inspect, no builder")
    fixes = [ln for ln in proc.stdout.splitlines() if ln.startswith("    | ")]
    assert fixes == ["    | fix: ask its builder for a rebuild (envport build tiny-sif --target apptainer, where the "
                     f"project is), or run it with the spec it embeds: {run} --embedded-spec"], proc.stdout
    # A host that builds keeps the build first.
    proc = run_envport("inspect", sif, "--site", "sif-fast", root=root, env=sif_env(), timeout=120)
    fixes = [ln for ln in proc.stdout.splitlines() if ln.startswith("    | ")]
    assert fixes == ["    | fix: envport build tiny-sif --target apptainer",
                     f"    | or run it as built, with the spec it embeds: {run} --embedded-spec"], proc.stdout
    # The advised command works where it was advised: in the project, with the SIF's own spec.
    proc = run_envport("witness", "tiny-sif", "--target", "apptainer", "--sif", sif, "--embedded-spec",
                       root=root, env=sif_env(), timeout=600)
    assert proc.returncode == 0, fail_with(proc, "witness --embedded-spec in a project")
    assert proc.stdout.splitlines()[1].startswith(f"spec: the one {tiny_sif.path.name} embeds"), proc.stdout


def test_embedded_specs_name_their_shim_files_not_their_bytes(tmp_path: Path):
    from envport.core.errors import EnvportError
    from envport.spec.loader import Loaded
    from envport.spec.model import Spec
    from envport.verify.checks import spec_checks

    spec = Spec.model_validate({"name": "shimmed", "base": "debian:bookworm-slim", "python": "3.11",
                                "shim_files": {"/opt/app/run.py": "files/run.py"}})
    sif = tmp_path / "shimmed.sif"
    loaded = Loaded(spec=spec, path=sif, root=tmp_path, chain=[sif], embedded_in=sif)
    with pytest.raises(EnvportError, match="names them, not their bytes"):
        loaded.shim_bytes()
    files = [c for c in spec_checks(loaded, "0" * 64) if c.kind == "file"]
    assert [(c.key, c.expected, c.mode) for c in files] == [("/opt/app/run.py", "", None)]

"""Issue 37, an admin holding only a SIF in a folder with no project: U6, its weights verified and fetched with
`--sif FILE` from the spec the SIF embeds (the `source` command is the spec's own, run for real); U22, `verify`
writes no reports/ into that folder (its JUnit goes beside the ledger) and `ledger NAME` reads the runs made there.

The SIF is a small real build (lz4, seconds) whose spec pins one weight file its `source` writes. The admin's
folder is an empty tmp dir (no specs/); the weights root is a tmp dir too: nothing outside tmp_path changes.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from .sif_fixtures import build_sif, require_sif_tools
from .support import as_json, cli_env, copy_project, run_envport, write_site, write_spec

NAME = "tiny-weighted"
DATA = bytes(range(256)) * 16  # 4096 bytes the source writes
PIN = {"path": "tiny.bin", "size": len(DATA), "sha256": hashlib.sha256(DATA).hexdigest()}
SOURCE = ("python3 -c 'import os; open(os.path.join(os.environ[\"ENVPORT_WEIGHT_DIR\"], \"tiny.bin\"), \"wb\")"
          ".write(bytes(range(256)) * 16)'")


@pytest.fixture(scope="module")
def weighted_sif(base_image, tmp_path_factory):
    require_sif_tools()
    root = copy_project(tmp_path_factory.mktemp("weighted-project"))
    write_spec(root, NAME, weight_dirs={"tiny": {"path": "/weights/tiny", "env": "TINY_WEIGHTS", "source": SOURCE,
                                                 "files": [PIN]}})
    write_site(root, "sif-fast", apptainer={"compression": "lz4"})
    return build_sif(root, NAME, "sif-fast")


def _weights(admin, wroot, *args):
    proc = run_envport("weights", *args, "--root", str(wroot), "--json", root=admin, env=cli_env(), timeout=300)
    return proc, as_json(proc)["steps"][0]


def test_weights_verify_and_fetch_from_the_spec_a_sif_embeds(weighted_sif, tmp_path):
    admin, wroot = tmp_path / "admin", tmp_path / "weights"
    admin.mkdir()
    sif = str(weighted_sif.path)
    # Before: without --sif there is no spec here (what the admin met: exit 2, "no specs/ directory").
    before = run_envport("weights", "verify", NAME, "--root", str(wroot), root=admin, timeout=120)
    assert before.returncode == 2, before.stderr
    proc, step = _weights(admin, wroot, "verify", NAME, "--sif", sif)
    assert proc.returncode == 3 and step["reason"] == "weights_missing", step
    assert f"{wroot}/{NAME}/tiny/tiny.bin is absent" in step["lines"][0]
    proc, step = _weights(admin, wroot, "fetch", NAME, "--sif", sif)
    assert proc.returncode == 0 and step["verdict"] == "OK", (step, proc.stderr[-2000:])
    assert (wroot / NAME / "tiny" / "tiny.bin").read_bytes() == DATA
    proc, step = _weights(admin, wroot, "verify", NAME, "--sif", sif)
    assert proc.returncode == 0 and step["verdict"] == "present", step
    assert not (admin / "specs").exists()  # nothing of a project was made in the admin's folder


def test_weights_sif_names_the_env_it_holds(weighted_sif, tmp_path):
    admin = tmp_path / "admin"
    admin.mkdir()
    proc = run_envport("weights", "verify", "other-env", "--sif", str(weighted_sif.path), "--root",
                       str(tmp_path / "w"), root=admin, timeout=120)
    assert proc.returncode == 2 and f"embeds the spec of {NAME}, not other-env" in proc.stderr, proc.stderr


def test_an_admins_folder_gets_no_reports_and_its_ledger_reads_by_name(weighted_sif, tmp_path):
    admin, state = tmp_path / "admin", tmp_path / "state"
    admin.mkdir()
    env = cli_env(ENVPORT_STATE_DIR=str(state))
    proc = run_envport("verify", NAME, "--target", "apptainer", "--sif", str(weighted_sif.path), "--json",
                       root=admin, env=env, timeout=600)
    step = as_json(proc)["steps"][0]
    assert step["step"].startswith(f"verify {NAME}"), step
    assert sorted(p.name for p in admin.iterdir()) == [], "verify wrote into the admin's folder"
    junit = step["data"]["junit"]
    assert junit.startswith(str(state / "reports")) and junit.endswith(f"verify-{NAME}.xml"), junit
    assert Path(junit).is_file(), junit
    ledger = run_envport("ledger", NAME, "--json", root=admin, env=env, timeout=120)
    assert ledger.returncode == 0, ledger.stderr
    kinds = [r["kind"] for r in as_json(ledger)["records"]]
    assert "verify" in kinds, kinds
    docs = run_envport("ledger", NAME, "--write-docs", root=admin, env=env, timeout=120)
    assert docs.returncode == 2 and "in a project" in docs.stderr, docs.stderr


def test_a_witness_weight_fix_works_with_only_the_file(weighted_sif, tmp_path):
    """U6: witness --sif in the admin's folder with the weights absent: the weight check's fix names the file
    (`envport weights verify NAME --sif FILE`), and that very command runs there (exit 3: absent, not exit 2)."""
    import shlex

    admin = tmp_path / "admin"
    admin.mkdir()
    env = cli_env(ENVPORT_WEIGHTS_DIR=str(tmp_path / "weights"))
    proc = run_envport("witness", NAME, "--target", "apptainer", "--sif", str(weighted_sif.path), "--json",
                       root=admin, env=env, timeout=600)
    steps = as_json(proc)["steps"]
    fixes = [ln for s in steps for ln in s["lines"] if ln.startswith("fix: envport weights verify")]
    assert fixes, steps
    verify = fixes[0].removeprefix("fix: ").split(", then ")[0]
    assert f"--sif {weighted_sif.path}" in verify, verify
    ran = run_envport(*shlex.split(verify)[1:], "--json", root=admin, env=env, timeout=300)
    assert ran.returncode == 3 and as_json(ran)["steps"][0]["reason"] == "weights_missing", ran.stdout + ran.stderr

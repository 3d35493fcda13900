"""`envport verify NAME --target apptainer`: the spec's checks inside a real SIF, without apptainer.

Commands run through a testinfra backend of envport's own (verify/sif.py): ch-run on the SIF
mounted with squashfuse (apptainer exec where it is installed; not here).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from .sif_fixtures import BuiltSif, sif_env
from .support import as_json, fail_with, run_envport

pytest_plugins = ["tests.sif_fixtures"]


def _verify(built: BuiltSif, name: str, *extra: str, env: dict | None = None):
    args = ["verify", name, "--target", "apptainer", "--json", "--junit", str(built.root / f"verify-{name}.xml"),
            *extra] + (["--site", built.site] if built.site else [])
    return run_envport(*args, root=built.root, env=env or sif_env(), timeout=600)


def _sif_mounts(under: Path) -> list[str]:
    """The SIF mounts under UNDER: the run's own TMPDIR, so another test's mount (the other xdist worker's)
    is never taken for one this run left."""
    with open("/proc/self/mountinfo") as fh:
        return [ln.split()[4] for ln in fh if ln.split()[4].startswith(f"{under}/envport-sif-")]


def test_demo_sif_passes_every_spec_check(demo_sif: BuiltSif, tmp_path: Path):
    proc = _verify(demo_sif, "demo-cpu", env=sif_env(TMPDIR=str(tmp_path)))
    assert proc.returncode == 0, fail_with(proc, "verify demo-cpu --target apptainer")
    step = as_json(proc)["steps"][0]
    outcomes = {c["id"]: c["outcome"] for c in step["data"]["checks"]}
    assert set(outcomes.values()) == {"passed"}, outcomes
    kinds = {i.split("[", 1)[0] for i in outcomes}
    assert kinds >= {"pip", "python", "env", "file", "weight", "label"}, kinds
    assert step["data"]["runtime"] == ("apptainer" if shutil.which("apptainer") else "ch-run")
    assert _sif_mounts(tmp_path) == [], "verify left the SIF mounted"
    assert not list(tmp_path.glob("envport-sif-*")), "verify left its mount folder"


def test_system_package_installed_by_apt_in_post_is_found(jq_sif: BuiltSif):
    proc = _verify(jq_sif, "tiny-jq")
    assert proc.returncode == 0, fail_with(proc, "verify tiny-jq")
    outcomes = {c["id"]: c["outcome"] for c in as_json(proc)["steps"][0]["data"]["checks"]}
    assert outcomes["system[jq]"] == "passed", outcomes


def test_sif_without_a_package_fails_exactly_that_check(tiny_sif: BuiltSif, jq_sif: BuiltSif):
    # tiny-sif is tiny-jq with jq dropped: verifying tiny-jq's spec against it.
    proc = _verify(jq_sif, "tiny-jq", "--sif", str(tiny_sif.path))
    assert proc.returncode == 1, fail_with(proc, "verify tiny-jq --sif tiny-sif")
    checks = as_json(proc)["steps"][0]["data"]["checks"]
    failed = [c["id"] for c in checks if c["outcome"] == "failed"]
    assert failed == ["system[jq]"], checks
    assert {c["id"]: c["outcome"] for c in checks}["label[envport.hash]"] == "skipped"


def test_sif_contradicting_an_edited_pin_fails_exactly_that_check(tiny_sif: BuiltSif, tmp_path: Path):
    # tiny-sif was built with six==1.16.0; its spec is then edited to pin six==1.15.0 (in a copy of the
    # project: the session's spec stays as built) and the same SIF verified against it.
    from .support import copy_project, write_site, write_spec

    root = copy_project(tmp_path / "edited")
    write_site(root, "sif-fast", apptainer={"compression": "lz4"})
    write_spec(root, "tiny-sif", pip_phases=[["six==1.15.0"]])
    proc = run_envport("verify", "tiny-sif", "--target", "apptainer", "--site", "sif-fast", "--sif",
                       str(tiny_sif.path), "--json", "--junit", str(tmp_path / "verify.xml"), root=root,
                       env=sif_env(), timeout=600)
    assert proc.returncode == 1, fail_with(proc, "verify tiny-sif (six pinned 1.15.0) --sif the 1.16.0 SIF")
    checks = as_json(proc)["steps"][0]["data"]["checks"]
    failed = [c for c in checks if c["outcome"] == "failed"]
    assert [c["id"] for c in failed] == ["pip[six==1.15.0]"], checks
    assert "six 1.16.0 is installed" in failed[0]["message"] and "==1.15.0" in failed[0]["message"], failed[0]


def test_missing_sif_is_refused_with_the_build_command(sif_project: Path):
    from .support import write_spec

    write_spec(sif_project, "tiny-unbuilt")
    proc = run_envport("verify", "tiny-unbuilt", "--target", "apptainer", "--json", root=sif_project,
                       env=sif_env(), timeout=120)
    assert proc.returncode == 3
    step = as_json(proc)["steps"][0]
    assert step["reason"] == "sif_missing" and "envport build tiny-unbuilt --target apptainer" in step["lines"][0]


def test_without_ch_run_refused_naming_the_package(tiny_sif: BuiltSif, tmp_path: Path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("squashfuse", "fusermount"):
        if shutil.which(tool):
            os.symlink(shutil.which(tool), bin_dir / tool)
    proc = _verify(tiny_sif, "tiny-sif", env=sif_env(PATH=str(bin_dir), ENVPORT_SIF_RUNTIME="ch-run"))
    assert proc.returncode == 3, fail_with(proc, "verify without ch-run")
    step = as_json(proc)["steps"][0]
    assert step["reason"] == "missing_tool" and "charliecloud-runtime" in step["lines"][0]

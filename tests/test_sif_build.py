"""`envport build NAME --target apptainer` with envport's own .def builder (no apptainer here).

Real parts: the docker engine (base rootfs), bubblewrap (%post), mksquashfs, Debian's siftool
(reads what the builder wrote), squashfuse (mounts it). SIFs come from tests/sif_fixtures.py,
built once a session. The apptainer route itself cannot run here: its test skips with that reason.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from envport.builders.apptainer.builder import present
from envport.sif.format import SPEC_OBJECT
from envport.sif.format import primary_partition, read_json_object, read_object, read_sif, sif_labels
from envport.plan.site import Site, apply_site, load_site
from envport.plan.steps import make_plan
from envport.renderers import render_target
from envport.spec.loader import load_spec

from .sif_fixtures import BuiltSif, require_sif_tools, sif_env
from .support import REPO, as_json, fail_with, run_envport, write_spec

pytest_plugins = ["tests.sif_fixtures"]


# --- the .def as a real apptainer needs it ---------------------------------------------------


def _def(name: str, site: Site | None = None, root: Path = REPO) -> str:
    loaded = load_spec(name, root)
    plan = make_plan(loaded)
    if site is not None:
        plan = apply_site(plan, site)
    return render_target("apptainer", plan, "0" * 64)[f"{name}.def"]


def test_local_base_bootstraps_from_the_docker_daemon_and_registry_base_from_docker():
    assert "\nBootstrap: docker-daemon\nFrom: envport/debian-bookworm:base\n" in _def("demo-cpu")
    gpu = load_spec("proteomics-gpu", REPO).spec.base
    assert f"\nBootstrap: docker\nFrom: {gpu}\n" in _def("proteomics-gpu")


def test_site_without_registry_bootstraps_every_base_locally_or_from_a_localimage():
    gpu = load_spec("proteomics-gpu", REPO).spec.base
    local = load_site("local", REPO)
    assert f"\nBootstrap: docker-daemon\nFrom: {gpu}\n" in _def("proteomics-gpu", local)
    sif_site = local.model_copy(update={"apptainer": local.apptainer.model_copy(update={
        "local_bootstrap": "localimage", "local_images": {gpu: "/srv/sif/cuda.sif"}})})
    assert "\nBootstrap: localimage\nFrom: /srv/sif/cuda.sif\n" in _def("proteomics-gpu", sif_site)


def test_build_inputs_live_outside_tmp_and_are_removed_at_the_end_of_post():
    text = _def("demo-cpu", load_site("local", REPO))
    assert "/tmp" not in text
    assert '"wheelhouse" "/opt/envport-build/wheelhouse"' in text
    assert '"ca-bundle.crt" "/opt/envport-build/ca-bundle.crt"' in text
    assert "--find-links /opt/envport-build/wheelhouse" in text
    post = text.split("%post\n", 1)[1]
    assert post.rstrip().splitlines()[-3].strip() == "rm -rf /opt/envport-build", post
    assert "/bin/sh -ex" in post.splitlines()[0]


def test_portable_def_without_build_inputs_removes_nothing():
    assert "envport-build" not in _def("demo-cpu")


# --- demo-cpu's SIF ------------------------------------------------------------------------


def test_siftool_lists_what_apptainer_writes(demo_sif: BuiltSif):
    out = subprocess.run(["siftool", "list", str(demo_sif.path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    rows = [[c.strip() for c in ln.split("|")] for ln in out.stdout.splitlines() if ln[:1].isdigit()]
    assert [(r[1], r[4]) for r in rows] == [("1", "Def.FILE"), ("1", "JSON.Generic"), ("1", "JSON.Generic"),
                                             ("1", "FS (Squashfs/*System/amd64)"),
                                             # envport's one addition (issue 22): the CycloneDX SBOM,
                                             # in SIF's own SBOM data type, after the partition.
                                             ("1", "SBOM (cyclonedx-json)")], out.stdout
    info = read_sif(demo_sif.path)
    assert [d.name for d in info.descriptors[1:3]] == ["inspect-metadata.json", SPEC_OBJECT]
    assert primary_partition(info).offset % 4096 == 0


def test_def_object_is_the_rendered_def_and_metadata_agrees_with_the_squashfs(demo_sif: BuiltSif, tmp_path):
    info = read_sif(demo_sif.path)
    deffile = read_object(info, info.find(name="")).decode()
    assert "\nBootstrap: docker-daemon\n" in deffile and f"envport.hash {demo_sif.hash}" in deffile
    meta = read_json_object(info, "inspect-metadata.json")["data"]["attributes"]
    assert meta["deffile"] == deffile.rstrip("\n")
    assert meta["labels"]["envport.hash"] == demo_sif.hash
    assert "export DEMO_GREETING='hello from demo-cpu'" in meta["environment"][
        "/.singularity.d/env/90-environment.sh"]
    spec = read_json_object(info, SPEC_OBJECT)
    assert spec["hash"] == demo_sif.hash and spec["spec"]["name"] == "demo-cpu"
    part = primary_partition(info)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["squashfuse", "-o", f"offset={part.offset}", str(demo_sif.path), str(mnt)], check=True,
                   timeout=60)
    try:
        labels = json.loads((mnt / ".singularity.d" / "labels.json").read_text())
        assert labels == meta["labels"]
        assert (mnt / ".singularity.d" / "Singularity").read_text().rstrip("\n") == meta["deffile"]
        assert not (mnt / "opt" / "envport-build").exists(), "build inputs left in the image"
        assert (mnt / "opt" / "demo" / "run.py").is_file() and (mnt / "weights" / "tiny").is_dir()
        assert not (mnt / ".post.script").exists() and not (mnt / ".dockerenv").exists()
    finally:
        subprocess.run(["fusermount", "-u", str(mnt)], timeout=60)


def test_progress_names_every_post_step_in_order(demo_sif: BuiltSif):
    if demo_sif.result["steps"][-1]["verdict"] == "present":
        pytest.skip("the SIF was present: no %post ran in this session's build")
    steps = [ln.split("%post step ", 1)[1].split(" ", 1)[0] for ln in demo_sif.stderr.splitlines()
             if "%post step " in ln]
    total = int(steps[0].split("/")[1])
    assert steps == [f"{i}/{total}" for i in range(1, total + 1)]


def test_second_build_is_present_by_its_labels(demo_sif: BuiltSif):
    proc = run_envport("build", "demo-cpu", "--target", "apptainer", "--json", root=demo_sif.root, env=sif_env())
    assert proc.returncode == 0, fail_with(proc, "second build")
    last = as_json(proc)["steps"][-1]
    assert last["verdict"] == "present" and last["data"]["sif"] == str(demo_sif.path)


def test_present_only_when_the_labels_carry_the_hash(tiny_sif: BuiltSif, tmp_path):
    assert present(tiny_sif.path, tiny_sif.hash)["sif"] == str(tiny_sif.path)
    assert present(tiny_sif.path, "0" * 64) is None
    cut = tmp_path / tiny_sif.path.name
    with open(tiny_sif.path, "rb") as src, open(cut, "wb") as dst:
        dst.write(src.read(100_000))
    assert present(cut, tiny_sif.hash) is None
    assert sif_labels(read_sif(tiny_sif.path))["envport.name"] == "tiny-sif"


# --- faults ---------------------------------------------------------------------------------


def _work_dirs(name: str) -> list[Path]:
    return sorted(Path("/dev/shm").glob(f"envport-sif-{name}-*")) + sorted(
        Path("/tmp").glob(f"envport-sif-{name}-*"))


def test_failing_post_names_the_step_and_tail_and_writes_no_sif(base_image, sif_project: Path):
    require_sif_tools()
    write_spec(sif_project, "tiny-fail", run_commands=["echo about to fail", "false"])
    proc = run_envport("build", "tiny-fail", "--target", "apptainer", "--site", "sif-fast", "--json",
                       root=sif_project, env=sif_env())
    assert proc.returncode == 1, fail_with(proc, "failing build")
    last = as_json(proc)["steps"][-1]
    assert last["verdict"] == "FAILED"
    assert "%post exited 1 in step" in last["detail"] and "run commands (2)" in last["detail"], last
    assert "+ false" in last["lines"] and "about to fail" in last["lines"]
    assert not list((sif_project / ".cache" / "sif").glob("tiny-fail-*")), "a SIF (or partial) was left"
    assert not _work_dirs("tiny-fail"), "the failed rootfs was left behind"


def test_sigkill_mid_build_leaves_no_sif_and_the_next_run_builds(base_image, sif_project: Path):
    require_sif_tools()
    write_spec(sif_project, "tiny-kill")
    # Killed while the local site's (zstd) squashfs is written (envport's writer; mksquashfs for lz4 and the
    # others), rebuilt with lz4: same hash, same SIF name.
    proc = subprocess.Popen([sys.executable, "-m", "envport", "-C", str(sif_project), "build", "tiny-kill",
                             "--target", "apptainer"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=sif_env())
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if "squashfs" in line:
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "".join(seen)
    sif_dir = sif_project / ".cache" / "sif"
    assert not list(sif_dir.glob("tiny-kill-*.sif")), "a SIF appeared under its final name"
    deadline = time.monotonic() + 30
    while _squashers("tiny-kill") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _squashers("tiny-kill"), "mksquashfs outlived the killed builder"
    again = run_envport("build", "tiny-kill", "--target", "apptainer", "--site", "sif-fast", "--json",
                        root=sif_project, env=sif_env())
    assert again.returncode == 0, fail_with(again, "build after SIGKILL")
    assert as_json(again)["steps"][-1]["verdict"] == "OK"
    assert "never reused" in again.stderr
    assert len(list(sif_dir.glob("tiny-kill-*.sif"))) == 1 and not list(sif_dir.glob(".tiny-kill-*partial*"))
    assert not _work_dirs("tiny-kill")


def _squashers(name: str) -> list[str]:
    out = subprocess.run(["pgrep", "-af", f"mksquashfs .*envport-sif-{name}-"], capture_output=True, text=True)
    return out.stdout.splitlines()


def test_no_engine_and_no_local_base_is_refused_with_the_fix(sif_project: Path):
    require_sif_tools()
    write_spec(sif_project, "tiny-noengine")
    proc = run_envport("build", "tiny-noengine", "--target", "apptainer", root=sif_project,
                       env=sif_env(DOCKER_HOST="unix:///nonexistent/docker.sock"))
    assert proc.returncode == 3, fail_with(proc, "build without an engine")
    assert "Traceback" not in proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("REFUSED  sif"))
    assert "[base_image_missing]" in line and "no docker engine answers" in line
    assert "`envport base debian-bookworm`" in line


def test_missing_base_names_it_and_the_site_profile_fix(docker_client, sif_project: Path):
    write_spec(sif_project, "tiny-nobase", base="envport/never-built:1")
    proc = run_envport("build", "tiny-nobase", "--target", "apptainer", root=sif_project, env=sif_env())
    assert proc.returncode == 3 and "Traceback" not in proc.stderr, fail_with(proc, "missing base")
    assert "envport/never-built:1" in proc.stdout and "sites/local.yaml" in proc.stdout


def test_proteomics_gpu_ends_in_one_refused_line(docker_client, project: Path):
    proc = run_envport("build", "proteomics-gpu", "--target", "apptainer", root=project, env=sif_env())
    assert proc.returncode == 3 and "Traceback" not in proc.stderr, fail_with(proc, "proteomics-gpu")
    base = load_spec("proteomics-gpu", project).spec.base
    refused = [ln for ln in proc.stdout.splitlines() if ln.startswith("REFUSED  sif")]
    assert len(refused) == 1 and base in refused[0] and "sites/local.yaml" in refused[0], proc.stdout
    assert "wheelhouse" not in proc.stderr, "a wheelhouse was fetched for a base that is not here"


def test_without_bwrap_refused_naming_the_package(sif_project: Path, tmp_path: Path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if shutil.which("mksquashfs"):
        os.symlink(shutil.which("mksquashfs"), bin_dir / "mksquashfs")
    write_spec(sif_project, "tiny-nobwrap")
    proc = run_envport("build", "tiny-nobwrap", "--target", "apptainer", root=sif_project,
                       env=sif_env(PATH=str(bin_dir)))
    assert proc.returncode == 3, fail_with(proc, "build without bwrap")
    assert "[missing_tool]" in proc.stdout and "apt-get install bubblewrap" in proc.stdout


def test_apptainer_route_builds_with_the_binary(sif_project: Path):
    if not (shutil.which("apptainer") or shutil.which("singularity")):
        pytest.skip("apptainer not installed (no Debian 12 package): the apptainer route cannot run here")
    proc = run_envport("build", "tiny-sif", "--target", "apptainer", "--rebuild", "--json", root=sif_project)
    assert proc.returncode == 0, fail_with(proc, "apptainer build")
    assert as_json(proc)["steps"][-1]["data"]["route"] == "apptainer"


def test_localimage_bootstrap_from_a_sif(tiny_sif: BuiltSif, sif_project: Path):
    from .support import write_site

    site = write_site(sif_project, "sif-local", apptainer={
        "compression": "lz4", "local_bootstrap": "localimage",
        "local_images": {"envport/debian-bookworm:base": str(tiny_sif.path)}})
    write_spec(sif_project, "tiny-local", env={"LOCAL_BASE": "from a SIF"})
    proc = run_envport("build", "tiny-local", "--target", "apptainer", "--site", site, "--json", root=sif_project,
                       env=sif_env(), timeout=900)
    assert proc.returncode == 0, fail_with(proc, "build from a localimage")
    last = as_json(proc)["steps"][-1]
    assert last["data"]["base"] == f"localimage {tiny_sif.path}"
    info = read_sif(last["data"]["sif"])
    deffile = read_object(info, info.find(name="")).decode()
    assert f"\nBootstrap: localimage\nFrom: {tiny_sif.path}\n" in deffile
    env = read_json_object(info, "inspect-metadata.json")["data"]["attributes"]["environment"]
    assert "export LOCAL_BASE='from a SIF'" in env["/.singularity.d/env/90-environment.sh"]


def test_from_docker_makes_the_same_layout_from_the_built_image(docker_client, base_image, sif_project: Path,
                                                                throwaway_images):
    require_sif_tools()
    write_spec(sif_project, "tiny-fromdocker")
    throwaway_images.append("tiny-fromdocker")
    docker = run_envport("build", "tiny-fromdocker", "--target", "docker", "--site", "sif-fast", root=sif_project,
                         env=sif_env())
    assert docker.returncode == 0, fail_with(docker, "docker build")
    proc = run_envport("build", "tiny-fromdocker", "--target", "apptainer", "--from-docker", "--site", "sif-fast",
                       "--json", root=sif_project, env=sif_env())
    assert proc.returncode == 0, fail_with(proc, "build --from-docker")
    last = as_json(proc)["steps"][-1]
    assert last["data"]["base"].startswith("docker-daemon envport/tiny-fromdocker:")
    info = read_sif(last["data"]["sif"])
    labels = sif_labels(info)
    assert labels["envport.name"] == "tiny-fromdocker" and present(Path(last["data"]["sif"]), labels["envport.hash"])
    env = read_json_object(info, "inspect-metadata.json")["data"]["attributes"]["environment"]
    assert 'TINY_GREETING="${TINY_GREETING:-"hello from tiny"}"' in env["/.singularity.d/env/10-docker2singularity.sh"]
    inspect = run_envport("inspect", last["data"]["sif"], "--site", "sif-fast", root=sif_project)
    assert inspect.returncode == 0 and "matches specs/tiny-fromdocker.yaml" in inspect.stdout, inspect.stdout

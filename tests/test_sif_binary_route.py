"""The apptainer-binary route of `envport build NAME --target apptainer` (builders/apptainer/binary.py) embeds
the CycloneDX SBOM of what apptainer wrote, read from the SIF's own partition, before the SIF gets its name.

No apptainer can be installed here (there is no apptainer package for Debian 12), so the `apptainer` first
on PATH is a FAKE: a mock of apptainer's CLI only, `apptainer build --force [--fakeroot] OUT SOURCE`, that
makes a REAL SIF with real tools: mksquashfs of a small rootfs folder this test prepares (two Debian
packages in var/lib/dpkg/status, two Python distributions in the env's venv at CONTAINER_VENV), then
`siftool new OUT` and `siftool add` of that squashfs as the primary system partition. Everything after it
(mounting the partition, the SBOM, the SIF object, the rename, signing) is envport's real code.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from envport.sif.format import read_object, read_sif
from envport.plan.site import load_site
from envport.plan.steps import CONTAINER_VENV
from envport.recipe.identity import resolve
from envport.sif import sbom
from envport.sif.image import read_raw
from envport.sif.keys import load_public_key
from envport.sif.verify import check_signatures
from envport.spec.loader import load_spec

from .support import as_json, cli_env, fail_with, missing, run_envport, write_site, write_spec
from .test_sbom import STATUS
from .test_sif_sign import new_key

TOOLS = {"mksquashfs": "squashfs-tools", "siftool": "siftool", "squashfuse": "squashfuse", "fusermount3": "fuse3"}
DISTS = {"six": "1.16.0", "packaging": "24.1"}
# STATUS: test_sbom's dpkg status (adduser and libc6 installed, `gone` deinstalled), written once.
# The mock: only `build --force [--fakeroot] OUT SOURCE`; FAKE_ROOTFS is squashed into OUT's primary
# partition, or with FAKE_PARTITION=garbage bytes that are no squashfs are. Its argv goes to FAKE_LOG.
FAKE_APPTAINER = r"""#!/bin/sh
set -eu
echo "$*" >> "$FAKE_LOG"
[ -z "${FAKE_CONTEXT_LOG-}" ] || find . | sort > "$FAKE_CONTEXT_LOG"   # the build context it was given
[ "$1" = build ] && [ "$2" = --force ] || { echo "fake apptainer: only 'build --force' is mocked" >&2; exit 2; }
shift 2
[ "$1" != --fakeroot ] || shift
out=$1 source=$2
case "$source" in
  docker-daemon://*) ;;
  *) [ -f "$source" ] || { echo "FATAL: $source: no such file" >&2; exit 255; } ;;
esac
tmp=$(mktemp -d)
if [ "${FAKE_PARTITION-}" = garbage ]; then
  yes 'not a squashfs' | head -c 65536 > "$tmp/part"
else
  mksquashfs "$FAKE_ROOTFS" "$tmp/part" -noappend -comp gzip -quiet -no-progress >/dev/null
fi
rm -f "$out"
siftool new "$out"
siftool add --datatype 4 --parttype 2 --partfs 1 --partarch 2 --groupid 1 "$out" "$tmp/part"
rm -rf "$tmp"
"""


def _rootfs(root: Path) -> Path:
    (root / "var/lib/dpkg").mkdir(parents=True)
    (root / "var/lib/dpkg/status").write_text(STATUS)
    (root / "etc").mkdir()
    (root / "etc/os-release").write_text('ID=debian\nVERSION_ID="12"\n')
    venv = root / CONTAINER_VENV.lstrip("/")
    venv.mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    for name, version in DISTS.items():
        dist = venv / "lib/python3.11/site-packages" / f"{name}-{version}.dist-info"
        dist.mkdir(parents=True)
        (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\n")
    return root


def _expected_purls() -> set[str]:
    """The two installed packages of STATUS (not `gone`) and the two distributions, spelled out (a purl
    percent-encodes the version's `+`)."""
    return {"pkg:deb/debian/adduser@3.134?arch=all&distro=debian-12",
            "pkg:deb/debian/libc6@2.36-9%2Bdeb12u4?arch=amd64&distro=debian-12",
            "pkg:pypi/packaging@24.1", "pkg:pypi/six@1.16.0"}


@pytest.fixture
def fake(project: Path, tmp_path: Path):
    """A project with spec `tiny-bin` and site `plain` (no wheelhouse: the route copies none), and the env
    whose PATH starts with the fake apptainer; ENVPORT_SIF_BUILDER unset, so the binary route is taken."""
    absent = [f"{t} ({p})" for t, p in TOOLS.items() if shutil.which(t) is None]
    if absent:
        missing(f"tools not installed: {', '.join(absent)}; apt-get install {' '.join(sorted(set(TOOLS.values())))}")
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir()
    (bin_dir / "apptainer").write_text(FAKE_APPTAINER)
    (bin_dir / "apptainer").chmod(0o755)
    write_spec(project, "tiny-bin")
    write_site(project, "plain", wheelhouse=False)
    env = cli_env(PATH=f"{bin_dir}:{os.environ['PATH']}", FAKE_ROOTFS=str(_rootfs(tmp_path / "rootfs")),
                  FAKE_LOG=str(tmp_path / "apptainer.log"), TMPDIR=str(_mkdir(tmp_path / "tmp")))
    env.pop("ENVPORT_SIF_BUILDER", None)
    return env


def _mkdir(path: Path) -> Path:
    path.mkdir()
    return path


def _build(project: Path, env: dict, *extra: str, site: str = "plain"):
    return run_envport("build", "tiny-bin", "--target", "apptainer", "--site", site, "--json", *extra,
                       root=project, env=env, timeout=300)


def _sbom_object(path: Path) -> dict:
    info = read_sif(path)
    found = [d for d in info.descriptors if d.datatype == sbom.SBOM_DATATYPE]
    assert len(found) == 1, [(d.id, d.datatype_name, d.name) for d in info.descriptors]
    assert found[0].name == sbom.SBOM_NAME
    return json.loads(read_object(info, found[0]))


def _leftovers(sif_dir: Path) -> list[str]:
    return sorted(p.name for p in sif_dir.iterdir()) if sif_dir.is_dir() else []


def test_the_binary_route_embeds_the_sbom_of_what_apptainer_wrote(project: Path, fake: dict, tmp_path: Path):
    proc = _build(project, fake)
    assert proc.returncode == 0, fail_with(proc, "build with the fake apptainer")
    log = (tmp_path / "apptainer.log").read_text()
    assert log.startswith("build --force ") and log.rstrip().endswith(" tiny-bin.def"), log  # it was called
    last = as_json(proc)["steps"][-1]
    assert last["verdict"] == "OK" and last["data"]["route"] == "apptainer", last
    sif = Path(last["data"]["sif"])
    assert sif.is_file() and sif.name.startswith("tiny-bin-") and sif.suffix == ".sif", sif
    assert _leftovers(sif.parent) == [sif.name]  # no partial left beside it
    doc = _sbom_object(sif)
    assert {c["purl"] for c in doc["components"]} == _expected_purls(), doc["components"]
    assert last["data"]["sbom_components"] == 4 == len(doc["components"])
    props = {p["name"]: p["value"] for p in doc["metadata"]["properties"]}
    hash_ = resolve(load_spec("tiny-bin", project), load_site("plain", project), "apptainer").hash
    assert props["envport:name"] == "tiny-bin" and props["envport:hash"] == hash_, props
    assert props["envport:target"] == "apptainer"
    assert f"SBOM: 4 components (CycloneDX, SIF object {sbom.SBOM_NAME})" in proc.stderr
    # `envport sbom FILE.sif` reads the same partition and finds the same packages
    again = run_envport("sbom", str(sif), "--from-content", root=project, env=fake, timeout=120)
    assert again.returncode == 0, fail_with(again, "envport sbom FILE.sif")
    assert {c["purl"] for c in json.loads(again.stdout)["components"]} == _expected_purls()


def test_a_site_with_a_wheelhouse_has_it_made_before_apptainer_is_given_it(project: Path, fake: dict,
                                                                            tmp_path: Path):
    """`wheelhouse: true` and no wheelhouse yet: the route makes it (real pip downloads) and hands it to
    apptainer in the build context, as envport's own builder does; it never copies a folder that is not there."""
    from envport.recipe.render import WHEELHOUSE_CONTEXT_NAME

    write_site(project, "wheels", wheelhouse=True)
    assert not load_site("wheels", project).wheelhouse_path(project, "tiny-bin").exists()
    proc = _build(project, {**fake, "FAKE_CONTEXT_LOG": str(tmp_path / "context.log")}, site="wheels")
    assert proc.returncode == 0, fail_with(proc, "build with a wheelhouse site")
    steps = as_json(proc)["steps"]
    assert [s["step"] for s in steps][-2:][0] == "wheelhouse" and steps[-2]["verdict"] == "OK", steps
    assert steps[-1]["verdict"] == "OK" and steps[-1]["data"]["route"] == "apptainer", steps[-1]
    context = (tmp_path / "context.log").read_text().splitlines()
    assert any(line.startswith(f"./{WHEELHOUSE_CONTEXT_NAME}/six-1.16.0-") and line.endswith(".whl")
               for line in context), context
    again = _build(project, fake, "--rebuild", site="wheels")  # made once: the next build finds it
    assert again.returncode == 0 and as_json(again)["steps"][-2]["verdict"] == "present", fail_with(again, "again")


def test_a_partition_that_cannot_be_read_fails_the_build_and_leaves_no_sif(project: Path, fake: dict):
    proc = _build(project, {**fake, "FAKE_PARTITION": "garbage"})
    assert proc.returncode == 1, fail_with(proc, "build with an unreadable partition")
    last = as_json(proc)["steps"][-1]
    assert last["verdict"] == "FAILED" and last.get("reason") == "sbom_unreadable", last
    assert "SBOM" in last["detail"] and "no SIF was written" in last["detail"], last
    assert any(line.startswith("fix: ") for line in last["lines"]), last
    sif_dir = load_site("plain", project).apptainer.sif_path(project)
    assert not any(name.endswith(".sif") or ".partial-" in name for name in _leftovers(sif_dir)), \
        _leftovers(sif_dir)


def test_without_mount_tools_the_build_fails_naming_what_to_install(project: Path, fake: dict, tmp_path: Path):
    """No squashfuse, fusermount or mount on PATH (only what the fake and envport start): the partition
    cannot be mounted, the build fails naming the packages, and no SIF is left."""
    bare = _mkdir(tmp_path / "bare-bin")
    for tool in ("sh", "bash", "mktemp", "rm", "mksquashfs", "siftool", "cat", "uname", "id"):
        if shutil.which(tool):
            os.symlink(shutil.which(tool), bare / tool)
    fake_bin = fake["PATH"].split(":", 1)[0]
    proc = _build(project, {**fake, "PATH": f"{fake_bin}:{bare}"})
    assert proc.returncode == 1, fail_with(proc, "build without mount tools")
    last = as_json(proc)["steps"][-1]
    assert last["verdict"] == "FAILED" and last["reason"] == "sbom_unreadable", last
    assert "fix: install squashfuse and fuse3 (apt-get install squashfuse fuse3)" in last["lines"][0], last
    sif_dir = load_site("plain", project).apptainer.sif_path(project)
    assert not any(name.endswith(".sif") or ".partial-" in name for name in _leftovers(sif_dir)), \
        _leftovers(sif_dir)


def test_build_sign_signs_after_the_sbom_under_a_site_that_requires_signatures(project: Path, fake: dict,
                                                                              tmp_path: Path):
    """A site with trust.require_signed: the partial (this build's own, unsigned yet) is still read for its
    SBOM, and `--sign` signs afterwards, so the signature covers the SBOM object."""
    priv, pub = new_key(tmp_path, "ed25519")
    write_site(project, "plain", wheelhouse=False, trust={"keys": [str(pub)], "require_signed": True})
    proc = _build(project, fake, "--sign", str(priv))
    assert proc.returncode == 0, fail_with(proc, "build --sign with the fake apptainer")
    steps = as_json(proc)["steps"]
    assert [s["verdict"] for s in steps[-2:]] == ["OK", "OK"] and steps[-1]["step"].startswith("sign "), steps
    sif = Path(steps[-2]["data"]["sif"])
    report = check_signatures(sif, [load_public_key(pub)])
    assert report.ok, report.problems
    sbom_ids = [d.id for d in read_raw(sif).descriptors if d.datatype == sbom.SBOM_DATATYPE]
    assert len(sbom_ids) == 1 and sbom_ids[0] in report.signatures[0].objects, (sbom_ids, report.signatures)
    assert {c["purl"] for c in _sbom_object(sif)["components"]} == _expected_purls()


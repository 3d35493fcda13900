"""`envport sbom`: the SBOM of a built env read from its content, compared with what the env's own tools
say inside it (`pip list`, `dpkg-query -W`): a venv, a docker image, a SIF (small specs: six only)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from envport.sif import sbom

from .registry_fixture import SITE, SMALL, small_project, small_sif  # noqa: F401 (fixtures)
from .support import as_json, fail_with, missing, run_envport

PIP_LIST = ["python", "-m", "pip", "list", "--format", "json", "--disable-pip-version-check"]
DPKG_QUERY = ["dpkg-query", "-W", "-f", "${Package}\t${Version}\t${db:Status-Status}\n"]


def _validate(text: str) -> dict:
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(text) is None
    return json.loads(text)


def _components(doc: dict, kind: str) -> set[tuple[str, str]]:
    return {(c["name"], c["version"]) for c in doc["components"] if c["purl"].startswith(f"pkg:{kind}/")}


def _pip(out: str) -> set[tuple[str, str]]:
    return {(d["name"], d["version"]) for d in json.loads(out)}


def _dpkg(out: str) -> set[tuple[str, str]]:
    rows = [line.split("\t") for line in out.splitlines() if line]
    return {(name, version) for name, version, status in rows if status == "installed"}


# --- the reader, on trees made here -------------------------------------------------------

STATUS = """Package: adduser
Status: install ok installed
Architecture: all
Version: 3.134
Description: add and remove users
 continuation line: Version: 9.9

Package: gone
Status: deinstall ok config-files
Architecture: amd64
Version: 1.0

Package: libc6
Status: install ok installed
Architecture: amd64
Multi-Arch: same
Version: 2.36-9+deb12u4
"""


def _dist(site: Path, dirname: str, name: str, version: str) -> None:
    (site / dirname).mkdir(parents=True)
    (site / dirname / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\nbody\n")


def test_reads_installed_debian_packages_and_the_venvs_distributions(tmp_path: Path):
    (tmp_path / "var/lib/dpkg").mkdir(parents=True)
    (tmp_path / "var/lib/dpkg/status").write_text(STATUS)
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/os-release").write_text('ID=debian\nVERSION_ID="12"\n')
    venv = tmp_path / "opt/envport/venv"
    (venv).mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    site = venv / "lib/python3.11/site-packages"
    _dist(site, "six-1.16.0.dist-info", "six", "1.16.0")
    _dist(site, "Typing_Extensions-4.0.dist-info", "Typing_Extensions", "4.0")
    (site / "notes.dist-info").mkdir()  # no METADATA: not a distribution
    # Debian's own python3-pip: a deb component, not the env's distribution.
    _dist(tmp_path / "usr/lib/python3/dist-packages", "pip-23.0.1.dist-info", "pip", "23.0.1")
    got = sbom.read_tree(tmp_path)
    assert [p.purl for p in got] == [
        "pkg:deb/debian/adduser@3.134?arch=all&distro=debian-12",
        "pkg:deb/debian/libc6@2.36-9%2Bdeb12u4?arch=amd64&distro=debian-12",
        "pkg:pypi/six@1.16.0",
        "pkg:pypi/typing-extensions@4.0",
    ]
    facts = sbom.EnvFacts("tiny", "ab" * 32, "docker", lock="specs/tiny.lock sha256:00")
    doc = _validate(sbom.to_json(sbom.build_bom(got, facts)))
    props = {p["name"]: p["value"] for p in doc["metadata"]["properties"]}
    assert props["envport:hash"] == "ab" * 32 and props["envport:lock"] == "specs/tiny.lock sha256:00"
    assert doc["metadata"]["component"]["name"] == "tiny" and doc["specVersion"] == "1.6"
    # Deterministic: the same tree gives the same bytes (serial number included).
    assert sbom.make_sbom(tmp_path, facts) == sbom.make_sbom(tmp_path, facts)


def test_without_envports_venv_the_system_site_packages_are_read(tmp_path: Path):
    _dist(tmp_path / "usr/lib/python3/dist-packages", "pip-23.0.1.dist-info", "pip", "23.0.1")
    _dist(tmp_path / "usr/local/lib/python3.11/site-packages", "six-1.16.0.dist-info", "six", "1.16.0")
    assert [p.purl for p in sbom.read_tree(tmp_path)] == ["pkg:pypi/pip@23.0.1", "pkg:pypi/six@1.16.0"]


def test_symlinks_in_the_tree_are_not_followed_out_of_it(tmp_path: Path):
    # An image's var/lib/dpkg/status (or a directory above a dist-info) pointing outside the tree
    # would otherwise read this host's files through the mount.
    outside = tmp_path / "host"
    (outside / "dpkg").mkdir(parents=True)
    (outside / "dpkg/status").write_text(STATUS)
    _dist(outside / "site", "evil-1.0.dist-info", "evil", "1.0")
    tree = tmp_path / "tree"
    (tree / "var/lib").mkdir(parents=True)
    os.symlink(outside / "dpkg", tree / "var/lib/dpkg")
    (tree / "usr/local/lib/python3.11").mkdir(parents=True)
    os.symlink(outside / "site", tree / "usr/local/lib/python3.11/site-packages")
    assert sbom.read_tree(tree) == []


# --- the SIF object ------------------------------------------------------------------------


def test_the_built_sif_carries_its_sbom_read_from_its_content_and_signed_with_it(small_sif, tmp_path: Path):
    """The builder embeds the SBOM before the SIF gets its name; it is the SBOM `envport sbom FILE.sif` reads
    from the mounted partition, and a signature made afterwards covers it (a changed byte in it is named)."""
    from envport.sif.format import read_sif
    from envport.sif.keys import load_public_key
    from envport.sif.verify import check_signatures

    from .test_sif_sign import flip, new_key

    if shutil.which("siftool") is None:
        missing("siftool (apt-get install siftool)")
    info = read_sif(small_sif.path)
    [desc] = [d for d in info.descriptors if d.datatype == sbom.SBOM_DATATYPE]
    partition = [d for d in info.descriptors if d.datatype == 0x4004][0]
    assert desc.group == partition.group and desc.name == sbom.SBOM_NAME
    dumped = subprocess.run(["siftool", "dump", str(desc.id), str(small_sif.path)], capture_output=True,
                            timeout=60)
    assert dumped.returncode == 0, dumped
    embedded = _validate(dumped.stdout.decode())
    out = tmp_path / "read.cdx.json"
    run_envport("sbom", str(small_sif.path), "--from-content", "-o", str(out), root=small_sif.root, timeout=300,
                check=True)
    read = _validate(out.read_text())
    assert [c["purl"] for c in embedded["components"]] == [c["purl"] for c in read["components"]]
    assert ("six", "1.16.0") in _components(embedded, "pypi")

    priv, pub = new_key(tmp_path, "ed25519")
    copy = tmp_path / small_sif.path.name
    shutil.copyfile(small_sif.path, copy)
    run_envport("sign", str(copy), "--key", str(priv), root=small_sif.root, timeout=300, check=True)
    checked = check_signatures(copy, [load_public_key(pub)])
    assert checked.ok and desc.id in checked.signatures[0].objects, checked
    flip(copy, desc.offset + 10)
    checked = check_signatures(copy, [load_public_key(pub)])
    assert checked.verdict == "bad_signature" and f"object {desc.id} (SBOM" in "; ".join(checked.problems), checked


def test_appended_sbom_object_is_what_siftool_reads(small_sif, tmp_path: Path):
    from envport.sif.format import read_sif

    if shutil.which("siftool") is None:
        missing("siftool (apt-get install siftool)")
    copy = tmp_path / small_sif.path.name
    shutil.copyfile(small_sif.path, copy)
    data = b'{"bomFormat": "CycloneDX"}\n'
    sbom.append_to_sif(copy, data)
    info = read_sif(copy)
    desc = max((d for d in info.descriptors if d.datatype == sbom.SBOM_DATATYPE), key=lambda d: d.id)
    partition = [d for d in info.descriptors if d.datatype == 0x4004][0]
    assert desc.group == partition.group and desc.name == sbom.SBOM_NAME
    listed = subprocess.run(["siftool", "list", str(copy)], capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0 and "SBOM" in listed.stdout, listed.stdout + listed.stderr
    dumped = subprocess.run(["siftool", "dump", str(desc.id), str(copy)], capture_output=True, timeout=60)
    assert dumped.returncode == 0 and dumped.stdout == data, dumped
    info_out = subprocess.run(["siftool", "info", str(desc.id), str(copy)], capture_output=True, text=True,
                              timeout=60)
    assert "cyclonedx-json" in info_out.stdout.lower() or "CycloneDX" in info_out.stdout, info_out.stdout
    # The rest of the file is untouched: the partition's bytes are where they were.
    with open(copy, "rb") as a, open(small_sif.path, "rb") as b:
        a.seek(partition.offset)
        b.seek(partition.offset)
        assert a.read(1 << 20) == b.read(1 << 20)


# --- built envs ----------------------------------------------------------------------------


def test_sif_sbom_lists_what_pip_and_dpkg_show_inside_it(small_sif, tmp_path: Path):
    from envport.sif.gate import gate
    from envport.sif.run import ch_run_argv, ch_run_env, missing_tools, mounted

    if missing_tools("ch-run"):
        missing(f"to run inside the SIF: {', '.join(missing_tools('ch-run'))}")
    out = tmp_path / "sif.cdx.json"
    proc = run_envport("sbom", str(small_sif.path), "--from-content", "-o", str(out), root=small_sif.root,
                       timeout=300)
    assert proc.returncode == 0, fail_with(proc, "envport sbom FILE.sif --from-content")
    doc = _validate(out.read_text())
    with mounted(gate(small_sif.path)) as mnt:
        inside = {name: subprocess.run(ch_run_argv(str(mnt), argv), capture_output=True, text=True,
                                       env=ch_run_env(), timeout=120)
                  for name, argv in (("pip", PIP_LIST), ("dpkg", DPKG_QUERY))}
    for name, ran in inside.items():
        assert ran.returncode == 0, (name, ran.stderr)
    assert _components(doc, "pypi") == _pip(inside["pip"].stdout)
    assert ("six", "1.16.0") in _components(doc, "pypi")
    assert _components(doc, "deb") == _dpkg(inside["dpkg"].stdout)
    props = {p["name"]: p["value"] for p in doc["metadata"]["properties"]}
    assert props["envport:hash"] == small_sif.hash


def test_spdx_format_holds_the_same_packages_and_validates(small_sif, tmp_path: Path):
    from spdx_tools.spdx.parser.parse_anything import parse_file
    from spdx_tools.spdx.validation.document_validator import validate_full_spdx_document

    runs = {}
    for fmt in ("cyclonedx", "spdx"):
        out = tmp_path / f"sbom.{fmt}.json"
        proc = run_envport("sbom", str(small_sif.path), "--format", fmt, "-o", str(out), root=small_sif.root,
                           timeout=300)
        assert proc.returncode == 0, fail_with(proc, f"envport sbom --format {fmt}")
        runs[fmt] = out
    doc = parse_file(str(runs["spdx"]))  # spdx-tools' own parser, then its validator
    assert validate_full_spdx_document(doc) == []
    assert doc.creation_info.spdx_version == "SPDX-2.3"
    spdx_purls = {ref.locator for pkg in doc.packages for ref in pkg.external_references}
    assert spdx_purls == {c["purl"] for c in json.loads(runs["cyclonedx"].read_text())["components"]}
    assert "pkg:pypi/six@1.16.0" in spdx_purls


def test_image_sbom_lists_what_pip_and_dpkg_show_inside_it(small_project, docker_client, base_image,
                                                           throwaway_images):
    throwaway_images.append(SMALL)
    built = run_envport("build", SMALL, "--target", "docker", "--site", SITE, "--json", root=small_project,
                        timeout=900)
    assert built.returncode == 0, fail_with(built, "envport build --target docker")
    tag = as_json(built)["steps"][-1]["data"]["image"]
    proc = run_envport("sbom", SMALL, "--target", "docker", "--site", SITE, root=small_project, timeout=300)
    assert proc.returncode == 0, fail_with(proc, "envport sbom --target docker")
    doc = _validate(proc.stdout)
    pip = docker_client.containers.run(tag, PIP_LIST, remove=True, network_disabled=True).decode()
    dpkg = docker_client.containers.run(tag, DPKG_QUERY, remove=True, network_disabled=True).decode()
    assert _components(doc, "pypi") == _pip(pip)
    assert _components(doc, "deb") == _dpkg(dpkg) and len(_dpkg(dpkg)) > 50
    # The image carries the builder's SBOM at its documented path, the label naming its sha256.
    import hashlib

    from envport.builders.docker.builder import SBOM_LABEL, SBOM_PATH

    carried = docker_client.containers.run(tag, ["cat", SBOM_PATH], remove=True, network_disabled=True)
    assert docker_client.images.get(tag).labels[SBOM_LABEL] == hashlib.sha256(carried).hexdigest()
    embedded = _validate(carried.decode())
    assert _components(embedded, "pypi") == _pip(pip) and _components(embedded, "deb") == _dpkg(dpkg)
    # What the builder read (only the SBOM's files: its layers mounted, or its export filtered) is what the
    # whole exported filesystem gives, byte for byte; and so is the filtered export, whichever the builder took.
    whole, filtered = _sboms_by_export(tag, embedded)
    assert carried.decode() == whole == filtered


def _sboms_by_export(image: str, embedded: dict) -> tuple[str, str]:
    """The SBOM of IMAGE read from its whole exported filesystem (the route the builder no longer takes), and
    from its export filtered to the files `sbom.needed` names, with the facts of the builder's SBOM EMBEDDED."""
    import tempfile
    from datetime import datetime

    from envport.engines.docker import export_files, export_rootfs

    props = {p["name"]: p["value"] for p in embedded["metadata"]["properties"]}
    facts = sbom.EnvFacts(props["envport:name"], props["envport:hash"], props["envport:target"],
                          lock=None if props["envport:lock"] == "none" else props["envport:lock"],
                          created=datetime.fromisoformat(embedded["metadata"]["timestamp"]))
    with tempfile.TemporaryDirectory() as tmp:
        export_rootfs(image, Path(tmp) / "whole")
        export_files(image, Path(tmp) / "filtered", sbom.needed())
        return sbom.make_sbom(Path(tmp) / "whole", facts)[0], sbom.make_sbom(Path(tmp) / "filtered", facts)[0]


def test_only_the_files_the_sbom_reads_give_the_same_sbom(tmp_path: Path):
    """`needed` (what an image's SBOM copies or opens) keeps every file read_tree reads and not the rest: a
    tree pruned to it gives the same SBOM; a package's own files are left out."""
    (tmp_path / "full/var/lib/dpkg").mkdir(parents=True)
    (tmp_path / "full/var/lib/dpkg/status").write_text(STATUS)
    (tmp_path / "full/etc").mkdir()
    (tmp_path / "full/etc/os-release").write_text('ID=debian\nVERSION_ID="12"\n')
    venv = tmp_path / "full/opt/envport/venv"
    site = venv / "lib/python3.11/site-packages"
    _dist(site, "six-1.16.0.dist-info", "six", "1.16.0")
    (site / "six-1.16.0.dist-info/RECORD").write_text("six.py,,\n")
    (site / "six.py").write_text("# six\n")
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    _dist(tmp_path / "full/usr/lib/python3/dist-packages", "pip-23.0.1.dist-info", "pip", "23.0.1")
    keep = sbom.needed()
    files = sorted(str(p.relative_to(tmp_path / "full")) for p in (tmp_path / "full").rglob("*") if p.is_file())
    kept = [f for f in files if keep(f)]
    assert kept == ["etc/os-release", "opt/envport/venv/lib/python3.11/site-packages/six-1.16.0.dist-info/METADATA",
                    "opt/envport/venv/pyvenv.cfg",
                    "usr/lib/python3/dist-packages/pip-23.0.1.dist-info/METADATA", "var/lib/dpkg/status"]
    for f in kept:
        (tmp_path / "pruned" / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(tmp_path / "full" / f, tmp_path / "pruned" / f)
    facts = sbom.EnvFacts("tiny", "ab" * 32, "docker")
    assert sbom.make_sbom(tmp_path / "pruned", facts) == sbom.make_sbom(tmp_path / "full", facts)
    # Without envport's venv, the system's site dirs are read: pruned alike.
    shutil.rmtree(venv)
    shutil.rmtree(tmp_path / "pruned/opt")
    assert sbom.make_sbom(tmp_path / "pruned", facts) == sbom.make_sbom(tmp_path / "full", facts)
    assert [p.name for p in sbom.read_tree(tmp_path / "pruned")] == ["adduser", "libc6", "pip"]


def test_venv_sbom_lists_what_its_pip_shows(small_project, tmp_path: Path):
    env = {**os.environ, "ENVPORT_ENVS_DIR": str(tmp_path / "envs")}
    built = run_envport("build", SMALL, "--target", "venv", "--site", SITE, root=small_project, env=env,
                        timeout=900)
    assert built.returncode == 0, fail_with(built, "envport build --target venv")
    proc = run_envport("sbom", SMALL, "--target", "venv", "--site", SITE, root=small_project, env=env, timeout=300)
    assert proc.returncode == 0, fail_with(proc, "envport sbom --target venv")
    doc = _validate(proc.stdout)
    python = tmp_path / "envs" / SMALL / "bin" / "python"
    pip = subprocess.run([str(python), *PIP_LIST[1:]], capture_output=True, text=True, timeout=120)
    assert _components(doc, "pypi") == _pip(pip.stdout) and ("six", "1.16.0") in _pip(pip.stdout)
    assert _components(doc, "deb") == set()  # a venv holds no Debian packages: the host's are not the env's


@pytest.mark.parametrize("target, reason", [("venv", "env_missing"), ("apptainer", "sif_missing")])
def test_an_unbuilt_env_is_refused_with_the_build_command(small_project, tmp_path: Path, target, reason):
    from .support import write_spec

    write_spec(small_project, "tiny-unbuilt-sbom", pip_phases=[["six==1.15.0"]])
    env = {**os.environ, "ENVPORT_ENVS_DIR": str(tmp_path / "envs")}
    proc = run_envport("sbom", "tiny-unbuilt-sbom", "--target", target, root=small_project, env=env, timeout=120)
    assert proc.returncode == 3, fail_with(proc, "sbom of an unbuilt env")
    assert f"[{reason}]" in proc.stderr and f"envport build tiny-unbuilt-sbom --target {target}" in proc.stderr
    assert proc.stdout == ""


# --- a SIF's SBOM where its partition is extracted, not mounted (no FUSE, not root) -------------------


def test_unsquashfs_extracts_every_file_the_reader_reads_and_only_those(tmp_path: Path):
    """`extract_patterns` given to unsquashfs (as sif/run.py `_extract` gives them) extract a tree whose SBOM is
    the whole tree's: hidden `.x.dist-info` folders too (unsquashfs' `*` does not match a leading '.'), and an
    os-release that is a symlink; no other file of a package comes with them."""
    from datetime import datetime, timezone

    for tool in ("mksquashfs", "unsquashfs"):
        if shutil.which(tool) is None:
            missing(f"no {tool} (apt-get install squashfs-tools)")
    full = tmp_path / "full"
    (full / "var/lib/dpkg").mkdir(parents=True)
    (full / "var/lib/dpkg/status").write_text(STATUS)
    (full / "var/lib/dpkg/available").write_text(STATUS)
    (full / "usr/lib").mkdir(parents=True)
    (full / "usr/lib/os-release").write_text('ID=debian\nVERSION_ID="12"\n')
    (full / "etc").mkdir()
    os.symlink("../usr/lib/os-release", full / "etc/os-release")
    venv = full / "opt/envport/venv"
    site = venv / "lib/python3.11/site-packages"
    for dirname, name in (("six-1.16.0.dist-info", "six"), (".hidden-1.0.dist-info", "hidden"),
                          (".dist-info", "dotted"), ("sp ace-1.0.dist-info", "spaced")):
        _dist(site, dirname, name, "1.0" if name != "six" else "1.16.0")
        (site / dirname / "RECORD").write_text("x,,\n")
    (site / "six.py").write_text("# six\n")
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    image = tmp_path / "image.sqfs"
    subprocess.run(["mksquashfs", str(full), str(image), "-quiet", "-noappend", "-no-xattrs"], check=True,
                   capture_output=True, timeout=120)
    out = tmp_path / "out"
    subprocess.run(["unsquashfs", "-q", "-n", "-no-xattrs", "-d", str(out), str(image), *sbom.extract_patterns()],
                   check=True, capture_output=True, timeout=120)
    facts = sbom.EnvFacts("tiny", "ab" * 32, "apptainer", created=datetime(2024, 1, 1, tzinfo=timezone.utc))
    assert sbom.make_sbom(out, facts) == sbom.make_sbom(full, facts)
    assert {p.name for p in sbom.read_tree(out)} >= {"six", "hidden", "dotted", "spaced"}
    got = sorted(str(p.relative_to(out)) for p in out.rglob("*") if not p.is_dir())
    assert got == sorted(["etc/os-release", "usr/lib/os-release", "var/lib/dpkg/status", "opt/envport/venv/pyvenv.cfg",
                          *(f"opt/envport/venv/lib/python3.11/site-packages/{d}/METADATA"
                            for d in ("six-1.16.0.dist-info", ".hidden-1.0.dist-info", ".dist-info",
                                      "sp ace-1.0.dist-info"))])


def test_an_extracted_sif_gives_the_mounted_ones_sbom_from_a_fraction_of_its_bytes(small_sif, tmp_path: Path):
    """The route of a user without FUSE (sif/run.py `_extract` with the SBOM's patterns, from the open
    descriptor) against the mounted partition (root's or squashfuse's route): the same SBOM, byte for byte,
    from only the files the reader opens."""
    from envport.sif.format import primary_partition, read_sif
    from envport.sif.gate import gate
    from envport.sif.handle import SifFile
    from envport.sif.run import _extract

    info = read_sif(small_sif.path)
    facts = sbom.sif_facts(info)
    mounted_text, packages = sbom.sif_sbom(gate(small_sif.path), facts)
    part = primary_partition(info)
    dest, whole = tmp_path / "rootfs", tmp_path / "whole"
    dest.mkdir()
    whole.mkdir()
    with SifFile.open(small_sif.path) as sif:
        _extract(sif, part.offset, part.size, dest, sbom.extract_patterns())
        # The whole partition, by no pattern: where no mount works, sif_sbom's own route is the filtered
        # extraction, and a pattern it lacked would be lacking on both sides.
        _extract(sif, part.offset, part.size, whole)
    assert sbom.make_sbom(whole, facts)[0] == mounted_text
    assert sbom.make_sbom(dest, facts)[0] == mounted_text and len(packages) > 50
    files = [p for p in dest.rglob("*") if not p.is_dir()]
    keep = sbom.needed()
    assert [str(p.relative_to(dest)) for p in files if not keep(str(p.relative_to(dest)))] == []
    assert sum(p.lstat().st_size for p in files) < part.size // 20

"""The SBOM a docker build ends with costs what it reads (issue 39): only the files the SBOM reads are read
from the built image, its file is committed in one layer that changes nothing else of the image, and the
build says where its time went after the engine's build.

demo-cpu (torch, ~1 GB) is the session's image (tests/fixtures.py `demo_image`), built with --rebuild, so
its build ran this route; these tests only inspect it. That the SBOM read this way equals the one of the
whole exported filesystem is tests/test_sbom.py's (on a small image: the whole export is what it avoids).
"""

from __future__ import annotations

import hashlib
import json
import os

from envport.builders.docker.builder import SBOM_LABEL, SBOM_PATH
from envport.engines.docker import image_files, layers_mountable
from envport.sif import sbom


def test_the_sbom_layer_changes_nothing_but_its_file_and_label(demo_image, docker_client):
    tagged = docker_client.images.get(demo_image.tag)
    built = docker_client.images.get(tagged.attrs["Parent"])  # what the engine built: the pin check's image
    assert built.labels.get("envport.hash") == tagged.labels["envport.hash"] and SBOM_LABEL not in built.labels
    mine, theirs = dict(tagged.attrs["Config"]), dict(built.attrs["Config"])
    assert mine.pop("Labels") == {**theirs.pop("Labels"), SBOM_LABEL: tagged.labels[SBOM_LABEL]}
    mine.pop("Image"), theirs.pop("Image")
    assert mine == theirs  # Env, Cmd, Entrypoint, WorkingDir, User...: the image's own, no container's
    top = docker_client.api.history(tagged.id)[0]
    carried = docker_client.containers.run(tagged.id, ["cat", SBOM_PATH], remove=True, network_disabled=True)
    assert top["Size"] == len(carried) and SBOM_PATH in top["CreatedBy"], top
    assert hashlib.sha256(carried).hexdigest() == tagged.labels[SBOM_LABEL]
    assert len(json.loads(carried)["components"]) == demo_image.result["steps"][-1]["data"]["sbom_components"]


def test_the_build_reads_only_the_sboms_files_and_times_each_step(demo_image, docker_client):
    data = demo_image.result["steps"][-1]["data"]
    timings = data["timings"]
    assert list(timings) == ["context", "engine_build", "pin_check", "sbom_read", "sbom_layer", "tag"], timings
    assert all(isinstance(v, (int, float)) and v >= 0 for v in timings.values()), timings
    built = docker_client.images.get(docker_client.images.get(demo_image.tag).attrs["Parent"])
    how = "mounted" if layers_mountable(built.attrs.get("GraphDriver")) else "streamed"
    said = [line for line in demo_image.stderr.splitlines() if "[docker] SBOM:" in line]
    assert len(said) == 1 and f"components ({how}:" in said[0], said
    assert f"SBOM: {data['sbom_components']} components" in said[0]


def test_a_mounted_image_is_read_in_place_and_unmounted(demo_image, docker_client):
    """Where envport may mount the image's layers, the tree is the image's own (nothing copied) and the mount
    is gone afterwards; the route the builder says it took is the one image_files takes."""
    image = docker_client.images.get(demo_image.tag)
    with image_files(image.id, sbom.needed(), graph=image.attrs.get("GraphDriver")) as (tree, how):
        torch = tree / "opt/envport/venv/lib/python3.11/site-packages/torch/__init__.py"
        if how == "mounted":
            assert torch.is_file()  # every file is there, read only when opened
        else:
            assert not torch.exists()  # only the SBOM's files were written
        assert (tree / "var/lib/dpkg/status").is_file()
        assert (tree / SBOM_PATH.lstrip("/")).exists() == (how == "mounted")
    assert not tree.exists()
    mounts = open("/proc/self/mounts").read()
    assert str(tree) not in mounts


def _layer(members: list) -> bytes:
    """A one-layer image's tar: (name, kind, data or link target) each; kind file, hardlink or symlink."""
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, kind, body in members:
            info = tarfile.TarInfo(name)
            info.mtime, info.mode = 1_700_000_000, 0o644
            if kind == "file":
                info.size = len(body)
                tar.addfile(info, io.BytesIO(body))
            else:
                info.type = tarfile.LNKTYPE if kind == "hardlink" else tarfile.SYMTYPE
                info.linkname = body
                tar.addfile(info)
    return buf.getvalue()


def test_every_route_reads_what_the_whole_export_holds(docker_client, tmp_path):
    """An image made to trip a filter: a dist-info METADATA stored as a hard link to a file the filter does
    not keep (tar writes a file's bytes once, under its first name), dpkg's status a symlink out of the tree,
    a site dir under a symlinked folder. The whole export, the filtered export and image_files give one SBOM."""
    from envport.engines.docker import export_files, export_rootfs
    from envport.sif import sbom as sbom_mod

    meta = b"Metadata-Version: 2.1\nName: linked\nVersion: 1.0\n\n"
    site = "usr/local/lib/python3.11/site-packages"
    docker_client.api.import_image_from_data(_layer([
        ("aaa/METADATA", "file", meta),
        (f"{site}/linked-1.0.dist-info/METADATA", "hardlink", "aaa/METADATA"),
        (f"{site}/plain-2.0.dist-info/METADATA", "file", meta.replace(b"linked", b"plain").replace(b"1.0", b"2.0")),
        ("etc/os-release", "file", b'ID=debian\nVERSION_ID="12"\n'),
        ("var/lib/dpkg/status", "symlink", "/etc/shadow"),
        ("usr/lib/python3", "symlink", f"/{site}"),
    ]), repository="envport-test/sbom-routes", tag="latest")
    try:
        facts = sbom_mod.EnvFacts("routes", "ab" * 32, "docker")
        export_rootfs("envport-test/sbom-routes:latest", tmp_path / "whole")
        whole = sbom_mod.make_sbom(tmp_path / "whole", facts)
        assert [p.purl for p in whole[1]] == ["pkg:pypi/linked@1.0", "pkg:pypi/plain@2.0"]
        # Two METADATA and os-release: the symlinks are no files, and nothing under one is in the stream.
        assert export_files("envport-test/sbom-routes:latest", tmp_path / "kept", sbom_mod.needed()) == 3
        assert sbom_mod.make_sbom(tmp_path / "kept", facts) == whole
        assert not (tmp_path / "kept/aaa").exists()  # the link's first name was only read, never kept
        text, packages, how = sbom_mod.image_sbom("envport-test/sbom-routes:latest", facts)
        assert (text, packages) == whole, how
    finally:
        docker_client.images.remove("envport-test/sbom-routes:latest", force=True)


def test_the_sbom_layer_keeps_cmd_and_entrypoint_with_or_without_them(docker_client, tmp_path):
    """The commit route keeps an image's Cmd; an image with neither Cmd nor Entrypoint (a commit would keep
    the container's command) takes the one-line build: each ends with the file, the label and the config."""
    from envport.builders.docker.builder import _sbom_layer
    from envport.engines.docker import export_files

    data = b'{"bomFormat": "CycloneDX"}\n'
    for repo, changes in (("envport-test/sbom-layer-cmd", ['CMD ["/bin/true"]', "ENV A=1"]),
                          ("envport-test/sbom-layer-bare", [])):
        docker_client.api.import_image_from_data(_layer([("etc/os-release", "file", b"ID=debian\n")]),
                                                 repository=repo, tag="latest", changes=changes)
        layered = None
        try:
            image = docker_client.images.get(f"{repo}:latest")
            layered = _sbom_layer(docker_client, image, data)
            config, before = layered.attrs["Config"], image.attrs["Config"]
            assert config["Labels"] == {SBOM_LABEL: hashlib.sha256(data).hexdigest()}
            assert (config.get("Cmd"), config.get("Entrypoint")) == (before.get("Cmd"), before.get("Entrypoint"))
            if changes:  # the commit keeps the config whole (a build adds its default PATH to an Env-less one)
                assert {k: v for k, v in config.items() if k not in ("Labels", "Image")} == \
                    {k: v for k, v in before.items() if k not in ("Labels", "Image")}
                assert layered.attrs["Parent"] == image.id
            out = tmp_path / repo.rsplit("/", 1)[1]
            assert export_files(layered.id, out, SBOM_PATH.lstrip("/").__eq__) == 1
            assert (out / SBOM_PATH.lstrip("/")).read_bytes() == data
        finally:
            if layered is not None:  # untagged: its build's intermediate goes with it
                docker_client.images.remove(layered.id, force=True)
            docker_client.images.remove(f"{repo}:latest", force=True)


def test_a_killed_reader_leaves_no_image_mounted(demo_image, docker_client):
    """SIGKILL while the image's layers are mounted: the holder (engines/docker.py OVERLAY_HOLDER) unmounts."""
    import subprocess
    import sys
    import time

    from .support import missing

    layers = layers_mountable(docker_client.images.get(demo_image.tag).attrs.get("GraphDriver"))
    if layers is None:
        missing("a mountable image (root, a local engine with the overlay2 driver): the export is streamed here")
    code = ("import json, sys, time\nfrom envport.engines.docker import mounted_layers\n"
            "with mounted_layers(json.loads(sys.argv[1])) as tree:\n    print(tree, flush=True)\n    time.sleep(600)\n")
    reader = subprocess.Popen([sys.executable, "-c", code, json.dumps(layers)], stdout=subprocess.PIPE, text=True)
    tree = reader.stdout.readline().strip()
    assert tree and f" {tree} overlay " in open("/proc/self/mounts").read()
    reader.kill()
    reader.wait()
    reader.stdout.close()
    deadline = time.monotonic() + 60  # the holder's unmount runs after envport is gone: wait for it, bounded
    while (f" {tree} " in open("/proc/self/mounts").read() or os.path.exists(tree)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert f" {tree} " not in open("/proc/self/mounts").read()
    assert not os.path.exists(os.path.dirname(tree))  # and its private folder is gone

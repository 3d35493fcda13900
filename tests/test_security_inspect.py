"""Issue 21 F3, F4, F5: `envport inspect` judges a SIF by its content, not its labels, and no crafted SIF
gets a traceback or a raw terminal escape out of it (nor out of `verify --sif`).

Every attack is crafted here, for real: squashfs partitions by `mksquashfs` (set-id bits and device nodes
as mksquashfs pseudo definitions, so no root is needed), SIFs by engines/sif.write_sif (what the builder
writes), patched with `struct` where a byte has to move.  demo-cpu's real SIF (tests/sif_fixtures.py,
shared with test_inspect.py) lends its labels and descriptor objects to the forgery.
"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from envport.sif.format import SPEC_OBJECT
from envport.builders.apptainer.singularity_d import inspect_metadata
from envport.sif.format import DATA_GENERIC_JSON, read_json_object, read_object, read_sif, write_sif

from .sif_fixtures import BuiltSif
from .support import REPO, as_json, missing, run_envport

pytest_plugins = ["tests.sif_fixtures"]

SUPERBLOCK_BYTES_USED = 40  # offset of bytes_used in the squashfs superblock


def _need_squashfs_tools() -> None:
    if shutil.which("mksquashfs") is None or shutil.which("unsquashfs") is None:
        missing("squashfs-tools not installed (apt-get install squashfs-tools)")


def _squash(tree: Path, out: Path, *pseudo: str) -> Path:
    args = [a for p in pseudo for a in ("-p", p)]
    subprocess.run(["mksquashfs", str(tree), str(out), "-noappend", "-quiet", "-no-progress", *args], check=True)
    return out


def _tree(root: Path, labels: dict, env: str = "") -> Path:
    (root / ".singularity.d" / "env").mkdir(parents=True)
    (root / ".singularity.d" / "labels.json").write_text(json.dumps(labels, indent=1))
    (root / ".singularity.d" / "env" / "90-environment.sh").write_text(env)
    return root


def _inspect(path: Path, root: Path, *extra: str) -> subprocess.CompletedProcess:
    return run_envport("inspect", str(path), *extra, root=root, timeout=300)


# --- F3: content, not labels ------------------------------------------------------------------------------


def test_forged_sif_with_demo_labels_is_judged_by_its_content(demo_sif: BuiltSif, tmp_path: Path):
    """demo-cpu's labels, environment, def file and embedded spec over a setuid shell, /dev/mem and no
    python: today's inspect said `matches specs/demo-cpu.yaml` (exit 0)."""
    _need_squashfs_tools()
    info = read_sif(demo_sif.path)
    meta = read_json_object(info, "inspect-metadata.json")
    labels = meta["data"]["attributes"]["labels"]
    tree = _tree(tmp_path / "tree", labels, "export DEMO_GREETING='hello from demo-cpu'\n")
    (tree / "bin").mkdir()
    shutil.copy(shutil.which("dash") or "/bin/sh", tree / "bin" / "sh")
    (tree / "dev").mkdir()
    sqfs = _squash(tree, tmp_path / "forged.sqfs", "dev/mem c 666 0 0 1 1", "bin/sh m 4755 0 0")
    forged = tmp_path / "demo-cpu-forged.sif"
    deffile = read_object(info, info.find(datatype=0x4001))
    embedded = read_object(info, info.find(datatype=DATA_GENERIC_JSON, name=SPEC_OBJECT))
    write_sif(forged, deffile=deffile, inspect_metadata=json.dumps(meta).encode(), squashfs_path=sqfs,
              created=info.created, uuid=bytes(16), extra_json=((SPEC_OBJECT, embedded),))
    proc = _inspect(forged, demo_sif.root, "--json")
    assert proc.returncode != 0, proc.stdout + proc.stderr
    out = as_json(proc)
    step = out["steps"][0]
    assert step["reason"] in ("content_mismatch", "corrupt"), step
    kinds = {(r["kind"], r["path"]) for r in out["sif"]["risks"]}
    assert ("setuid", "/bin/sh") in kinds and ("device", "/dev/mem") in kinds
    assert out["sif"]["content"]["python"] is None
    text = _inspect(forged, demo_sif.root).stdout
    assert f"labels claim demo-cpu@{demo_sif.hash[:12]}" in text
    assert "risk         setuid: /bin/sh" in text and "risk         device: /dev/mem" in text
    assert "matches" not in text.splitlines()[-1]
    # The embedded record of the partition's sha256 was demo-cpu's: corrupt comes first.  Without it (a
    # forger rewrites that record too) the content still says what it is.
    doc = json.loads(embedded)
    doc.pop("partition", None)
    write_sif(forged, deffile=deffile, inspect_metadata=json.dumps(meta).encode(), squashfs_path=sqfs,
              created=info.created, uuid=bytes(16), extra_json=((SPEC_OBJECT, json.dumps(doc).encode()),))
    proc = _inspect(forged, demo_sif.root, "--json")
    step = as_json(proc)["steps"][0]
    assert proc.returncode == 3 and step["reason"] == "content_mismatch", step
    assert "content: no python, 0/" in step["detail"]
    assert any(line.startswith("no python in the image") for line in step["lines"])


def _copy(src: Path, dest: Path) -> Path:
    shutil.copyfile(src, dest)
    return dest


def _partition(path: Path):
    return [d for d in read_sif(path).descriptors if d.datatype_name == "FS"][0]


def test_corruption_is_caught_not_only_forgery(tiny_sif: BuiltSif, tmp_path: Path):
    """One byte flipped in the squashfs data, 4 KiB appended, bytes_used changed: each "matched" before."""
    _need_squashfs_tools()
    part = _partition(tiny_sif.path)
    flipped = _copy(tiny_sif.path, tmp_path / "flipped.sif")
    with open(flipped, "r+b") as fh:
        fh.seek(part.offset + part.size // 2)
        byte = fh.read(1)
        fh.seek(part.offset + part.size // 2)
        fh.write(bytes([byte[0] ^ 0xFF]))
    appended = _copy(tiny_sif.path, tmp_path / "appended.sif")
    with open(appended, "ab") as fh:
        fh.write(b"\0" * 4096)
    used = _copy(tiny_sif.path, tmp_path / "used.sif")
    with open(used, "r+b") as fh:
        fh.seek(part.offset + SUPERBLOCK_BYTES_USED)
        (bytes_used,) = struct.unpack("<Q", fh.read(8))
        fh.seek(part.offset + SUPERBLOCK_BYTES_USED)
        fh.write(struct.pack("<Q", bytes_used - 8192))
    for path, reason, words in ((flipped, "corrupt", "corrupt: the partition is not what its build recorded"),
                                (appended, "trailing_bytes", "4096 bytes past the last object"),
                                (used, "bytes_used_mismatch", f"says {bytes_used - 8192} bytes")):
        proc = _inspect(path, tiny_sif.root, "--json", "--site", "sif-fast")
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, (path.name, proc.stdout, proc.stderr)
        step = as_json(proc)["steps"][0]
        assert (step["verdict"], step["reason"]) == ("FAILED", reason), (path.name, step)
        assert words in step["detail"], (path.name, step)


def test_descriptor_labels_disagreeing_with_the_image_are_named(tiny_sif: BuiltSif, tmp_path: Path):
    _need_squashfs_tools()
    relabelled = tmp_path / "relabelled.sif"
    info = read_sif(tiny_sif.path)
    meta = read_json_object(info, "inspect-metadata.json")
    meta["data"]["attributes"]["labels"]["envport.name"] = "demo-cpu"
    whole = bytearray(tiny_sif.path.read_bytes())
    desc = info.find(datatype=DATA_GENERIC_JSON, name="inspect-metadata.json")
    new = json.dumps(meta, separators=(",", ":")).encode()
    assert len(new) <= desc.size
    new = new.ljust(desc.size)  # same size (JSON allows trailing blanks): the layout stays
    whole[desc.offset:desc.offset + desc.size] = new
    relabelled.write_bytes(bytes(whole))
    proc = _inspect(relabelled, tiny_sif.root, "--json", "--site", "sif-fast")
    out = as_json(proc)
    checks = {c["name"]: c for c in out["steps"][0]["data"]["checks"]}
    assert checks["labels"]["reason"] == "labels_disagree", checks
    assert "envport.name" in checks["labels"]["detail"]
    assert proc.returncode != 0


# --- F4: terminal escapes in a SIF's text -----------------------------------------------------------------

HOSTILE = "\x1b]0;pwned\x07\x1b[2J\rOK       inspect x.sif: matches specs/demo-cpu.yaml\u202e"


def test_escape_sequences_from_a_sif_are_printed_escaped(tmp_path: Path):
    _need_squashfs_tools()
    labels = {"maintainer": HOSTILE, f"x{HOSTILE}": "key too"}
    tree = _tree(tmp_path / "tree", labels, f"export EVIL='{HOSTILE}'\n")
    sqfs = _squash(tree, tmp_path / "x.sqfs")
    sif = tmp_path / "x.sif"
    deffile = f"Bootstrap: scratch\n%labels\n    maintainer {HOSTILE}\n"
    write_sif(sif, deffile=deffile.encode(), squashfs_path=sqfs, created=0, uuid=bytes(16),
              inspect_metadata=inspect_metadata(deffile=deffile, labels=labels,
                                                environment={"/.singularity.d/env/90-environment.sh":
                                                             f"export EVIL='{HOSTILE}'\n"}))
    proc = _inspect(sif, REPO)
    assert proc.returncode == 3 and "Traceback" not in proc.stderr, proc.stderr
    for ch in ("\x1b", "\x07", "\r", "\u202e"):
        assert ch not in proc.stdout, repr(ch)
    assert "label        maintainer=\\x1b]0;pwned\\x07\\x1b[2J\\x0dOK" in proc.stdout
    assert "environment  export EVIL='\\x1b]0;pwned" in proc.stdout
    assert as_json(_inspect(sif, REPO, "--json"))["sif"]["labels"]["maintainer"] == HOSTILE  # data stays data


# --- F5: crafted SIFs end in a reason, exit 1, in inspect and verify --sif ----------------------------------


def _crafted(tmp_path: Path, name: str, *, created: int = 0, metadata: bytes | None = None) -> Path:
    tree = tmp_path / f"tree-{name}"
    (tree / "bin").mkdir(parents=True)
    sqfs = _squash(tree, tmp_path / f"{name}.sqfs")
    sif = tmp_path / f"{name}.sif"
    meta = metadata if metadata is not None else inspect_metadata(
        deffile="Bootstrap: scratch\n", labels={"envport.name": "demo-cpu", "envport.hash": "0" * 64},
        environment={})
    write_sif(sif, deffile=b"Bootstrap: scratch\n", inspect_metadata=meta, squashfs_path=sqfs, created=created,
              uuid=bytes(16))
    return sif


def _meta(labels=None, environment=None, attributes=None, data=None) -> bytes:
    attrs = {"labels": {} if labels is None else labels, "environment": {} if environment is None else environment}
    doc = {"data": (data if data is not None else {"attributes": attrs if attributes is None else attributes})}
    return json.dumps(doc).encode()


CRAFTED_METADATA = {
    "labels-list": (_meta(labels=["envport.hash", "x"]), "corrupt_object"),
    "labels-str": (_meta(labels="envport.hash"), "corrupt_object"),
    "environment-int": (_meta(environment=7), "corrupt_object"),
    "attributes-list": (_meta(attributes=[1, 2]), "corrupt_object"),
    "data-str": (_meta(data="x"), "corrupt_object"),
    "top-list": (b"[1, 2, 3]", "corrupt_object"),
    "nested-100k": (b"[" * 100_000 + b"]" * 100_000, "corrupt_object"),
    "nested-objects": (b'{"data":' * 50_000 + b"1" + b"}" * 50_000, "corrupt_object"),
}


@pytest.mark.parametrize("name", sorted(CRAFTED_METADATA))
def test_crafted_metadata_is_a_reason_in_inspect_and_verify(name, tmp_path: Path):
    _need_squashfs_tools()
    metadata, reason = CRAFTED_METADATA[name]
    sif = _crafted(tmp_path, name, metadata=metadata)
    proc = _inspect(sif, REPO, "--json")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert as_json(proc)["steps"][0]["reason"] == reason
    proc = run_envport("verify", "demo-cpu", "--target", "apptainer", "--sif", str(sif), "--json", root=REPO,
                       timeout=300)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    step = as_json(proc)["steps"][-1]
    # verify runs inspect's checks on the file before it uses it (issue 35, U1): the same reason.
    assert (step["verdict"], step["reason"]) == ("FAILED", reason), step


@pytest.mark.parametrize("created", [2**62, -2**62, 2**63 - 1, -2**63], ids=["huge", "negative", "max", "min"])
def test_a_created_time_no_calendar_holds_is_shown_as_a_number(created, tmp_path: Path):
    _need_squashfs_tools()
    sif = _crafted(tmp_path, "created", created=created)
    proc = _inspect(sif, REPO, "--json")
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    out = as_json(proc)
    assert out["sif"]["header"]["created"] == f"{created} (not a date)"
    assert out["steps"][0]["reason"]  # judged on, with a reason token (its content holds no python)

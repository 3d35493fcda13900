"""envport.sif.format: write a SIF as apptainer lays it out, read any SIF back, refuse bad ones.

Binaries (Debian packages; a test that needs one skips, naming it, when it is
missing): `mksquashfs` (squashfs-tools) makes the partition; `siftool`
(siftool, Sylabs' reference SIF tool) must list and dump what we write;
`squashfuse` + `fusermount3` (squashfuse, fuse3) mount the partition by offset
the way apptainer's unprivileged mount does.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from envport.sif import format as sif
from envport.sif.format import SifError

MKSQUASHFS = shutil.which("mksquashfs")
SIFTOOL = shutil.which("siftool")
SQUASHFUSE = shutil.which("squashfuse")
FUSERMOUNT = shutil.which("fusermount3") or shutil.which("fusermount")

needs_mksquashfs = pytest.mark.skipif(MKSQUASHFS is None, reason="mksquashfs missing: apt-get install squashfs-tools")
needs_siftool = pytest.mark.skipif(SIFTOOL is None, reason="siftool missing: apt-get install siftool")

DEF = b"Bootstrap: docker\nFrom: envport/debian-bookworm:base\n\n%post\n    echo hi\n"
META = b'{"data":{"attributes":{"labels":{"envport.name":"t"}}},"type":"container"}'
UUID = bytes.fromhex("0123456789abcdef0123456789abcdef")
CREATED = 1_700_000_000


@pytest.fixture(scope="module")
def squashfs(tmp_path_factory) -> Path:
    if MKSQUASHFS is None:
        pytest.skip("mksquashfs missing: apt-get install squashfs-tools")
    d = tmp_path_factory.mktemp("sqfs")
    tree = d / "tree"
    (tree / "etc").mkdir(parents=True)
    (tree / "etc" / "hello").write_text("hello from the squashfs\n")
    (tree / "opt" / "big").mkdir(parents=True)
    # Incompressible bytes: the image spans several 4 KiB pages, so offsets matter.
    (tree / "opt" / "big" / "blob").write_bytes(hashlib.sha256(b"x").digest() * 2048)
    out = d / "rootfs.sqfs"
    subprocess.run([MKSQUASHFS, str(tree), str(out), "-noappend", "-comp", "gzip", "-all-root",
                    "-mkfs-time", "0", "-all-time", "0", "-quiet", "-no-progress"],
                   check=True, capture_output=True)
    return out


def write(path: Path, squashfs: Path, **kw) -> sif.SifInfo:
    args = dict(deffile=DEF, inspect_metadata=META, squashfs_path=squashfs, created=CREATED, uuid=UUID)
    args.update(kw)
    return sif.write_sif(path, **args)


@pytest.fixture
def good(tmp_path: Path, squashfs: Path) -> Path:
    path = tmp_path / "good.sif"
    write(path, squashfs)
    return path


def test_round_trip(good: Path, squashfs: Path):
    info = sif.read_sif(good)
    assert (info.launch_script, info.version, info.arch) == ("#!/usr/bin/env run-singularity\n", "01", "amd64")
    assert info.uuid == "01234567-89ab-cdef-0123-456789abcdef"
    assert (info.created, info.modified) == (CREATED, CREATED)
    assert (info.descriptors_total, info.descriptors_free) == (48, 45)
    assert (info.descriptors_offset, info.data_offset) == (4096, 32176)
    assert [(d.id, d.datatype_name, d.group, d.name) for d in info.descriptors] == [
        (1, "Def.FILE", 1, ""), (2, "JSON.Generic", 1, "inspect-metadata.json"), (3, "FS", 1, "")]
    deffile, meta, part = info.descriptors
    assert sif.read_object(info, deffile) == DEF
    assert sif.read_object(info, info.find(name="inspect-metadata.json")) == META
    assert (deffile.offset, meta.offset) == (32176, 32176 + len(DEF))  # data objects unaligned, as apptainer's
    assert part.offset % 4096 == 0 and part.offset >= meta.offset + meta.size
    assert part.size == squashfs.stat().st_size
    assert (part.fs_name, part.partition_name, part.arch) == ("Squashfs", "Primary system", "amd64")
    assert sif.primary_partition(info, arch="amd64") == part
    assert info.data_size == sum(d.size_with_padding for d in info.descriptors)
    assert info.file_size == part.offset + part.size == good.stat().st_size
    with open(good, "rb") as a, open(squashfs, "rb") as b:
        a.seek(part.offset)
        assert a.read() == b.read()
    assert good.stat().st_mode & 0o777 == 0o755


def test_same_inputs_same_bytes(tmp_path: Path, squashfs: Path):
    write(tmp_path / "a.sif", squashfs)
    write(tmp_path / "b.sif", squashfs)
    assert (tmp_path / "a.sif").read_bytes() == (tmp_path / "b.sif").read_bytes()
    write(tmp_path / "c.sif", squashfs, created=CREATED + 1)
    assert (tmp_path / "c.sif").read_bytes() != (tmp_path / "a.sif").read_bytes()


def test_squashfs_superblock(good: Path, squashfs: Path):
    info = sif.read_sif(good)
    sb = sif.read_squashfs_superblock(good, sif.primary_partition(info).offset)
    assert (sb.compression, sb.block_size, sb.version, sb.mkfs_time) == ("gzip", 131072, "4.0", 0)
    assert sb.inodes == 6  # /, etc, etc/hello, opt, opt/big, opt/big/blob
    assert sb == sif.read_squashfs_superblock(squashfs)
    assert 0 < sb.bytes_used <= squashfs.stat().st_size


@needs_siftool
def test_siftool_reads_what_we_write(good: Path):
    listing = subprocess.run([SIFTOOL, "list", str(good)], capture_output=True, text=True, check=True).stdout
    rows = [[c.strip() for c in line.split("|")] for line in listing.splitlines() if line[:1].isdigit()]
    part = sif.primary_partition(sif.read_sif(good))
    assert rows == [
        ["1", "1", "NONE", f"32176-{32176 + len(DEF)}", "Def.FILE"],
        ["2", "1", "NONE", f"{32176 + len(DEF)}-{32176 + len(DEF) + len(META)}", "JSON.Generic"],
        ["3", "1", "NONE", f"{part.offset}-{part.offset + part.size}", "FS (Squashfs/*System/amd64)"],
    ]
    header = subprocess.run([SIFTOOL, "header", str(good)], capture_output=True, text=True, check=True).stdout
    assert "Launch Script:        #!/usr/bin/env run-singularity" in header
    assert "Primary Architecture: amd64" in header
    assert "ID:                   01234567-89ab-cdef-0123-456789abcdef" in header
    info2 = subprocess.run([SIFTOOL, "info", "2", str(good)], capture_output=True, text=True, check=True).stdout
    assert "inspect-metadata.json" in info2
    dump = subprocess.run([SIFTOOL, "dump", "1", str(good)], capture_output=True, check=True).stdout
    assert dump == DEF


@needs_siftool
def test_same_layout_as_siftool_assembly(tmp_path: Path, good: Path, squashfs: Path):
    """siftool (apptainer/sif v2) given the same objects lays out the same data section and descriptors."""
    ref = tmp_path / "ref.sif"
    (tmp_path / "def").write_bytes(DEF)
    (tmp_path / "meta").write_bytes(META)
    for argv in (["new", str(ref)],
                 ["add", str(ref), str(tmp_path / "def"), "--datatype", "1", "--groupid", "1", "--filename", ""],
                 ["add", str(ref), str(tmp_path / "meta"), "--datatype", "6", "--groupid", "1",
                  "--filename", "inspect-metadata.json"],
                 ["add", str(ref), str(squashfs), "--datatype", "4", "--parttype", "2", "--partfs", "1",
                  "--partarch", "2", "--groupid", "1", "--filename", ""]):
        subprocess.run([SIFTOOL, *argv], check=True, capture_output=True)
    ours, theirs = sif.read_sif(good), sif.read_sif(ref)

    def shape(info):
        return [(d.id, d.datatype, d.group, d.link, d.offset, d.size, d.size_with_padding, d.name, d.fs_type,
                 d.partition_type, d.arch) for d in info.descriptors]

    assert shape(ours) == shape(theirs)
    assert (ours.data_offset, ours.data_size, ours.descriptors_free, ours.arch) == \
        (theirs.data_offset, theirs.data_size, theirs.descriptors_free, theirs.arch)
    assert good.read_bytes()[32176:] == ref.read_bytes()[32176:]


@pytest.mark.skipif(SQUASHFUSE is None or FUSERMOUNT is None,
                    reason="squashfuse or fusermount3 missing: apt-get install squashfuse fuse3")
@pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="no /dev/fuse on this machine")
def test_squashfuse_mounts_the_partition_by_offset(good: Path, tmp_path: Path):
    offset = sif.primary_partition(sif.read_sif(good)).offset
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run([SQUASHFUSE, "-o", f"offset={offset}", str(good), str(mnt)], check=True,
                   capture_output=True, timeout=30)
    try:
        assert (mnt / "etc" / "hello").read_text() == "hello from the squashfs\n"
        assert (mnt / "opt" / "big" / "blob").stat().st_size == 32 * 2048
    finally:
        subprocess.run([FUSERMOUNT, "-u", str(mnt)], check=True, capture_output=True, timeout=30)
    assert not os.path.ismount(mnt)


# --- writing safely ----------------------------------------------------------


def test_failed_write_leaves_nothing(tmp_path: Path, squashfs: Path, monkeypatch):
    def boom(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(sif, "_copy_into", boom)
    with pytest.raises(OSError):
        write(tmp_path / "x.sif", squashfs)
    assert list(tmp_path.iterdir()) == []


def test_sigkill_mid_write_leaves_no_final_name_and_next_write_cleans_up(tmp_path: Path, squashfs: Path):
    target = tmp_path / "out.sif"
    code = textwrap.dedent(f"""
        import time
        from envport.sif import format as sif
        def slow(*a, **k):
            time.sleep(60)
        sif._copy_into = slow
        sif.write_sif({str(target)!r}, deffile=b"d", inspect_metadata=b"{{}}",
                      squashfs_path={str(squashfs)!r}, created=1, uuid=bytes(16))
    """)
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 30
        while not list(tmp_path.glob(".out.sif.partial-*")) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert list(tmp_path.glob(".out.sif.partial-*")), "the writer never started"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert not target.exists()
    write(target, squashfs)
    assert sif.read_sif(target).descriptors[2].size == squashfs.stat().st_size
    assert [p.name for p in tmp_path.iterdir()] == ["out.sif"]


def test_refuses_a_non_squashfs_partition(tmp_path: Path):
    junk = tmp_path / "junk"
    junk.write_bytes(b"not squashfs at all")
    with pytest.raises(SifError) as err:
        sif.write_sif(tmp_path / "x.sif", deffile=DEF, inspect_metadata=META, squashfs_path=junk,
                      created=CREATED, uuid=UUID)
    assert err.value.reason == "bad_squashfs"
    assert not (tmp_path / "x.sif").exists()


# --- malformed input: one reason token each, never a traceback ---------------


def reason(fn, *args, **kw) -> str:
    with pytest.raises(SifError) as err:
        fn(*args, **kw)
    assert err.value.message and str(err.value) == err.value.message
    return err.value.reason


def patched(src: Path, dst: Path, at: int, data: bytes) -> Path:
    raw = bytearray(src.read_bytes())
    raw[at:at + len(data)] = data
    dst.write_bytes(bytes(raw))
    return dst


DESC3 = sif.DESCRIPTORS_OFFSET + 2 * sif.DESCRIPTOR.size  # the partition's descriptor
EXTRA = DESC3 + struct.calcsize("<i?IIIqqqqqqq128s")  # its fs type, partition type, arch


def test_empty_file(tmp_path: Path):
    (tmp_path / "e.sif").write_bytes(b"")
    assert reason(sif.read_sif, tmp_path / "e.sif") == "empty_file"


def test_directory_and_missing(tmp_path: Path):
    assert reason(sif.read_sif, tmp_path) == "not_a_file"
    assert reason(sif.read_sif, tmp_path / "nope.sif") == "not_found"


def test_not_a_sif(tmp_path: Path, squashfs: Path):
    (tmp_path / "t.sif").write_text("#!/bin/sh\necho I am a shell script pretending\n" * 10)
    assert reason(sif.read_sif, tmp_path / "t.sif") == "not_a_sif"
    with pytest.raises(SifError) as err:
        sif.read_sif(squashfs)
    assert err.value.reason == "not_a_sif" and "bare squashfs" in err.value.message


@pytest.mark.parametrize("cut", [20, 40, 100, 4000, 20000, 32176 + 3])
def test_truncated_in_header_table_or_data(good: Path, tmp_path: Path, cut: int):
    bad = tmp_path / "cut.sif"
    bad.write_bytes(good.read_bytes()[:cut])
    assert reason(sif.read_sif, bad) == "truncated"


def test_truncated_in_the_partition(good: Path, tmp_path: Path):
    bad = tmp_path / "cut.sif"
    bad.write_bytes(good.read_bytes()[:-1000])
    with pytest.raises(SifError) as err:
        sif.read_sif(bad)
    assert err.value.reason == "truncated" and "1000 bytes missing" in err.value.message


def test_wrong_version(good: Path, tmp_path: Path):
    assert reason(sif.read_sif, patched(good, tmp_path / "v.sif", 42, b"02\0")) == "unsupported_version"


def test_descriptor_pointing_past_eof(good: Path, tmp_path: Path):
    size_field = DESC3 + struct.calcsize("<i?IIIq")
    bad = patched(good, tmp_path / "d.sif", size_field, struct.pack("<q", 1 << 40))
    assert reason(sif.read_sif, bad) == "corrupt_descriptor"


def test_inconsistent_header(good: Path, tmp_path: Path):
    dtotal = struct.calcsize("<32s10s3s3s16sqqq")
    assert reason(sif.read_sif, patched(good, tmp_path / "h.sif", dtotal, struct.pack("<q", 0))) == \
        "corrupt_header"


def test_no_primary_partition(good: Path, tmp_path: Path):
    info = sif.read_sif(patched(good, tmp_path / "p.sif", EXTRA + 4, struct.pack("<i", 1)))  # System
    assert info.descriptors[2].partition_name == "System"
    assert reason(sif.primary_partition, info) == "no_primary_partition"


def test_foreign_arch(good: Path, tmp_path: Path):
    info = sif.read_sif(patched(good, tmp_path / "a.sif", EXTRA + 8, b"04\0"))  # arm64
    assert info.descriptors[2].arch == "arm64"
    assert reason(sif.primary_partition, info, arch="amd64") == "foreign_arch"
    assert reason(sif.primary_partition, sif.read_sif(good), arch="arm64") == "foreign_arch"


def test_partition_not_squashfs(good: Path, tmp_path: Path):
    info = sif.read_sif(patched(good, tmp_path / "f.sif", EXTRA, struct.pack("<i", 2)))  # Ext3
    assert reason(sif.primary_partition, info, arch="amd64") == "unsupported_filesystem"


def test_damaged_squashfs(good: Path, tmp_path: Path):
    offset = sif.primary_partition(sif.read_sif(good)).offset
    bad = patched(good, tmp_path / "s.sif", offset, b"\0\0\0\0")
    assert reason(sif.read_squashfs_superblock, bad, offset) == "bad_squashfs"


def test_object_too_large_to_read(good: Path):
    info = sif.read_sif(good)
    assert reason(sif.read_object, info, info.descriptors[2], limit=1024) == "too_large"


def test_any_cut_or_flipped_byte_gives_sif_error_or_a_valid_read(good: Path, tmp_path: Path):
    """Never an IndexError or struct.error, whatever the damage."""
    raw = good.read_bytes()
    bad = tmp_path / "fuzz.sif"
    cuts = list(range(0, 33000, 61)) + [len(raw) - 1]
    for cut in cuts:
        bad.write_bytes(raw[:cut])
        with pytest.raises(SifError):
            sif.read_sif(bad)
    for at in list(range(0, 128)) + list(range(4096, 4096 + 3 * 585, 7)):
        for value in (0x00, 0xFF, 0x80):
            bad.write_bytes(raw[:at] + bytes([value]) + raw[at + 1:])
            try:
                info = sif.read_sif(bad)
                part = sif.primary_partition(info, arch="amd64")
                sif.read_squashfs_superblock(bad, part.offset)
            except SifError:
                pass

"""envport's own squashfs writer (sif/squashfs_writer.py) and its block store (sif/squash_blocks.py), on one
small tree holding every kind of entry the format has, against squashfs-tools itself:

- gzip: the image equals, byte for byte, what `mksquashfs -no-fragments -no-exports -no-xattrs`
  (squashfs-tools 4.5, Debian 12's) writes of the same tree; `unsquashfs -lln` lists both the same, and
  what unsquashfs extracts has every file's content, mode, owner, time and hard link;
- zstd: the same listing and extracted tree; the superblock's fields but the tables' places equal
  mksquashfs -comp zstd's; the bytes equal where python-zstandard carries the libzstd mksquashfs links
  (checked when it does: its frames are another libzstd's otherwise);
- a level other than the default: the compressor options block and flag where mksquashfs writes them;
- the kernel (a loop mount, as root) and squashfuse read it back, gzip and zstd;
- the same tree gives the same bytes twice; with a store of the first image's blocks, a second write after
  one file changed compresses only that file's blocks and gives the bytes a write without the store gives
  (gzip and zstd); a gzip pack is never used for a zstd write;
- a damaged pack is named, not used, and the image is still right.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import json
import os
import shutil
import socket
import stat
import struct
import subprocess
from pathlib import Path

import pytest

from envport.sif import squash_blocks
from envport.sif.squashfs_writer import BLOCK_SIZE, SUPERBLOCK, WriterError, params, write_image

T = 1234567890


def _need(*tools: str) -> None:
    absent = [t for t in tools if shutil.which(t) is None]
    if absent:
        pytest.skip(f"{', '.join(absent)} not installed (apt-get install squashfs-tools squashfuse)")


def _tree(top: Path) -> Path:
    """Every entry kind, sizes around the block size, names odd and long, owners and times not root's."""
    root = top / "tree"
    (root / "many").mkdir(parents=True)
    (root / "wide").mkdir()
    (root / "deep" / "er" / "est").mkdir(parents=True)
    (root / "empty-dir").mkdir()
    files = {
        "zero": b"",
        "small": b"hello squashfs\n",
        "one-block": bytes(range(256)) * (BLOCK_SIZE // 256),
        "several": b"".join(b"line %08d of several blocks\n" % i for i in range(20000)),
        "incompressible": hashlib.shake_256(b"envport").digest(BLOCK_SIZE + 5000),
        "zero-blocks-inside": b"head" + bytes(2 * BLOCK_SIZE) + b"tail" + bytes(BLOCK_SIZE),
        "duplicate-of-small": b"hello squashfs\n",
        "deep/er/est/leaf": b"leaf\n",
        "name with spaces & 'quotes'": b"x",
        "unicod\u00e9-\u6587\u4ef6": b"y",
        "l" * 255: b"the longest name\n",
    }
    for rel, data in files.items():
        (root / rel).write_bytes(data)
    os.symlink("small", root / "link-to-small")
    os.symlink("/nonexistent/" + "t" * 300, root / "dangling")
    os.link(root / "several", root / "deep" / "hard-1")
    os.link(root / "several", root / "many" / "hard-2")
    os.link(root / "small", root / "wide" / "hard-small")
    with open(os.path.join(os.fsencode(root), b"bytes-\xff\xfe"), "wb") as fh:
        fh.write(b"not utf-8 name\n")
    for i in range(300):  # more than 256 entries: several directory runs
        (root / "many" / f"f{i:03d}").write_bytes(b"%d\n" % (i % 7))
    for i in range(330):  # a listing over 64 KiB: an extended directory with an index
        (root / "wide" / (f"{i:03d}-" + "w" * 200)).write_bytes(b"")
    os.mkfifo(root / "fifo")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(root / "sock"))
    sock.close()
    if os.geteuid() == 0:
        os.mknod(root / "null-dev", stat.S_IFCHR | 0o666, os.makedev(1, 3))
        os.mknod(root / "big-minor", stat.S_IFBLK | 0o600, os.makedev(259, 70000))
        os.chown(root / "small", 1234, 5678)
        os.chown(root / "deep", 4321, 1234, follow_symlinks=False)
        os.chown(root / "link-to-small", 99, 98, follow_symlinks=False)
    os.chmod(root / "several", 0o4755)
    os.chmod(root / "deep" / "er", 0o2750)
    for n, path in enumerate(sorted(root.rglob("*"))):
        os.utime(path, (T + n, T + 1000 * n), follow_symlinks=False)
    os.utime(root, (T, T))
    return root


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    return _tree(tmp_path_factory.mktemp("sqfs"))


def _mksquashfs(root: Path, out: Path, *comp: str) -> Path:
    subprocess.run(["mksquashfs", str(root), str(out), "-noappend", *comp, "-no-fragments", "-no-exports",
                    "-no-xattrs", "-mkfs-time", str(T), "-quiet", "-no-progress"], check=True, capture_output=True,
                   env={k: v for k, v in os.environ.items() if k != "SOURCE_DATE_EPOCH"})
    return out


def _superblock_but_places(image: Path) -> tuple:
    """The superblock's fields but where the tables are (which move with the compressed sizes): magic, inode
    count, mkfs time, block size, fragments, compression id, block log, flags, id count, version; and the
    xattr and export tables' (absent) places."""
    fields = SUPERBLOCK.unpack_from(image.read_bytes())
    return fields[:11] + (fields[14], fields[18])


def _same_libzstd_as_mksquashfs() -> bool:
    """python-zstandard's libzstd is the one mksquashfs links (the system's): its frames are mksquashfs' bytes."""
    import zstandard

    found = ctypes.util.find_library("zstd")
    if found is None:
        return False
    number = ctypes.CDLL(found).ZSTD_versionNumber()
    return zstandard.ZSTD_VERSION == (number // 10000, number // 100 % 100, number % 100)


def _listing(image: Path) -> bytes:
    return subprocess.run(["unsquashfs", "-lln", "-d", "", str(image)], check=True, capture_output=True).stdout


def _manifest(root: Path) -> dict:
    """path -> (mode, uid, gid, mtime, content sha256 or link target or device, the first path of its hard-link
    group or None)."""
    out, groups = {}, {}
    top = os.fsencode(root)
    for folder, dirs, files in os.walk(top):
        for name in sorted(dirs + files):
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, top)
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode):
                what = hashlib.sha256(open(path, "rb").read()).hexdigest()
            elif stat.S_ISLNK(st.st_mode):
                what = os.readlink(path)
            else:
                what = st.st_rdev if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else ""
            if st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode):
                groups.setdefault(st.st_ino, []).append(rel)
            mtime = None if stat.S_ISDIR(st.st_mode) else int(st.st_mtime)  # extracting a dir sets its time
            out[rel] = [st.st_mode, st.st_uid, st.st_gid, mtime, what, None]
    for paths in groups.values():
        for rel in paths:
            out[rel][5] = min(paths)
    return {k: tuple(v) for k, v in out.items()}


def test_the_image_is_what_mksquashfs_writes_and_reads_back_whole(tree, tmp_path):
    _need("mksquashfs", "unsquashfs")
    ours = tmp_path / "ours.sqfs"
    result = write_image(tree, ours, mkfs_time=T)
    theirs = _mksquashfs(tree, tmp_path / "theirs.sqfs")
    assert _listing(ours) == _listing(theirs)
    assert ours.read_bytes() == theirs.read_bytes(), "the same tree, other bytes than mksquashfs -no-fragments"
    assert result.size == ours.stat().st_size and result.size % 4096 == 0
    assert result.files_compressed == len({m[4] for m in _manifest(tree).values()
                                           if isinstance(m[4], str) and len(m[4]) == 64}) - 1  # less the empty file
    out = tmp_path / "out"
    subprocess.run(["unsquashfs", "-d", str(out), "-no-xattrs", str(ours)], check=True, capture_output=True)
    assert _manifest(out) == _manifest(tree)


def test_every_inode_takes_one_mtime_when_asked(tree, tmp_path):
    _need("mksquashfs")
    ours = write_image(tree, tmp_path / "ours.sqfs", mtime=T, mkfs_time=T)
    subprocess.run(["mksquashfs", str(tree), str(tmp_path / "theirs.sqfs"), "-noappend", "-no-fragments",
                    "-no-exports", "-no-xattrs", "-all-time", str(T), "-mkfs-time", str(T), "-quiet",
                    "-no-progress"], check=True, capture_output=True)
    assert ours.size and (tmp_path / "ours.sqfs").read_bytes() == (tmp_path / "theirs.sqfs").read_bytes()


@pytest.mark.parametrize("compressor", ["gzip", "zstd"])
def test_the_kernel_and_squashfuse_read_it(tree, tmp_path, compressor):
    _need("squashfuse", "fusermount")
    image = tmp_path / "ours.sqfs"
    write_image(tree, image, compressor=compressor, mkfs_time=T)
    want = {k: v[4] for k, v in _manifest(tree).items()}
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["squashfuse", str(image), str(mnt)], check=True, capture_output=True)
    try:
        assert {k: v[4] for k, v in _manifest(mnt).items()} == want
    finally:
        subprocess.run(["fusermount", "-u", str(mnt)], check=True)
    if os.geteuid() != 0:
        pytest.skip("the kernel's squashfs (mount -o loop) needs root; squashfuse read it")
    proc = subprocess.run(["mount", "-t", "squashfs", "-o", "loop,ro", str(image), str(mnt)], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        # Only a kernel that cannot mount mksquashfs' own image of this compressor either (no
        # CONFIG_SQUASHFS_ZSTD, no loop device) is a reason to skip; otherwise our image is at fault.
        _need("mksquashfs")
        reference = tmp_path / "mksquashfs.sqfs"
        subprocess.run(["mksquashfs", str(tree), str(reference), "-comp", compressor, "-quiet"], check=True,
                       capture_output=True)
        ref = subprocess.run(["mount", "-t", "squashfs", "-o", "loop,ro", str(reference), str(mnt)],
                             capture_output=True, text=True)
        if ref.returncode == 0:
            subprocess.run(["umount", str(mnt)], check=True)
            pytest.fail(f"the kernel mounts mksquashfs' {compressor} image but not ours: {proc.stderr.strip()}")
        pytest.skip(f"the kernel mounts no {compressor} squashfs here (squashfuse read ours): {ref.stderr.strip()}")
    try:
        assert _manifest(mnt) == _manifest(tree)
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_zstd_reads_back_as_the_tree_with_mksquashfs_superblock(tree, tmp_path):
    _need("mksquashfs", "unsquashfs")
    ours = tmp_path / "ours.sqfs"
    write_image(tree, ours, compressor="zstd", mkfs_time=T)
    theirs = _mksquashfs(tree, tmp_path / "theirs.sqfs", "-comp", "zstd")
    assert _listing(ours) == _listing(theirs)
    assert _superblock_but_places(ours) == _superblock_but_places(theirs)
    assert _superblock_but_places(ours)[5] == 6  # zstd's compression id
    out = tmp_path / "out"
    subprocess.run(["unsquashfs", "-d", str(out), "-no-xattrs", str(ours)], check=True, capture_output=True)
    assert _manifest(out) == _manifest(tree)
    if _same_libzstd_as_mksquashfs():
        assert ours.read_bytes() == theirs.read_bytes(), "the same libzstd, other bytes than mksquashfs -comp zstd"


@pytest.mark.parametrize("compressor,level,options", [("gzip", 6, struct.pack("<ihh", 6, 15, 0)),
                                                      ("zstd", 3, struct.pack("<i", 3))], ids=["gzip-6", "zstd-3"])
def test_a_level_not_the_default_writes_the_options_mksquashfs_writes(tree, tmp_path, compressor, level, options):
    _need("mksquashfs", "unsquashfs")
    ours = tmp_path / "ours.sqfs"
    write_image(tree, ours, compressor=compressor, level=level, mkfs_time=T)
    theirs = _mksquashfs(tree, tmp_path / "theirs.sqfs", "-comp", compressor, "-Xcompression-level", str(level))
    head = SUPERBLOCK.size
    # an uncompressed metadata block (bit 15 of its size word) right after the superblock, and the COMP_OPT flag
    assert ours.read_bytes()[head:head + 2 + len(options)] == struct.pack("<H", len(options) | 0x8000) + options
    assert theirs.read_bytes()[head:head + 2 + len(options)] == ours.read_bytes()[head:head + 2 + len(options)]
    assert _superblock_but_places(ours) == _superblock_but_places(theirs) and _superblock_but_places(ours)[7] & 0x400
    assert _listing(ours) == _listing(theirs)
    out = tmp_path / "out"
    subprocess.run(["unsquashfs", "-d", str(out), "-no-xattrs", str(ours)], check=True, capture_output=True)
    assert _manifest(out) == _manifest(tree)
    if compressor == "gzip" or _same_libzstd_as_mksquashfs():
        assert ours.read_bytes() == theirs.read_bytes()


def _pack(image: Path, result, where: Path) -> Path:
    where.mkdir()
    squash_blocks.write_pack(where, image, result)
    return where


@pytest.mark.parametrize("compressor", ["gzip", "zstd"])
def test_the_same_tree_gives_the_same_bytes_and_a_store_compresses_only_what_changed(tree, tmp_path, compressor):
    first, again = tmp_path / "1.sqfs", tmp_path / "2.sqfs"
    result = write_image(tree, first, compressor=compressor, mtime=T, mkfs_time=T)
    write_image(tree, again, compressor=compressor, mtime=T, mkfs_time=T)
    assert first.read_bytes() == again.read_bytes()
    pack = _pack(first, result, tmp_path / "pack")

    edited = tmp_path / "edited"
    subprocess.run(["cp", "-a", str(tree), str(edited)], check=True)  # fifo, socket, devices, hard links
    (edited / "several").write_bytes(b"edited\n" * 50000)  # 350 kB: 3 blocks; its hard links change with it
    plain, reused = tmp_path / "plain.sqfs", tmp_path / "reused.sqfs"
    write_image(edited, plain, compressor=compressor, mtime=T, mkfs_time=T)
    store = squash_blocks.BlockStore([pack], params(compressor))
    try:
        stats = write_image(edited, reused, compressor=compressor, mtime=T, mkfs_time=T, store=store)
    finally:
        store.close()
    assert reused.read_bytes() == plain.read_bytes()
    assert stats.blocks_compressed == 3 and stats.files_compressed == 1
    assert stats.files_reused == result.files_compressed - 1 and not store.bad


def test_a_gzip_pack_is_never_used_for_a_zstd_write(tree, tmp_path):
    image = tmp_path / "gzip.sqfs"
    pack = _pack(image, write_image(tree, image, mtime=T, mkfs_time=T), tmp_path / "pack")
    assert json.loads((pack / squash_blocks.INDEX).read_text())["params"]["compressor"] == "gzip"
    store = squash_blocks.BlockStore([pack], params("zstd"))
    plain, through = tmp_path / "plain.sqfs", tmp_path / "through.sqfs"
    try:
        assert store.index == {} and store.packs == [] and not store.bad
        stats = write_image(tree, through, compressor="zstd", mtime=T, mkfs_time=T, store=store)
    finally:
        store.close()
    write_image(tree, plain, compressor="zstd", mtime=T, mkfs_time=T)
    assert stats.files_reused == 0 and through.read_bytes() == plain.read_bytes()
    gzip_store = squash_blocks.BlockStore([pack], params("gzip"))
    try:
        assert gzip_store.index
        with pytest.raises(WriterError, match="block store of"):  # the writer refuses blocks of other params
            write_image(tree, tmp_path / "mixed.sqfs", compressor="zstd", store=gzip_store)
    finally:
        gzip_store.close()


def test_a_damaged_pack_is_named_and_not_used(tree, tmp_path):
    image = tmp_path / "1.sqfs"
    result = write_image(tree, image, mtime=T, mkfs_time=T)
    pack = _pack(image, result, tmp_path / "pack")
    where = result.files[hashlib.sha256((tree / "several").read_bytes()).hexdigest()].start
    with open(pack / squash_blocks.PACK, "r+b") as fh:
        fh.seek(where + 10)
        byte = fh.read(1)
        fh.seek(where + 10)
        fh.write(bytes([byte[0] ^ 0xFF]))
    said: list[str] = []
    store = squash_blocks.BlockStore([pack], params(), say=said.append)
    again = tmp_path / "2.sqfs"
    try:
        stats = write_image(tree, again, mtime=T, mkfs_time=T, store=store)
    finally:
        store.close()
    assert again.read_bytes() == image.read_bytes()
    assert list(store.bad) == [pack] and any(str(pack) in line and "damaged" in line for line in said)
    assert stats.files_compressed >= 1  # the damaged file and every one asked after it: compressed afresh

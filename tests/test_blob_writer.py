"""engines/blob_writer: a pulled blob hashed and written on two threads, O_DIRECT where the file system
takes it. Real files under tmp_path, real O_DIRECT writes (the kernel's EINVAL for an unaligned one is
what the fallback is tested with), no mocks."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os

import pytest

from envport.engines.blob_writer import LOCAL_FS, O_DIRECT, BlobWriter, fs_type, open_new

pytestmark = pytest.mark.skipif(not O_DIRECT, reason="no O_DIRECT on this platform")


def _data(n: int) -> bytes:
    return hashlib.shake_256(b"blob").digest(n)


def _direct(fd: int) -> bool:
    return bool(fcntl.fcntl(fd, fcntl.F_GETFL) & O_DIRECT)


@pytest.mark.parametrize("size", [0, 4096, 3 * 65536, 3 * 65536 + 1234], ids=["empty", "one-page", "whole-blocks",
                                                                             "part-block-tail"])
def test_every_byte_lands_and_the_digest_is_the_files(tmp_path, size):
    path, data = tmp_path / "blob", _data(size)
    fd = open_new(path)
    try:
        assert _direct(fd), f"tmp_path is on {fs_type(tmp_path)}: the O_DIRECT path is the one under test"
        with BlobWriter(fd, block=65536, buffers=3) as sink:
            for at in range(0, size, 10_000):  # writes that straddle blocks, as network chunks do
                sink.write(data[at:at + 10_000])
            digest = sink.close()
    finally:
        os.close(fd)
    assert digest == hashlib.sha256(data).hexdigest() and sink.bytes == size
    assert path.read_bytes() == data
    assert sink.direct == (size % 65536 == 0), "only a part-block tail leaves O_DIRECT"


def test_a_write_the_kernel_refuses_for_o_direct_is_made_buffered(tmp_path):
    """A block of 6,000 bytes is no multiple of the logical block size: the kernel answers EINVAL to the
    O_DIRECT pwrite, and the writer goes on with buffered writes rather than failing."""
    path, data = tmp_path / "blob", _data(20_000)
    fd = open_new(path)
    try:
        with pytest.raises(OSError) as refused:
            os.pwrite(fd, data[:6000], 0)
        assert refused.value.errno == errno.EINVAL  # what the fallback stands on
        with BlobWriter(fd, block=6000, buffers=2) as sink:
            sink.write(data)
            digest = sink.close()
        assert not sink.direct and not _direct(fd)
    finally:
        os.close(fd)
    assert path.read_bytes() == data and digest == hashlib.sha256(data).hexdigest()


def test_a_failing_write_is_raised_to_the_caller_not_swallowed(tmp_path):
    path = tmp_path / "blob"
    path.write_bytes(b"")
    fd = os.open(path, os.O_RDONLY)  # every pwrite: EBADF, in the writer's thread
    try:
        sink = BlobWriter(fd, block=4096, buffers=2)
        with pytest.raises(OSError) as failed:
            for _ in range(64):  # the failure surfaces at a later write or at close
                sink.write(_data(4096))
            sink.close()
        assert failed.value.errno == errno.EBADF
        sink.abort()
    finally:
        os.close(fd)
    assert path.read_bytes() == b""


def test_the_partial_must_be_new(tmp_path):
    (tmp_path / "blob").write_bytes(b"x")
    with pytest.raises(FileExistsError):
        open_new(tmp_path / "blob")


def test_o_direct_only_on_a_local_block_file_system(tmp_path):
    """The choice reads this process's real mount table: tmp_path is on a local disk here (ext4), /dev/shm
    is tmpfs, /proc is proc."""
    assert fs_type(tmp_path) in LOCAL_FS, fs_type(tmp_path)
    assert fs_type("/proc/self") == "proc"
    shm = os.path.join("/dev/shm", f"envport-test-{os.getpid()}")
    if fs_type(os.path.dirname(shm)) != "tmpfs":
        pytest.skip(f"/dev/shm is {fs_type('/dev/shm') or 'absent'} here, not tmpfs: no non-local file system to write to")
    fd = open_new(shm)
    try:
        assert not _direct(fd), "tmpfs is memory: buffered writes"
    finally:
        os.close(fd)
        os.unlink(shm)


def test_the_mount_table_is_read_as_the_kernel_writes_it(tmp_path):
    """Longest mount point wins; octal escapes (a space is \\040) are decoded; a network mount is no local
    file system; an unreadable table is "" (buffered writes)."""
    table = tmp_path / "mountinfo"
    table.write_text(
        "22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
        "40 22 0:40 / /shared rw,relatime shared:20 - nfs4 fs:/export rw,vers=4.2\n"
        "41 40 0:41 / /shared/my\\040sifs rw,relatime shared:21 - lustre 10.0.0.1@tcp:/fs rw\n"
        "42 22 0:42 / /scratch rw - xfs /dev/nvme0n1 rw\n")
    assert fs_type("/", str(table)) == "ext4"
    assert fs_type("/shared/sifs", str(table)) == "nfs4"
    assert fs_type("/shared/my sifs/a.sif", str(table)) == "lustre"
    assert fs_type("/scratch/x", str(table)) == "xfs" and fs_type("/scratchy", str(table)) == "ext4"
    assert {"nfs4", "lustre"}.isdisjoint(LOCAL_FS)
    assert fs_type("/", str(tmp_path / "absent")) == ""

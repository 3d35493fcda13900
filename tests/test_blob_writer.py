"""engines/blob_writer: a pulled blob hashed and written on two threads, O_DIRECT where the file system
takes it. Real files under tmp_path, real O_DIRECT writes (the kernel's EINVAL for an unaligned one is
what the fallback is tested with), no mocks."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os

import pytest

from envport.engines.blob_writer import O_DIRECT, BlobWriter, open_new

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
        assert _direct(fd), "ext4/tmpfs here take O_DIRECT: the fast path is the one under test"
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

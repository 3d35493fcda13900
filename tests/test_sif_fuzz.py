"""Property test (issue 21): whatever a SIF's header, descriptor table and metadata objects hold, reading it
ends in a report or a reason token, never a traceback, and what is printed holds no raw control character.

The reader is the real one (`envport inspect`'s read_report, verdict and printer, in this process);
hypothesis writes each generated file to disk.  2,400 examples in all (max_examples below, explicit),
with one small real squashfs partition (mksquashfs) where a partition is needed.  Bounded: the test has
a timeout, and the peak of Python allocations over every example stays under a fixed ceiling.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import struct
import subprocess
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envport.sif.report import failure, read_report, verdict
from envport.commands.inspect import _print_facts
from envport.sif.format import (DATA_OFFSET, DESCRIPTOR, DESCRIPTOR_SLOTS, DESCRIPTORS_OFFSET, HEADER,
                                 LAUNCH_SCRIPT, MAGIC, VERSION, SifError, write_sif)

from .support import missing

TOKEN = re.compile(r"[a-z][a-z_]*\Z")
MEMORY_CEILING = 256 << 20  # any one example: far above what a 40 KB file needs, far below a blow-up
SETTINGS = dict(deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
i64 = st.integers(-2**63, 2**63 - 1)
small = st.one_of(st.integers(-2, 4), st.integers(0, 1 << 17), i64)


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """One folder for every example: each overwrites the same file (a folder per example cost more than
    the reading)."""
    return tmp_path_factory.mktemp("fuzz")


@pytest.fixture(scope="module")
def partition(tmp_path_factory) -> bytes:
    """A real squashfs holding a labels.json (what a SIF's partition should be)."""
    tree = tmp_path_factory.mktemp("fuzz-tree")
    (tree / ".singularity.d" / "env").mkdir(parents=True)
    (tree / ".singularity.d" / "labels.json").write_text('{"envport.hash": "0"}')
    out = tree.parent / "fuzz.sqfs"
    try:
        subprocess.run(["mksquashfs", str(tree), str(out), "-noappend", "-quiet", "-no-progress"], check=True)
    except FileNotFoundError:
        missing("mksquashfs not installed (apt-get install squashfs-tools)")
    return out.read_bytes()


def _judge(path: Path) -> None:
    """The property: a report or a SifError with a token; the verdict and the printed text are clean."""
    tracemalloc.start()
    try:
        report, problem = read_report(path)
        if problem is not None:
            assert isinstance(problem, SifError) and TOKEN.match(problem.reason), problem
            result = failure(report, problem)
        else:
            result = verdict(report, None)
        json.dumps(report.facts)  # --json prints it
        text = io.StringIO()
        with contextlib.redirect_stdout(text):
            _print_facts(report)
        assert not re.search(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]", text.getvalue()), text.getvalue()[:500]
        assert result.verdict.value in ("OK", "skipped", "REFUSED", "FAILED")
        assert result.reason == "" or TOKEN.match(result.reason), result
        _, peak = tracemalloc.get_traced_memory()
        assert peak < MEMORY_CEILING, peak
    finally:
        tracemalloc.stop()


any_headers = st.tuples(
    st.one_of(st.just(LAUNCH_SCRIPT), st.binary(max_size=32)), st.one_of(st.just(MAGIC), st.binary(max_size=10)),
    st.one_of(st.just(VERSION), st.binary(max_size=3)), st.sampled_from([b"02\0", b"04\0", b"00\0", b"\xff\xff\xff"]),
    st.binary(min_size=16, max_size=16), i64, i64, small, small, st.one_of(st.just(DESCRIPTORS_OFFSET), small),
    st.one_of(st.just(DESCRIPTOR_SLOTS * DESCRIPTOR.size), small), st.one_of(st.just(DATA_OFFSET), small), small)
# Half the examples: a whole, consistent table, so what the reader does after the header is reached too
# (the times, the arch, the uuid, the launch script are still anything).
whole_headers = st.tuples(
    st.one_of(st.just(LAUNCH_SCRIPT), st.binary(max_size=32)), st.just(MAGIC), st.just(VERSION),
    st.one_of(st.sampled_from([b"02\0", b"04\0", b"00\0"]), st.binary(min_size=3, max_size=3)),
    st.binary(min_size=16, max_size=16), i64, i64, st.integers(0, DESCRIPTOR_SLOTS), st.just(DESCRIPTOR_SLOTS),
    st.just(DESCRIPTORS_OFFSET), st.just(DESCRIPTOR_SLOTS * DESCRIPTOR.size), st.just(DATA_OFFSET),
    st.integers(0, 4096))
headers = st.one_of(whole_headers, any_headers)


@settings(max_examples=1000, **SETTINGS)
@given(fields=headers, cut=st.one_of(st.none(), st.integers(0, DATA_OFFSET + 64)))
@pytest.mark.timeout(600)
def test_any_header(fields, cut, work):
    raw = HEADER.pack(*fields).ljust(DATA_OFFSET + 4096, b"\0")
    path = work / "x.sif"
    path.write_bytes(raw if cut is None else raw[:cut])
    _judge(path)


descriptors = st.lists(st.tuples(
    st.sampled_from([0x4001, 0x4002, 0x4003, 0x4004, 0x4005, 0x4006, 0x4009, 0, -1, 0x7FFFFFFF]), st.booleans(),
    st.integers(0, 2**32 - 1), st.sampled_from([0xF0000001, 0xF0000000, 0, 2**32 - 1]), st.integers(0, 2**32 - 1),
    st.one_of(st.integers(DATA_OFFSET, DATA_OFFSET + 8192), small), st.one_of(st.integers(0, 8192), small), small,
    i64, i64, small, small,
    st.one_of(st.sampled_from([b"inspect-metadata.json", b"envport-spec.json", b""]), st.binary(max_size=128)),
    st.one_of(st.just(struct.pack("<ii3s", 1, 2, b"02\0")), st.binary(max_size=384))), max_size=6)


@settings(max_examples=700, **SETTINGS)
@given(table=descriptors, data=st.binary(max_size=8192))
@pytest.mark.timeout(600)
def test_any_descriptor_table(table, data, work):
    entries = b"".join(DESCRIPTOR.pack(*d) for d in table).ljust(DESCRIPTOR_SLOTS * DESCRIPTOR.size, b"\0")
    head = HEADER.pack(LAUNCH_SCRIPT, MAGIC, VERSION, b"02\0", bytes(16), 0, 0, DESCRIPTOR_SLOTS - len(table),
                       DESCRIPTOR_SLOTS, DESCRIPTORS_OFFSET, len(entries), DATA_OFFSET, len(data))
    path = work / "x.sif"
    path.write_bytes(head.ljust(DESCRIPTORS_OFFSET, b"\0") + entries + data)
    _judge(path)


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=40)),
    lambda kids: st.one_of(st.lists(kids, max_size=4), st.dictionaries(st.text(max_size=12), kids, max_size=4)),
    max_leaves=20)
metadata = st.one_of(
    json_values.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries({"data": st.fixed_dictionaries({"attributes": st.fixed_dictionaries(
        {"labels": json_values, "environment": json_values, "runscript": json_values})})}).map(
            lambda v: json.dumps(v).encode()),
    st.integers(1, 200_000).map(lambda n: b"[" * n + b"]" * n),
    st.binary(max_size=300))


@settings(max_examples=700, **SETTINGS)
@given(meta=metadata, spec=metadata)
@pytest.mark.timeout(600)
def test_any_metadata_objects(meta, spec, partition, work):
    sqfs = work / "p.sqfs"
    if not sqfs.exists():
        sqfs.write_bytes(partition)
    path = work / "x.sif"
    write_sif(path, deffile=b"Bootstrap: scratch\n", inspect_metadata=meta, squashfs_path=sqfs, created=0,
              uuid=bytes(16), extra_json=(("envport-spec.json", spec),))
    _judge(path)

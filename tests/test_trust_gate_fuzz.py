"""The trust gate against crafted descriptor tables (issue 35): nothing passes the gate unless the bytes it
would mount are the signed bytes.

A small SIF (a real squashfs, written by sif/format.write_sif) is signed with a fresh Ed25519 key and a
copy of its partition with one byte changed is appended to it, as an attacker would.  Hypothesis then
rewrites the descriptor table as someone holding the file can (none of these fields is signed, or each
change breaks a signature): descriptors duplicated into any slot (same ID or not) pointing at the signed
bytes, the tampered copy, or overlapping another object; slots reordered; objects moved, regrouped or
retyped as primary partitions.  For every table, `gate()` under `trust.require_signed` either refuses, or
the partition it hands the mount (`Gated.partition`, read from `Gated.file`) holds exactly the signed
bytes.  The mount reads those (sif/run.py `mounted`), so nothing else can be mounted.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from envport.core.errors import EnvportError
from envport.plan import site as site_mod
from envport.sif import gate as gate_mod
from envport.sif.format import DATA_PARTITION, FS_SQUASHFS, GROUP_MASK, PART_PRIMSYS, PARTITION_EXTRA, write_sif
from envport.sif.handle import SifError
from envport.sif.header import DESCRIPTOR, HEADER
from envport.sif.keys import load_private_key
from envport.sif.sign import sign_sif

from .support import missing
from .test_sif_sign import new_key

EXAMPLES = 2000


@pytest.fixture(scope="module")
def signed(tmp_path_factory):
    """(signed SIF bytes with the tampered copy appended, the signed partition's sha256 and size, pub key)."""
    if shutil.which("mksquashfs") is None:
        missing("squashfs-tools not installed (apt-get install squashfs-tools)")
    tmp = tmp_path_factory.mktemp("gatefuzz")
    tree = tmp / "tree"
    (tree / ".singularity.d").mkdir(parents=True)
    (tree / ".singularity.d" / "labels.json").write_text('{"who": "signed"}')
    (tree / "bin").mkdir()
    (tree / "bin" / "tool").write_bytes(bytes(range(256)) * 64)
    squash = tmp / "p.sqfs"
    subprocess.run(["mksquashfs", str(tree), str(squash), "-noappend", "-quiet", "-no-progress"], check=True)
    sif = tmp / "signed.sif"
    write_sif(sif, deffile=b"Bootstrap: docker\n", inspect_metadata=b'{"data":{}}', squashfs_path=squash,
              created=0, uuid=bytes(range(16)), extra_json=(("sbom.json", b'{"components":[]}'),))
    priv, pub = new_key(tmp, "ed25519")
    sign_sif(sif, [load_private_key(priv)])
    data = bytearray(sif.read_bytes())
    head = HEADER.unpack(bytes(data[:HEADER.size]))
    table = [DESCRIPTOR.unpack(bytes(data[head[9] + i * DESCRIPTOR.size:head[9] + (i + 1) * DESCRIPTOR.size]))
             for i in range(head[8])]
    part = next(t for t in table if t[1] and t[0] == DATA_PARTITION)
    good = bytes(data[part[5]:part[5] + part[6]])
    evil = bytearray(good)
    evil[len(evil) // 2] ^= 0xFF
    at = -(-len(data) // 4096) * 4096
    data.extend(bytes(at - len(data)) + evil)
    return bytes(data), hashlib.sha256(good).hexdigest(), len(good), at, str(pub)


OPS = st.lists(st.tuples(st.sampled_from(["dup", "move", "swap", "regroup", "primary", "id"]),
                         st.integers(0, 47), st.integers(0, 47), st.sampled_from(["orig", "evil", "overlap", "other"]),
                         st.integers(0, 4096)), min_size=1, max_size=4)


def mutate(data: bytes, evil_at: int, ops) -> bytes:
    data = bytearray(data)
    head = list(HEADER.unpack(bytes(data[:HEADER.size])))
    at, n = head[9], head[8]
    slots = [list(DESCRIPTOR.unpack(bytes(data[at + i * DESCRIPTOR.size:at + (i + 1) * DESCRIPTOR.size])))
             for i in range(n)]
    used = [i for i, s in enumerate(slots) if s[1]]
    for op, a, b, where, delta in ops:
        src = slots[used[a % len(used)]]
        other = slots[used[b % len(used)]]
        offset = {"orig": src[5], "evil": evil_at, "overlap": src[5] + delta,
                  "other": other[5]}[where]
        if op == "dup":  # a copy of an object's descriptor in any slot, pointing somewhere
            slots[b % n] = src[:5] + [offset] + src[6:]
        elif op == "move":  # the offset is not signed
            src[5] = offset
        elif op == "swap":  # slot order is not signed
            i, j = used[a % len(used)], b % n
            slots[i], slots[j] = slots[j], slots[i]
        elif op == "regroup":  # the group word is not signed
            src[3] = GROUP_MASK | (delta % 3)
        elif op == "primary":  # a data object retyped as a primary partition (the type is signed)
            src[0] = DATA_PARTITION
            src[13] = PARTITION_EXTRA.pack(FS_SQUASHFS, PART_PRIMSYS, b"02\0") + src[13][PARTITION_EXTRA.size:]
        elif op == "id":  # the ID is not signed (its place in the group is)
            src[2] = other[2]
        used = [i for i, s in enumerate(slots) if s[1]]
    head[7] = n - len(used)
    data[:HEADER.size] = HEADER.pack(*head)
    data[at:at + n * DESCRIPTOR.size] = b"".join(DESCRIPTOR.pack(*s) for s in slots)
    return bytes(data)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                        HealthCheck.too_slow])
@given(ops=OPS)
def test_nothing_is_mounted_unless_the_mounted_bytes_are_the_signed_bytes(signed, monkeypatch, ops):
    data, want, size, evil_at, pub = signed
    monkeypatch.setitem(site_mod._active, "require_signed", True)
    monkeypatch.setitem(site_mod._active, "keys", (pub,))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "x.sif"
        path.write_bytes(mutate(data, evil_at, ops))
        gate_mod.forget()
        try:
            gated = gate_mod.gate(path)
        except (SifError, EnvportError):
            return  # refused: nothing is mounted
        got = gated.file.read(gated.partition.offset, gated.partition.size)
        gate_mod.forget()
    assert gated.partition.size == size and hashlib.sha256(got).hexdigest() == want, ops


def test_the_untouched_signed_sif_passes_and_the_tampered_copy_alone_does_not(signed, monkeypatch, tmp_path):
    """The property above is not met by refusing everything: the signed file itself passes the gate."""
    data, want, _, evil_at, pub = signed
    monkeypatch.setitem(site_mod._active, "require_signed", True)
    monkeypatch.setitem(site_mod._active, "keys", (pub,))
    path = tmp_path / "ok.sif"
    path.write_bytes(mutate(data, evil_at, [("regroup", 0, 0, "orig", 1)]))  # group 1 -> 1: no change
    gate_mod.forget()
    gated = gate_mod.gate(path)
    assert hashlib.sha256(gated.file.read(gated.partition.offset, gated.partition.size)).hexdigest() == want
    moved = tmp_path / "moved.sif"
    part_slot = 3  # write_sif: def file, inspect-metadata, sbom.json, then the partition; sign adds one more
    moved.write_bytes(mutate(data, evil_at, [("move", part_slot, 0, "evil", 0)]))
    gate_mod.forget()
    with pytest.raises((SifError, EnvportError)):
        gate_mod.gate(moved)
    gate_mod.forget()

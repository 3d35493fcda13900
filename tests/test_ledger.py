"""The ledger: locked appends that lose nothing, and the doc generated from it."""

from __future__ import annotations

import json
import multiprocessing

from envport.report import ledger

H1, H2 = "a" * 64, "b" * 64


def _append_many(root, n):
    for i in range(n):
        ledger.append(root, "env1", {"kind": "verify", "target": "docker", "hash": H1, "verdict": "OK", "i": i})


def test_concurrent_appends_lose_nothing(tmp_path):
    procs = [multiprocessing.Process(target=_append_many, args=(tmp_path, 15)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    records = json.loads(ledger.ledger_path(tmp_path, "env1").read_text())["records"]
    assert len(records) == 60
    assert all(r["key"] == f"env:env1@{H1[:12]}" and r["host"] and r["when"] for r in records)


def test_doc_has_one_block_per_hash_with_what_was_done(tmp_path):
    ledger.append(tmp_path, "env1", {"kind": "build", "target": "docker", "hash": H1, "verdict": "OK",
                                     "image": "envport/env1:aaaaaaaaaaaa", "resources": {"cpus": 2},
                                     "weights": {"hf": "/weights/hf"}, "sm_range": ["sm_80", "sm_90"]})
    ledger.append(tmp_path, "env1", {"kind": "witness", "target": "docker", "hash": H1, "verdict": "OK",
                                     "summary": "8 OK", "image": "envport/env1:aaaaaaaaaaaa"})
    ledger.append(tmp_path, "env1", {"kind": "build", "target": "venv", "hash": H2, "verdict": "REFUSED",
                                     "summary": "no python3.11"})
    ledger.append(tmp_path, "env1", {"kind": "verify", "target": "venv", "hash": H2, "verdict": "FAILED",
                                     "summary": "1 failed, 7 passed"})
    doc = ledger.doc_path(tmp_path, "env1").read_text()
    first, second = doc.split("### env: env1@")[1:]
    assert first.startswith(H2[:12])  # the latest activity first
    assert "how: not built on this host" in first and "validated: never" in first
    assert "last failure:" in first and "1 failed, 7 passed" in first
    assert second.startswith(H1[:12])
    assert "how: docker: image envport/env1:aaaaaaaaaaaa" in second
    assert 'tier: {"cpus": 2}' in second and "weights: hf=/weights/hf" in second
    assert "sm_range: sm_80..sm_90" in second and "(witness on docker" in second and "8 OK" in second

"""Issue 41's parts on small real inputs (no build, no daemon): apptainer's own signed test SIF
(shared/sif-testdata, written by apptainer's SIF library) gets statements; its signature still verifies with
apptainer's key; each statement is judged (trusted, untrusted, about another partition, damaged); the gate
under require_witnessed; the predicates against their specs and docs/witness-predicate.schema.json; a site
asking for witnesses without keys or with an unknown check is invalid."""

from __future__ import annotations

import base64
import json
from datetime import datetime, timezone
from pathlib import Path

import pytest

from envport.core.verdict import StepResult, Verdict
from envport.sif.provenance import judge as judge_mod
from envport.sif.provenance.attest import attest_sif, primary_of
from envport.sif.provenance.envelope import open_envelope, seal
from envport.sif.provenance.slsa import facts_from_embedded, predicate as slsa_predicate
from envport.sif.provenance.statement import (SLSA_PROVENANCE, WITNESS_PREDICATE, BadStatement, statement, subject,
                                          validate)
from envport.sif.provenance.store import append_statement, statement_objects
from envport.sif.provenance.witness import predicate as witness_predicate
from envport.sif.format import read_sif
from envport.sif.keys import load_private_key, load_public_key
from envport.sif.verify import check_signatures

from .support import REPO
from .test_provenance import check_slsa_v1, check_statement_v1, pae
from .test_sif_sign import new_key, upstream, upstream_key

SIGNED = "one-group-signed-dsse.sif"  # group 1 signed by apptainer's ed25519 test key; partition arch 386
T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)


def _steps(collectives_ok: bool = True) -> list[StepResult]:
    return [StepResult("python", Verdict.OK, "3.11.2"), StepResult("import six", Verdict.OK, "1.16.0"),
            StepResult("collectives (world 2)", Verdict.OK if collectives_ok else Verdict.FAILED, "gloo",
                       reason="" if collectives_ok else "collective_failed", seconds=1.5),
            StepResult("dtensor (mesh 2x2, nccl)", Verdict.SKIPPED, "no GPU")]


def _witness(steps) -> dict:
    return witness_predicate(env="tiny", env_hash="ab" * 32, target="apptainer", launcher="ch-run", steps=steps,
                             verdict="OK", started=T0, finished=T0, arch="x86_64")


def _keys(tmp_path: Path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    priv, pub = new_key(tmp_path / "a", "ed25519")
    other, _ = new_key(tmp_path / "b", "ecdsa")
    return load_private_key(priv), load_public_key(pub), load_private_key(other)


def test_witness_predicate_lists_failures_and_fits_its_schema():
    import jsonschema

    schema = json.loads((REPO / "docs" / "witness-predicate.schema.json").read_text())
    pred = _witness(_steps(collectives_ok=False))
    jsonschema.validate(pred, schema)
    rows = {w["step"]: w for w in pred["witnesses"]}
    assert rows["import six"]["check"] == "imports"
    assert rows["collectives (world 2)"] | {} == {**rows["collectives (world 2)"], "verdict": "FAILED",
                                                  "reason": "collective_failed", "backend": "gloo", "worldSize": 2}
    assert rows["dtensor (mesh 2x2, nccl)"]["backend"] == "nccl" and rows["dtensor (mesh 2x2, nccl)"]["worldSize"] == 4
    assert pred["gpus"] == [] and pred["startedOn"] == "2026-01-02T03:04:05Z"
    bad = dict(pred, witnesses=[{"step": "x", "check": "x", "verdict": "maybe", "detail": "", "seconds": 0}])
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


def test_slsa_predicate_from_an_embedded_spec_has_the_required_fields():
    doc = {"base": "docker-daemon envport/debian-bookworm:base (sha256:" + "c" * 64 + ")", "hash": "d" * 64,
           "site": "sif-fast", "envport_version": "0.1.0", "spec": {"name": "tiny"},
           "lock": [{"phase": 1, "dists": [["six", "1.16.0", "e" * 64]]}]}
    pred = slsa_predicate(facts_from_embedded(doc, started=T0, finished=T0))
    check_slsa_v1(pred)
    deps = pred["buildDefinition"]["resolvedDependencies"]
    assert deps[0] == {"name": "base", "uri": "docker://envport/debian-bookworm:base@sha256:" + "c" * 64,
                       "digest": {"sha256": "c" * 64}}
    assert deps[1] == {"name": "six==1.16.0", "uri": "pkg:pypi/six@1.16.0", "digest": {"sha256": "e" * 64}}
    assert pred["buildDefinition"]["externalParameters"] == {"spec": {"name": "tiny"}, "specHash": "d" * 64,
                                                             "site": "sif-fast"}


def test_a_statement_needs_a_subject_digest_and_the_v1_type():
    good = statement([subject("x", "f" * 64)], SLSA_PROVENANCE, {"a": 1})
    check_statement_v1(good)
    for broken in (dict(good, _type="https://in-toto.io/Statement/v0.1"), dict(good, subject=[{"name": "x"}]),
                   dict(good, subject=[]), dict(good, extra=1), dict(good, predicateType="")):
        with pytest.raises(BadStatement):
            validate(broken)


def test_the_envelope_is_dsse_over_the_pae(tmp_path):
    key, pub, _ = _keys(tmp_path)
    doc = statement([subject("x", "f" * 64)], WITNESS_PREDICATE, _witness(_steps()))
    raw = seal(doc, [key])
    env = json.loads(raw)
    payload = base64.b64decode(env["payload"])
    pub.key.verify(base64.b64decode(env["signatures"][0]["sig"]), pae(env["payloadType"], payload))
    assert json.loads(payload) == doc and open_envelope(raw)[1] == doc


def test_statements_in_apptainers_signed_sif_are_judged_and_leave_its_signature_alone(tmp_path):
    key, pub, stranger = _keys(tmp_path)
    sif = upstream(tmp_path, SIGNED)
    before = check_signatures(sif, [upstream_key("ed25519-public.pem")])
    assert before.ok, before.problems
    done = attest_sif(sif, [key], WITNESS_PREDICATE, _witness(_steps()))
    attest_sif(sif, [stranger], WITNESS_PREDICATE, _witness(_steps()))
    info = read_sif(sif)
    other = statement([subject("elsewhere", "0" * 64)], WITNESS_PREDICATE, _witness(_steps()))
    append_statement(sif, seal(other, [key]), primary_of(info).id)
    after = check_signatures(sif, [upstream_key("ed25519-public.pem")])
    assert after.ok and after.signatures == before.signatures, after.problems
    info = read_sif(sif)
    judged = judge_mod.judge_statements(info, primary_of(info), [pub])
    assert [j.verdict for j in judged] == ["trusted", "untrusted_signer", "subject_mismatch"]
    assert judged[0].object_id == done.object_id and judged[0].witnessed == {"python": True, "imports": True,
                                                                            "collectives": True, "dtensor": False}
    assert judge_mod.missing_witnesses(judged, ["imports", "collectives"]) == []
    assert judge_mod.missing_witnesses(judged, ["imports", "dtensor"]) == ["dtensor"]
    assert [j.verdict for j in judge_mod.judge_statements(info, primary_of(info), [])][:1] == ["unchecked"]


def test_a_damaged_statement_is_named_not_trusted(tmp_path):
    key, pub, _ = _keys(tmp_path)
    sif = upstream(tmp_path, SIGNED)
    attest_sif(sif, [key], WITNESS_PREDICATE, _witness(_steps()))
    [d] = statement_objects(read_sif(sif))
    with open(sif, "r+b") as fh:
        fh.seek(d.offset + 20)
        fh.write(b"@")
    info = read_sif(sif)
    [j] = judge_mod.judge_statements(info, primary_of(info), [pub])
    assert j.verdict == "bad_statement" and f"statement object {d.id}" in j.detail


@pytest.mark.parametrize("attested", [None, "stranger", "failed", "ok"])
def test_the_gate_under_require_witnessed(tmp_path, monkeypatch, attested):
    from envport.plan import site as site_mod
    from envport.sif import gate as gate_mod

    key, pub, stranger = _keys(tmp_path)
    sif = upstream(tmp_path, SIGNED)
    if attested:
        attest_sif(sif, [stranger if attested == "stranger" else key], WITNESS_PREDICATE,
                   _witness(_steps(collectives_ok=attested != "failed")))
    monkeypatch.setitem(site_mod._active, "keys", (pub.path,))
    monkeypatch.setitem(site_mod._active, "require_witnessed", ("imports", "collectives"))
    gate_mod.forget()
    try:
        if attested == "ok":
            assert "witnessed (imports, collectives)" in gate_mod.gate(sif, arch="386").trust
            return
        with pytest.raises(gate_mod.TrustRefused) as refused:
            gate_mod.gate(sif, arch="386")
        assert refused.value.reason == "unwitnessed"
        missing = "imports, collectives" if attested in (None, "stranger") else "collectives"
        assert f"none shows {missing} (" in refused.value.detail, refused.value.detail
    finally:
        gate_mod.forget()


def test_a_site_asking_for_witnesses_needs_keys_and_known_checks():
    from pydantic import ValidationError

    from envport.plan.site import Trust

    with pytest.raises(ValidationError, match="require_witnessed needs the keys"):
        Trust(require_witnessed=["imports"])
    with pytest.raises(ValidationError, match="is no witness check"):
        Trust(keys=["k.pem"], require_witnessed=["importz"])
    assert Trust(keys=["k.pem"], require_witnessed=["imports", "collectives"]).require_witnessed

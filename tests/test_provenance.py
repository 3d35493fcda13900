"""Issue 41: signed in-toto statements, on real parts: demo-cpu's SIF (tests/sif_fixtures.py ``demo_sif``, built
once per session by envport's own builder and shared with the other SIF tests) through the whole chain: build
--sign attests provenance, witness --attest (imports and collectives, at world size 2 on gloo), push, pull as
uid 65534 into an empty folder, inspect, and the gate's require_witnessed [imports, collectives].

Each statement is checked here against the specs' text, not envport's code: the in-toto Statement v1 fields,
SLSA provenance v1's required fields, the witness predicate against docs/witness-predicate.schema.json, and
the DSSE signature over the PAE written out below.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from .registry_fixture import registry  # noqa: F401
from .sif_fixtures import SIF_TIMEOUT, sif_env
from .support import ENV_NAME, REPO, as_json, copy_project, fail_with, run_envport, unique, write_site
from .test_registry import OCI_MANIFEST
from .test_sif_sign import new_key
from .test_trust_roundtrip import OTHER_UID, _other_user_argv

pytest_plugins = ["tests.sif_fixtures"]
NAME = ENV_NAME
WITNESSED = ("imports", "collectives")
SLSA = "https://slsa.dev/provenance/v1"
WITNESS = "https://envport.dev/witness/v1"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1's pre-authentication encoding, from the spec: "DSSEv1" SP LEN(type) SP type SP LEN(body) SP body."""
    return b" ".join([b"DSSEv1", str(len(payload_type)).encode(), payload_type.encode(),
                      str(len(payload)).encode(), payload])


def dsse_statement(envelope: bytes, pub: Path) -> dict:
    """The statement of ENVELOPE, its one Ed25519 signature checked over the PAE with the key PUB."""
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    env = json.loads(envelope)
    assert env["payloadType"] == "application/vnd.in-toto+json"
    payload = base64.b64decode(env["payload"])
    [sig] = env["signatures"]
    load_pem_public_key(pub.read_bytes()).verify(base64.b64decode(sig["sig"]), pae(env["payloadType"], payload))
    return json.loads(payload)


def check_statement_v1(doc: dict) -> None:
    """The in-toto Statement v1 spec's fields: _type, subject (each a ResourceDescriptor with a digest),
    predicateType (a URI), predicate (an object); nothing else at the top."""
    assert set(doc) == {"_type", "subject", "predicateType", "predicate"}, sorted(doc)
    assert doc["_type"] == "https://in-toto.io/Statement/v1"
    assert doc["subject"] and all(isinstance(s.get("digest"), dict) and s["digest"] for s in doc["subject"])
    assert doc["predicateType"].startswith("https://") and isinstance(doc["predicate"], dict)


def check_slsa_v1(pred: dict) -> None:
    """SLSA provenance v1's REQUIRED fields: buildDefinition.buildType and externalParameters,
    runDetails.builder.id; resolvedDependencies ResourceDescriptors; RFC 3339 times where given."""
    bd, rd = pred["buildDefinition"], pred["runDetails"]
    assert bd["buildType"].startswith("https://") and isinstance(bd["externalParameters"], dict)
    assert rd["builder"]["id"].startswith("https://")
    for dep in bd.get("resolvedDependencies", []):
        assert dep.get("uri") or dep.get("digest") or dep.get("name"), dep
    for key in ("startedOn", "finishedOn"):
        if key in rd.get("metadata", {}):
            assert rd["metadata"][key].endswith("Z"), rd["metadata"]


def statements_of(sif: Path) -> dict[int, bytes]:
    """Each statement object's bytes, by ID, as siftool (apptainer's own SIF tool) dumps them."""
    from envport.sif.provenance.store import statement_objects
    from envport.sif.format import read_sif

    out = {}
    for d in statement_objects(read_sif(sif)):
        dumped = subprocess.run(["siftool", "dump", str(d.id), str(sif)], capture_output=True, timeout=60)
        assert dumped.returncode == 0, dumped
        out[d.id] = dumped.stdout
    return out


def witness(root: Path, sif: Path, site: str, tmp: Path, *extra: str):
    tmp.mkdir()
    return run_envport("witness", NAME, "--target", "apptainer", "--sif", str(sif), "--site", site,
                       "--only", ",".join(WITNESSED), *extra, root=root, env=sif_env(TMPDIR=str(tmp)),
                       timeout=SIF_TIMEOUT)


@pytest.mark.timeout(1200)
def test_signed_attested_pushed_pulled_inspected_and_gated(demo_sif, registry, tmp_path, record_property):
    import jsonschema

    from envport.sif.provenance.envelope import seal
    from envport.sif.provenance.statement import statement, subject
    from envport.sif.provenance.store import append_statement
    from envport.sif.format import primary_partition, read_sif
    from envport.sif.keys import load_private_key

    # A project where demo-cpu's SIF is present under its own name (a copy: the session's file stays as built).
    root = copy_project(tmp_path / "project")
    sif = root / ".cache" / "sif" / demo_sif.path.name
    sif.parent.mkdir(parents=True)
    shutil.copyfile(demo_sif.path, sif)
    priv, pub = new_key(tmp_path, "ed25519")
    (tmp_path / "stranger").mkdir()
    stranger, _ = new_key(tmp_path / "stranger", "ed25519")

    # build --sign: signed, and its provenance attested by the same key; again: present, no second statement.
    args = ("build", NAME, "--target", "apptainer", "--sign", str(priv), "--json")
    proc = run_envport(*args, root=root, env=sif_env(), timeout=SIF_TIMEOUT)
    assert proc.returncode == 0, fail_with(proc, "build --sign")
    last = as_json(proc)["steps"][-1]
    assert last["step"].startswith("sign ") and last["data"]["provenance"]["predicate_type"] == SLSA, last
    before = sif.read_bytes()
    again = run_envport(*args, root=root, env=sif_env(), timeout=SIF_TIMEOUT)
    assert again.returncode == 0 and "already attested" in as_json(again)["steps"][-1]["detail"], again.stdout
    assert sif.read_bytes() == before

    # witness --attest: a statement of the run, into the SIF.
    proc = witness(root, sif, "local", tmp_path / "tmp-witness", "--attest", str(priv), "--json")
    assert proc.returncode == 0, fail_with(proc, "witness --attest")
    assert as_json(proc)["attested"]["data"]["predicate_type"] == WITNESS

    # What siftool dumps: two DSSE envelopes, verified over the PAE; the statements valid by the specs.
    dumped = {}
    for data in statements_of(sif).values():
        doc = dsse_statement(data, pub)
        check_statement_v1(doc)
        dumped[doc["predicateType"]] = doc
    assert set(dumped) == {SLSA, WITNESS}
    info = read_sif(sif)
    digest = info.file.digest(primary_partition(info).offset, primary_partition(info).size)
    assert all(d["subject"][0]["digest"]["sha256"] == digest for d in dumped.values())
    check_slsa_v1(dumped[SLSA]["predicate"])
    ext = dumped[SLSA]["predicate"]["buildDefinition"]["externalParameters"]
    assert ext["specHash"] == demo_sif.hash and ext["site"] == "local" and ext["spec"]["name"] == NAME
    deps = dumped[SLSA]["predicate"]["buildDefinition"]["resolvedDependencies"]
    assert deps[0]["name"] == "base" and len(deps[0]["digest"]["sha256"]) == 64, deps
    schema = json.loads((REPO / "docs" / "witness-predicate.schema.json").read_text())
    jsonschema.validate(dumped[WITNESS]["predicate"], schema)
    checks = {w["check"]: w["verdict"] for w in dumped[WITNESS]["predicate"]["witnesses"]}
    assert all(checks.get(c) == "OK" for c in WITNESSED), checks
    collectives = [w for w in dumped[WITNESS]["predicate"]["witnesses"] if w["check"] == "collectives"]
    assert collectives and {w["backend"] for w in collectives} == {"gloo"}, collectives
    assert 2 in {w.get("worldSize") for w in collectives}, collectives

    # push; pull as another user into an empty folder holding only the public key; inspect there.
    site = write_site(root, "prov", registry_ca=str(registry.ca),
                      trust={"keys": [str(pub)], "require_witnessed": list(WITNESSED)})
    repo = f"envport/{unique('prov')}"
    proc = run_envport("push", NAME, "--sif", str(sif), "--site", site, "--to", registry.url(repo, "v1"), "--json",
                       root=root, timeout=900)
    assert proc.returncode == 0, fail_with(proc, "push")
    assert len(as_json(proc)["steps"][0]["data"]["referrers"]) == 2, proc.stdout
    # The registry (no referrers API) holds the spec's fallback: an index under sha256-<subject hex> listing
    # both statements as in-toto artifacts whose subject is the SIF's manifest.
    status, _, body = registry.get(f"/v2/{repo}/manifests/v1", accept=OCI_MANIFEST)
    subject_digest = "sha256:" + hashlib.sha256(body).hexdigest()
    status, _, index = registry.get(f"/v2/{repo}/manifests/{subject_digest.replace(':', '-')}", accept=OCI_INDEX)
    assert status == 200, index[:300]
    listed = json.loads(index)["manifests"]
    assert sorted(m["annotations"]["in-toto.io/predicate-type"] for m in listed) == sorted([SLSA, WITNESS])
    for m in listed:
        status, _, referrer = registry.get(f"/v2/{repo}/manifests/{m['digest']}", accept=OCI_MANIFEST)
        doc = json.loads(referrer)
        assert doc["artifactType"] == "application/vnd.in-toto+json" and doc["subject"]["digest"] == subject_digest
    alone = Path(tempfile.mkdtemp(prefix="envport-prov-"))
    try:
        for sub in ("home", "pulled", "stage", "sites", "specs"):
            (alone / sub).mkdir()
        shutil.copyfile(pub, alone / "pub.pem")
        (alone / "ca.crt").write_bytes(registry.ca.read_bytes())
        write_site(alone, "admin", registry_ca=str(alone / "ca.crt"), trust={"keys": ["../pub.pem"]})
        as_other = _other_user_argv(alone / "stage")
        if as_other:
            for path in (alone, *alone.rglob("*")):
                os.chown(path, OTHER_UID, OTHER_UID)
        record_property("pull_user", OTHER_UID if as_other else os.geteuid())
        env = {**sif_env(), "HOME": str(alone / "home"), "DOCKER_CONFIG": str(alone / "home" / ".docker")}
        proc = subprocess.run([*(as_other or [sys.executable]), "-m", "envport", "-C", str(alone), "pull",
                               registry.url(repo, "v1"), "--site", "admin", "-o", str(alone / "pulled"),
                               "--statements", "--json"],
                              capture_output=True, text=True, env=env, cwd=alone, timeout=900)
        assert proc.returncode == 0, fail_with(proc, "envport pull as the admin")
        [pulled] = [p for p in (alone / "pulled").iterdir() if p.suffix == ".sif"]
        assert pulled.read_bytes() == sif.read_bytes()
        # the referrers fetched beside it: the very envelopes the SIF carries
        jsonl = pulled.with_name(pulled.name + ".intoto.jsonl")
        assert sorted(jsonl.read_bytes().splitlines()) == sorted(statements_of(sif).values())
        mine = tmp_path / "mine.sif"  # root reads and runs its own copy, never another user's file (issue 35)
        shutil.copyfile(pulled, mine)
    finally:
        shutil.rmtree(alone, ignore_errors=True)
    proc = run_envport("inspect", str(mine), "--key", str(pub), "--json", root=root, timeout=600)
    data = as_json(proc)
    sig = next(s for s in data["steps"] if s["step"].startswith("signatures "))
    assert sig["verdict"] == "OK" and "pub.pem" in sig["detail"], sig
    by_type = {s["predicate_type"]: s for s in data["statements"]}
    assert set(by_type) == {SLSA, WITNESS}, data["statements"]
    assert all(s["verdict"] == "trusted" and "pub.pem" in s["by"] for s in by_type.values()), by_type
    assert by_type[WITNESS]["witnessed"] == {c: True for c in WITNESSED}

    # The gate under require_witnessed [imports, collectives]: the pulled copy runs ...
    proc = witness(root, mine, site, tmp_path / "tmp-ok")
    assert proc.returncode == 0, fail_with(proc, "witness under require_witnessed")
    # ... and three copies are refused before any mount (their TMPDIR stays empty).
    witness_id = next(i for i, d in statements_of(mine).items() if json.loads(
        base64.b64decode(json.loads(d)["payload"]))["predicateType"] == WITNESS)
    removed = tmp_path / "removed.sif"
    shutil.copyfile(mine, removed)
    subprocess.run(["siftool", "del", str(witness_id), str(removed)], check=True, timeout=60)
    untrusted = tmp_path / "untrusted.sif"
    shutil.copyfile(removed, untrusted)
    run_envport("attest", str(untrusted), "--key", str(stranger), "--statement", str(_witness_doc(mine, tmp_path)),
                root=root, check=True, timeout=300)
    elsewhere = tmp_path / "elsewhere.sif"
    shutil.copyfile(removed, elsewhere)
    other = statement([subject("other.sif", "0" * 64)], WITNESS, dumped[WITNESS]["predicate"])
    append_statement(elsewhere, seal(other, [load_private_key(priv)]), primary_partition(read_sif(elsewhere)).id)
    for name, copy, why in (("removed", removed, "statement(s) in the file"),
                            ("untrusted", untrusted, "untrusted_signer"),
                            ("elsewhere", elsewhere, "subject_mismatch")):
        tmp = tmp_path / f"tmp-{name}"
        proc = witness(root, copy, site, tmp)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 3 and "[unwitnessed]" in out and why in out, fail_with(proc, f"witness of {name}")
        assert list(tmp.iterdir()) == [], f"a mount directory was made for the refused {name} copy"


def _witness_doc(sif: Path, tmp_path: Path) -> Path:
    """The witness statement SIF carries, as a JSON file (for `attest --statement` with another key)."""
    for data in statements_of(sif).values():
        doc = json.loads(base64.b64decode(json.loads(data)["payload"]))
        if doc["predicateType"] == WITNESS:
            path = tmp_path / "witness-statement.json"
            path.write_text(json.dumps(doc))
            return path
    raise AssertionError(f"{sif} holds no witness statement")

"""`envport push NAME --target docker --attest KEY.pem` (issue 41: build provenance for images): a small locked
image pushed to the real registry (Debian's docker-registry, tests/registry_fixture.py) by the docker engine,
its SLSA provenance attached as an OCI referrer.

What is checked, without envport's reader: through the registry's own HTTP API, the fallback index under the
tag `sha256-<hex of the manifest digest>` (distribution 2.8 has no referrers API), each referrer manifest, and
the DSSE blob; the signature over the PAE written from the DSSE spec (tests/test_provenance.py); the
Statement's subject is the pushed manifest; the predicate is SLSA provenance v1 listing every locked dist.
The podman case pushes through `podman push` (as root: push only reads podman's storage and never starts a
container) the same image copied from the docker engine into podman's storage (`podman pull docker-daemon:`):
a rootless podman build (tests/test_podman.py) would cost a minute more, and the env is one env on every
backend. podman's storage holds no base image and this machine's ledger no podman build, so that statement
names the base without a digest and carries no times (SLSA allows both), which is checked.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess

import pytest

from .registry_fixture import SITE, registry, small_project  # noqa: F401 (fixtures)
from .support import as_json, fail_with, run_envport, unique, write_spec
from .test_provenance import check_slsa_v1, check_statement_v1, dsse_statement
from .test_sif_sign import new_key

DOCKER_V2 = "application/vnd.docker.distribution.manifest.v2+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
INTOTO = "application/vnd.in-toto+json"
DSSE_LAYER = "application/vnd.dsse.envelope.v1+json"
SLSA = "https://slsa.dev/provenance/v1"


def _locked_image(root, throwaway_images) -> tuple[str, str, set]:
    """A one-dist env (six), locked and built by the docker builder in the registry project: (its name, its
    image tag, its locked dists). Its own name, so throwaway_images removes only its images."""
    from envport.plan.lock import load_for
    from envport.spec.loader import load_spec

    name = unique("tiny-attest")
    write_spec(root, name, env={"TINY_GREETING": "attested"})
    throwaway_images.append(name)
    locked = run_envport("lock", name, "--site", SITE, "--json", root=root, timeout=300)
    assert locked.returncode == 0, fail_with(locked, "envport lock")
    built = run_envport("build", name, "--target", "docker", "--site", SITE, "--json", root=root, timeout=900)
    assert built.returncode == 0, fail_with(built, "envport build --target docker")
    lock = load_for(load_spec(name, root))
    return name, as_json(built)["steps"][-1]["data"]["image"], {(d.name, d.version, d.sha256)
                                                                 for phase in lock.phases for d in phase.dists}


def _referred_statement(registry, repo: str, tag: str, accept: str, pub) -> tuple[dict, dict, str]:
    """(the one statement attached to the manifest under TAG, {digest: that manifest's, referrer: the referrer
    manifest's}, the manifest's media type), read through the registry's HTTP API (the fallback index, the
    referrer manifest, the DSSE blob), the referrer's subject and the signature checked."""
    manifest, body, headers = _json(registry, f"/v2/{repo}/manifests/{tag}", accept)
    digest = f"sha256:{hashlib.sha256(body).hexdigest()}"
    assert headers.get("Docker-Content-Digest") == digest, headers
    index, _, _ = _json(registry, f"/v2/{repo}/manifests/{digest.replace(':', '-')}", OCI_INDEX)
    [entry] = index["manifests"]
    assert entry["artifactType"] == INTOTO, index
    referrer, raw, _ = _json(registry, f"/v2/{repo}/manifests/{entry['digest']}", OCI_MANIFEST)
    assert f"sha256:{hashlib.sha256(raw).hexdigest()}" == entry["digest"]
    assert referrer["subject"] == {"mediaType": manifest["mediaType"], "digest": digest, "size": len(body)}, referrer
    [layer] = referrer["layers"]
    assert layer["mediaType"] == DSSE_LAYER
    status, _, envelope = registry.get(f"/v2/{repo}/blobs/{layer['digest']}")
    assert status == 200 and f"sha256:{hashlib.sha256(envelope).hexdigest()}" == layer["digest"]
    doc = dsse_statement(envelope, pub)  # the signature, over the PAE, with the public key
    check_statement_v1(doc)
    assert doc["predicateType"] == SLSA
    assert doc["subject"] == [{"name": f"{registry.host}/{repo}", "digest": {"sha256": digest.split(":")[1]}}]
    return doc, {"digest": digest, "referrer": entry["digest"]}, manifest["mediaType"]


def _json(registry, path: str, accept: str) -> tuple[dict, bytes, dict]:
    status, headers, body = registry.get(path, accept=accept)
    assert status == 200, (path, status, body[:300])
    return json.loads(body), body, headers


def test_pushed_image_gets_a_signed_provenance_referrer(registry, small_project, base_image, throwaway_images,
                                                        tmp_path, docker_client):
    name, tag, dists = _locked_image(small_project, throwaway_images)
    key, pub = new_key(tmp_path, "ed25519")
    repo = f"envport/{unique('att')}"

    # A key that does not load is a usage error before anything is pushed: the repository gets no tag.
    bad = tmp_path / "bad.pem"
    bad.write_text("not a key\n")
    proc = run_envport("push", name, "--target", "docker", "--site", SITE, "--to", registry.url(repo),
                       "--attest", str(bad), root=small_project, timeout=300)
    assert proc.returncode == 2 and "bad.pem" in proc.stderr, fail_with(proc, "push --attest with a bad key")
    status, _, body = registry.get(f"/v2/{repo}/tags/list")
    assert status == 404 or not json.loads(body).get("tags"), body[:300]

    proc = run_envport("push", name, "--target", "docker", "--site", SITE, "--to", registry.url(repo),
                       "--attest", str(key), "--json", root=small_project, timeout=900)
    assert proc.returncode == 0, fail_with(proc, "envport push --attest")
    step = as_json(proc)["steps"][0]
    assert step["verdict"] == "OK" and "1 in-toto statement attached as an OCI referrer" in step["detail"], step
    for pushed in step["data"]["pushed"]:
        docker_client.images.remove(pushed)

    hash12 = tag.rsplit(":", 1)[1]
    doc, found, media_type = _referred_statement(registry, repo, hash12, f"{DOCKER_V2}, {OCI_MANIFEST}", pub)
    assert media_type == DOCKER_V2  # what docker pushes; the referrer's subject says so (checked above)
    assert step["data"]["manifest_digest"] == found["digest"] and step["data"]["referrers"] == [found["referrer"]]
    assert step["data"]["manifest_media_type"] == DOCKER_V2, step
    pred = doc["predicate"]
    check_slsa_v1(pred)
    from envport.sif.provenance.slsa import validate

    validate(pred)
    deps = {d["name"]: d for d in pred["buildDefinition"]["resolvedDependencies"]}
    assert dists and all(deps[f"{n}=={v}"]["digest"] == {"sha256": sha} for n, v, sha in dists), deps
    assert deps["base"]["uri"].startswith("docker://envport/debian-bookworm:base@sha256:"), deps["base"]
    assert pred["buildDefinition"]["internalParameters"] == {"target": "docker"}
    assert pred["buildDefinition"]["externalParameters"]["specHash"].startswith(hash12)
    # The build is in this project's ledger: its times are the record's.
    assert {"startedOn", "finishedOn"} <= set(pred["runDetails"]["metadata"]), pred["runDetails"]


def test_attest_with_a_sif_target_is_a_usage_error(small_project, tmp_path):
    key, _ = new_key(tmp_path, "ed25519")
    proc = run_envport("push", "demo-cpu", "--target", "apptainer", "--to", "oras://127.0.0.1:9/x/y",
                       "--attest", str(key), root=small_project, timeout=120)
    assert proc.returncode == 2 and "statements are in its SIF" in proc.stderr, fail_with(proc, "push --attest")


def test_podman_push_attests_the_manifest_it_pushed(registry, small_project, base_image, throwaway_images, tmp_path):
    if shutil.which("podman") is None:
        pytest.skip("podman not installed (.ci/install.sh installs it)")
    name, tag, dists = _locked_image(small_project, throwaway_images)
    copied = subprocess.run(["podman", "pull", "-q", f"docker-daemon:{tag}"], capture_output=True, text=True,
                            timeout=300)
    assert copied.returncode == 0, copied.stderr
    key, pub = new_key(tmp_path, "ed25519")
    repo = f"envport/{unique('patt')}"
    pushed: list[str] = []
    try:
        proc = run_envport("push", name, "--target", "podman", "--site", SITE, "--to", registry.url(repo),
                           "--attest", str(key), "--json", root=small_project, timeout=900)
        assert proc.returncode == 0, fail_with(proc, "envport push --target podman --attest")
        step = as_json(proc)["steps"][0]
        pushed = step["data"]["pushed"]
    finally:
        subprocess.run(["podman", "rmi", "-f", tag, *pushed], capture_output=True, timeout=120)
    assert step["verdict"] == "OK" and "1 in-toto statement attached as an OCI referrer" in step["detail"], step
    doc, found, media_type = _referred_statement(registry, repo, tag.rsplit(":", 1)[1],
                                                 f"{OCI_MANIFEST}, {DOCKER_V2}", pub)
    assert step["data"]["manifest_media_type"] == media_type and step["data"]["referrers"] == [found["referrer"]]
    pred = doc["predicate"]
    deps = {d["name"]: d for d in pred["buildDefinition"]["resolvedDependencies"]}
    assert all(deps[f"{n}=={v}"]["digest"] == {"sha256": sha} for n, v, sha in dists), deps
    assert pred["buildDefinition"]["internalParameters"] == {"target": "podman"}
    # No base in podman's storage, no podman build in the ledger: neither a guessed digest nor invented times.
    assert deps["base"] == {"name": "base", "uri": "docker://envport/debian-bookworm:base"}, deps["base"]
    assert not {"startedOn", "finishedOn"} & set(pred["runDetails"]["metadata"]), pred["runDetails"]

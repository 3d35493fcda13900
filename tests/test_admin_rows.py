"""Issue 37, the admin's day: rows U8, U11, U17, U21 and U23, each on the real code path.

The admin holds a small SIF (tests/test_pull_hostile.py `make_sif`: envport's own SIF writer, mksquashfs for
the partition), signed by `envport sign` with a fresh key, pushed with `envport push --sif` to the real test
registry (Debian's docker-registry over TLS on loopback, tests/registry_fixture.py) and pulled, inspected
and checked by the CLI in a subprocess. Where a row is about what is asked of the registry (U11: nothing
before a broken profile is refused; U21: no layer downloaded twice), the registry is test_pull_hostile's
HTTPS server, which counts every request; what the real registry holds is read back over its own HTTP API.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from envport.cli import build_parser

from .registry_fixture import REGISTRY_DIR, SITE, SMALL, registry, small_project  # noqa: F401 (fixtures)
from .support import REPO, as_json, fail_with, run_envport, unique
from .test_pull_hostile import (HOSTILE_SITE, NAME, RUN_S, hostile, listing, make_sif, project, pull,  # noqa: F401
                                serve, sif_bytes, step_of, tls)
from .test_sif_sign import new_key

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


@dataclass(frozen=True)
class Keys:
    signer: Path  # the private key the SIF is signed with
    signer_pub: Path
    stranger_pub: Path  # a key that signed nothing here


@dataclass(frozen=True)
class Admin:
    folder: Path  # an empty folder outside any project: where the admin works
    unsigned: Path
    signed: Path
    keys: Keys


@pytest.fixture(scope="module")
def admin(tmp_path_factory, small_project) -> Admin:
    base = tmp_path_factory.mktemp("admin")
    signer_dir, stranger_dir, folder = base / "signer", base / "stranger", base / "work"
    for d in (signer_dir, stranger_dir, folder):
        d.mkdir()
    priv, pub = new_key(signer_dir, "ed25519")
    _, stranger = new_key(stranger_dir, "ecdsa")
    own = hashlib.sha256(unique("admin-sif").encode()).hexdigest()
    unsigned = make_sif(base / "tool.sif", {"envport.name": SMALL, "envport.hash": own})
    signed = base / "tool-signed.sif"
    shutil.copyfile(unsigned, signed)
    run_envport("sign", str(signed), "--key", str(priv), root=folder, check=True, timeout=RUN_S)
    return Admin(folder, unsigned, signed, Keys(priv, pub, stranger))


def push(sif: Path, registry, small_project, *tags: str) -> tuple[str, object]:
    """SIF pushed with `envport push --sif` to a fresh repository of the real registry: (repo, the process)."""
    repo = f"envport/{unique('admin')}"
    proc = run_envport("push", SMALL, "--site", SITE, "--sif", str(sif), "--to", registry.url(repo), "--json",
                       *[a for t in tags for a in ("--tag", t)], root=small_project, timeout=RUN_S)
    assert proc.returncode == 0, fail_with(proc, "push --sif")
    return repo, proc


def ca_site(folder: Path, name: str, **fields) -> Path:
    """A site profile FILE in FOLDER (no project: `--site FILE`) trusting the test registry's CA."""
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "registry_ca": str(REGISTRY_DIR / "ca.crt"), **fields}))
    return path


def pull_real(admin: Admin, ref: str, out: Path, *args: str):
    return run_envport("pull", ref, "-o", str(out), "--json", *args, root=admin.folder, timeout=RUN_S)


# --- U23: a private key given as a trust key is said, and its public half used ---------------------------------


def _warned_private(stderr: str, key: Path) -> bool:
    return (f"{key} is a PRIVATE key" in stderr and "trust key should be the public half" in stderr
            and f"openssl pkey -in {key} -pubout" in stderr)


def test_u23_pull_with_a_private_key_warns_and_verifies_with_its_public_half(admin, registry, small_project):
    repo, _ = push(admin.signed, registry, small_project, "v1")
    site = ca_site(admin.folder, unique("u23"))
    out = admin.folder / unique("u23-out")
    proc = pull_real(admin, registry.url(repo, "v1"), out, "--site", str(site), "--key", str(admin.keys.signer))
    assert proc.returncode == 0, fail_with(proc, "pull --key PRIVATE.pem")
    assert _warned_private(proc.stderr, admin.keys.signer), fail_with(proc, "pull: no private-key warning")
    assert proc.stderr.count("PRIVATE key") == 1, fail_with(proc, "the warning is said once")
    assert "signatures verified against" in as_json(proc)["steps"][0]["detail"]


@pytest.mark.parametrize("command", ["inspect", "verify-sig"])
def test_u23_inspect_and_verify_sig_warn_about_a_private_key(admin, command):
    proc = run_envport(command, str(admin.signed), "--key", str(admin.keys.signer), "--json", root=admin.folder,
                       timeout=RUN_S)
    assert _warned_private(proc.stderr, admin.keys.signer), fail_with(proc, f"{command}: no warning")
    steps = as_json(proc)["steps"]
    assert next(s for s in steps if s["step"].startswith("signatures "))["verdict"] == "OK", steps


def test_u23_a_private_key_in_the_sites_trust_keys_is_warned_about(admin):
    site = ca_site(admin.folder, unique("u23-site"), trust={"keys": [str(admin.keys.signer)]})
    proc = run_envport("inspect", str(admin.signed), "--site", str(site), "--json", root=admin.folder,
                       timeout=RUN_S)
    assert _warned_private(proc.stderr, admin.keys.signer), fail_with(proc, "inspect --site: no warning")


def test_u23_a_public_key_is_not_warned_about(admin):
    proc = run_envport("verify-sig", str(admin.signed), "--key", str(admin.keys.signer_pub), root=admin.folder,
                       timeout=RUN_S)
    assert proc.returncode == 0 and "warning" not in proc.stderr, fail_with(proc, "verify-sig --key PUB")


# --- U11: a site whose trust.keys file is missing is exit 2 before the registry is asked ----------------------


def test_u11_a_missing_trust_key_is_exit_2_before_the_first_byte(tls, hostile, sif_bytes, tmp_path):
    gone = tmp_path / "keys" / "site.pub.pem"
    site = tmp_path / "broken.yaml"
    site.write_text(yaml.safe_dump({"name": "broken", "registry_ca": str(tls[0]),
                                    "trust": {"keys": ["keys/site.pub.pem"]}}))
    serve(hostile, sif_bytes)
    out = tmp_path / "out"
    proc = run_envport("pull", hostile.url(), "--site", str(site), "-o", str(out), root=tmp_path, timeout=RUN_S)
    assert proc.returncode == 2, fail_with(proc, "pull with a missing trust key")
    assert f"{site}:" in proc.stderr and "trust.keys[0]" in proc.stderr and str(gone) in proc.stderr, proc.stderr
    assert "does not exist" in proc.stderr and "fix:" in proc.stderr, proc.stderr
    assert sum(hostile.hits.values()) == 0, f"the registry was asked: {dict(hostile.hits)}"
    assert listing(out) == []


def test_u11_a_trust_key_that_is_not_a_key_is_exit_2_before_the_first_byte(tls, hostile, sif_bytes,
                                                                            tmp_path):
    (tmp_path / "junk.pem").write_text("not a key\n")
    site = tmp_path / "junk.yaml"
    site.write_text(yaml.safe_dump({"name": "junk", "registry_ca": str(tls[0]), "trust": {"keys": ["junk.pem"]}}))
    serve(hostile, sif_bytes)
    proc = run_envport("pull", hostile.url(), "--site", str(site), "-o", str(tmp_path / "out"), root=tmp_path,
                       timeout=RUN_S)
    assert proc.returncode == 2 and "junk.pem" in proc.stderr, fail_with(proc, "pull with a junk trust key")
    assert sum(hostile.hits.values()) == 0, f"the registry was asked: {dict(hostile.hits)}"


# --- U17: the whole TLS reason; --site NAME|FILE where it is accepted -------------------------------------------


def test_u17_a_tls_failure_says_the_whole_reason(admin, registry):
    # No registry_ca (the built-in local site): the system's CAs do not know the test registry's CA.
    # A deep repository path (a site's group/project/env): the URL inside the TLS error is long.
    repo = f"envport/{'department-of-long-names/' * 6}{unique('u17')}"
    proc = pull_real(admin, registry.url(repo, "v1"), admin.folder / unique("u17-out"))
    step = as_json(proc)["steps"][0]
    assert proc.returncode == 3 and step["reason"] == "tls_failed", fail_with(proc, "pull without the CA")
    assert "certificate verify failed: unable to get local issuer certificate" in step["detail"], step["detail"]
    assert "…" not in step["detail"], step["detail"]
    assert "registry_ca" in step["detail"], step["detail"]


def test_u17_a_long_registry_message_is_never_cut_mid_word():
    from envport.engines.registry import _short

    words = " ".join(f"word{i:03d}" for i in range(200))
    cut = _short(ValueError(words))
    assert cut.endswith(" …") and cut[:-2] == words[:len(cut) - 2], cut
    assert cut[:-2].split()[-1] in words.split(), cut


def _site_options(parser: argparse.ArgumentParser, path: str = "") -> dict[str, argparse.Action]:
    """Every `--site` option of the CLI, by command path ("pull", "slurm submit")."""
    found = {}
    for action in parser._actions:
        if "--site" in action.option_strings:
            found[path] = action
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.update(_site_options(sub, f"{path} {name}".strip()))
    return found


SITE_OPTIONS = _site_options(build_parser())
# Commands whose files belong to other work in progress (issue 37 U17 asks them for the same metavar): strict
# xfail, so the day one of them says NAME|FILE this list must shrink.
PENDING: set[str] = set()


@pytest.mark.parametrize("command", [pytest.param(c, marks=pytest.mark.xfail(strict=True, reason="owned elsewhere"))
                                     if c in PENDING else c for c in sorted(SITE_OPTIONS)])
def test_u17_site_is_documented_as_a_name_or_a_file(command):
    option = SITE_OPTIONS[command]
    assert option.metavar == "NAME|FILE", (command, option.metavar)
    [row] = [ln for ln in (REPO / "docs" / "cli.md").read_text().splitlines() if ln.startswith(f"| `envport {command} ")]
    assert "[--site NAME\\|FILE]" in row, row


@pytest.mark.parametrize("command", ["pull", "push", "inspect"])
def test_u17_the_admins_commands_say_what_a_site_file_is(command):
    assert "sites/NAME.yaml" in SITE_OPTIONS[command].help and ".yaml or .yml" in SITE_OPTIONS[command].help
    assert "`--site NAME|FILE`" in (REPO / "docs" / "sites.md").read_text()


def test_u17_pull_takes_a_site_file_outside_any_project(project, hostile, sif_bytes, tmp_path):
    site = tmp_path / "admin-site.yml"
    shutil.copyfile(project / "sites" / f"{HOSTILE_SITE}.yaml", site)
    serve(hostile, sif_bytes)
    proc = run_envport("pull", hostile.url(), "--site", str(site), "-o", str(tmp_path / "out"), "--json",
                       root=tmp_path, timeout=RUN_S)
    assert proc.returncode == 0 and step_of(proc)["verdict"] == "OK", fail_with(proc, "pull --site FILE")


# --- U21: present when the digest is already there, both ways ---------------------------------------------------


def test_u21_a_second_pull_is_present_and_downloads_nothing(project, hostile, sif_bytes, tmp_path):
    serve(hostile, sif_bytes)
    out = tmp_path / "out"
    first = pull(project, hostile, out)
    assert first.returncode == 0 and step_of(first)["verdict"] == "OK", fail_with(first, "first pull")
    assert hostile.hits["blob"] == 1
    for args in ((), ("--force",)):
        again = pull(project, hostile, out, *args)
        step = step_of(again)
        assert again.returncode == 0 and step["verdict"] == "present", fail_with(again, f"pull again {args}")
        digest = "sha256:" + hashlib.sha256(sif_bytes).hexdigest()
        assert digest in step["detail"] and "nothing was downloaded" in step["detail"], step["detail"]
        assert hostile.hits["blob"] == 1, "the layer was downloaded again"
    assert listing(out) == [NAME] and (out / NAME).read_bytes() == sif_bytes


def test_u21_a_different_file_under_the_name_is_not_present(project, hostile, sif_bytes, tmp_path):
    serve(hostile, sif_bytes)
    out = tmp_path / "out"
    out.mkdir()
    other = bytearray(sif_bytes)
    other[-1] ^= 0xFF  # the same size, one byte changed: only its sha256 tells
    (out / NAME).write_bytes(bytes(other))
    proc = pull(project, hostile, out)
    step = step_of(proc)
    assert proc.returncode == 3 and step["reason"] == "output_exists", fail_with(proc, "pull over another file")
    assert (out / NAME).read_bytes() == bytes(other) and hostile.hits["blob"] == 0
    proc = pull(project, hostile, out, "--force")
    assert proc.returncode == 0 and step_of(proc)["verdict"] == "OK", fail_with(proc, "pull --force")
    assert (out / NAME).read_bytes() == sif_bytes and hostile.hits["blob"] == 1


def _manifest_digest(registry, repo: str, tag: str) -> str:
    status, headers, body = registry.get(f"/v2/{repo}/manifests/{tag}", accept=OCI_MANIFEST)
    assert status == 200, (status, body[:300])
    return "sha256:" + hashlib.sha256(body).hexdigest()


def test_u21_a_second_push_is_present_and_sends_nothing(admin, registry, small_project):
    repo, first = push(admin.unsigned, registry, small_project, "v1")
    tag = as_json(first)["steps"][0]["data"]["tags"][0]
    before = {t: _manifest_digest(registry, repo, t) for t in (tag, "v1")}
    proc = run_envport("push", SMALL, "--site", SITE, "--sif", str(admin.unsigned), "--to", registry.url(repo),
                       "--tag", "v1", "--json", root=small_project, timeout=RUN_S)
    step = as_json(proc)["steps"][0]
    assert proc.returncode == 0 and step["verdict"] == "present", fail_with(proc, "push again")
    assert "nothing was sent" in step["detail"] and step["data"]["digest"] in step["detail"], step["detail"]
    # The registry's own answer: the manifests are the ones the first push wrote (a new PUT would carry a new
    # created annotation, so a new digest).
    assert {t: _manifest_digest(registry, repo, t) for t in (tag, "v1")} == before


def test_u21_a_push_of_a_new_tag_sends_only_the_tag(admin, registry, small_project):
    repo, _ = push(admin.unsigned, registry, small_project)
    proc = run_envport("push", SMALL, "--site", SITE, "--sif", str(admin.unsigned), "--to", registry.url(repo),
                       "--tag", "v2", "--json", root=small_project, timeout=RUN_S)
    step = as_json(proc)["steps"][0]
    assert proc.returncode == 0 and step["verdict"] == "OK", fail_with(proc, "push a new tag")
    assert "the layer was already there, not sent again" in step["detail"], step["detail"]
    status, _, body = registry.get(f"/v2/{repo}/tags/list")
    assert status == 200 and "v2" in json.loads(body)["tags"]


# --- U8: one judgement of the signatures, one exit code, in pull and inspect --------------------------------


def _signature_step(proc) -> dict:
    return next(s for s in as_json(proc)["steps"] if s["step"].startswith("signatures "))


@pytest.mark.parametrize("which, verdict, reason, code", [
    ("stranger_pub", "REFUSED", "untrusted_signer", 3),
    ("signer_pub", "OK", "", 0),
])
def test_u8_pull_and_inspect_judge_the_same_key_alike(admin, registry, small_project, which, verdict, reason,
                                                      code):
    key = str(getattr(admin.keys, which))
    repo, _ = push(admin.signed, registry, small_project, "v1")
    out = admin.folder / unique("u8-out")
    pulled = pull_real(admin, registry.url(repo, "v1"), out, "--site", str(ca_site(admin.folder, unique("u8"))),
                       "--key", key)
    inspected = run_envport("inspect", str(admin.signed), "--key", key, "--json", root=admin.folder, timeout=RUN_S)
    step, signatures = as_json(pulled)["steps"][0], _signature_step(inspected)
    assert (pulled.returncode, inspected.returncode) == (code, code), (fail_with(pulled, "pull"),
                                                                       fail_with(inspected, "inspect"))
    assert step["reason"] == signatures["reason"] == reason, (step, signatures)
    assert signatures["verdict"] == verdict and step["verdict"] == (verdict if code else "OK"), (step, signatures)
    assert listing(out) == ([] if code else [f"{repo.rsplit('/', 1)[-1]}_v1.sif"])


def test_u8_an_unsigned_sif_is_refused_alike_when_a_key_is_given(admin, registry, small_project):
    repo, _ = push(admin.unsigned, registry, small_project, "v1")
    key = str(admin.keys.signer_pub)
    out = admin.folder / unique("u8-unsigned")
    pulled = pull_real(admin, registry.url(repo, "v1"), out, "--site", str(ca_site(admin.folder, unique("u8"))),
                       "--key", key)
    inspected = run_envport("inspect", str(admin.unsigned), "--key", key, "--json", root=admin.folder,
                            timeout=RUN_S)
    assert pulled.returncode == inspected.returncode == 3, (fail_with(pulled, "pull"), fail_with(inspected, "inspect"))
    assert as_json(pulled)["steps"][0]["reason"] == _signature_step(inspected)["reason"] == "unsigned"
    assert listing(out) == []

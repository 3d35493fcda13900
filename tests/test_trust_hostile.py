"""Issue 35, rows G6, G10, G11 and G12: hostile inputs to the trust machinery, each on the real code path.

- G6: a signature object holding JSON nested 100,000 deep (bare, inside an envelope, as a DSSE payload, as a
  PGP clear-signed text) on a real SIF envport built: `[bad_signature]`, exit 3, from `envport verify-sig`,
  `envport inspect --key` and `envport sign`, never a RecursionError traceback.
- G10: a site-packages tree (made on disk) whose METADATA names `../../../etc/passwd` or carries terminal
  escapes: `sbom.make_sbom` (what `envport sbom` calls) skips and counts them, and says so.
- G11: a state dir another user owns and anyone can write (this test chowns a temp dir to uid 65534 and
  makes it 0777; it needs root): a build record forged there is never read, nor one written.
- G12: key files that are no regular file (`/dev/zero`, a FIFO, a directory) or too large, given with
  `--key`, `--pgp-keyring` or in a site's `trust.keys`: exit 2 (3 for a PGP keyring) naming the file, never a
  hang or a memory blow-up (each CLI run has a timeout and an address-space cap).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import resource
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from envport.core.errors import EnvportError
from envport.sif import dsse
from envport.sif.append import append_object
from envport.sif.format import DATA_SIGNATURE, GROUP_MASK
from envport.sif.image import read_raw

from .support import REPO, as_json, fail_with, missing
from .test_sif_sign import new_key, tiny_copy  # noqa: F401  (tiny_copy: a fixture)

pytest_plugins = ["tests.sif_fixtures"]

TESTDATA = REPO.parent / "shared" / "sif-testdata"  # CI keeps a copy of shared/ beside the clone
DEEP = 100_000
CLI_TIMEOUT = 120
# Enough for envport (python, cryptography, pydantic); far less than `/dev/zero` read whole would take.
ADDRESS_SPACE_CAP = 4 << 30
SIGNATURE_EXTRA = b"\1\0\0\0" + bytes(256)  # hash type 1 (SHA-256), a zero entity: as `envport sign` writes


def envport(*args: str, root: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """The real CLI in a subprocess, under a timeout (a hang fails the test) and an address-space cap (a
    file read whole fails the run, not the machine)."""
    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_CAP, ADDRESS_SPACE_CAP))

    try:
        return subprocess.run([sys.executable, "-m", "envport", "-C", str(root), *args], cwd=root,
                              capture_output=True, text=True, timeout=CLI_TIMEOUT, env=env, preexec_fn=cap)
    except subprocess.TimeoutExpired:
        pytest.fail(f"envport {' '.join(args)} did not finish in {CLI_TIMEOUT}s (it blocked)", pytrace=False)


def no_traceback(proc: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in proc.stderr + proc.stdout, fail_with(proc, "a traceback")


# --- G6: JSON nested 100,000 deep as the signature ---------------------------------------------------------

NESTED = b"[" * DEEP + b"]" * DEEP


def crafted_signature(shape: str) -> bytes:
    if shape == "bare":
        return NESTED
    if shape == "in_envelope":
        return (b'{"payloadType":"' + dsse.PAYLOAD_TYPE.encode() + b'","payload":"","signatures":'
                + NESTED + b"}")
    if shape == "as_payload":  # a well-formed envelope whose (unverified) payload nests deep
        return json.dumps({"payloadType": dsse.PAYLOAD_TYPE, "payload": base64.b64encode(NESTED).decode(),
                           "signatures": [{"keyid": "SHA256:someone-else", "sig": "c2ln"}]}).encode()
    if shape == "pgp":  # a clear-signed message whose signed text nests deep
        return (b"-----BEGIN PGP SIGNED MESSAGE-----\nHash: SHA256\n\n" + NESTED
                + b"\n-----BEGIN PGP SIGNATURE-----\n\niQ==\n-----END PGP SIGNATURE-----\n")
    raise AssertionError(shape)


def with_crafted_signature(path: Path, shape: str) -> None:
    """PATH (a real, unsigned SIF envport built) gets the crafted object as the signature of its object group
    1, where `envport sign` puts its own (the same descriptor: linked to the group, SHA-256)."""
    entity = bytes.fromhex("12045C8C0B1004D058DE4BEDA20C27EE7FF7BA84") + bytes(236) if shape == "pgp" else bytes(256)
    append_object(read_raw(path), datatype=DATA_SIGNATURE, group_word=GROUP_MASK, link=GROUP_MASK | 1,
                  data=crafted_signature(shape), time=0, extra=SIGNATURE_EXTRA[:4] + entity)


@pytest.mark.parametrize("shape", ["bare", "in_envelope", "as_payload", "pgp"])
def test_g6_a_signature_nested_100000_deep_is_a_bad_signature_in_verify_sig_inspect_and_sign(
        tiny_copy, tmp_path, sif_project, shape):
    priv, pub = new_key(tmp_path, "ed25519")
    with_crafted_signature(tiny_copy, shape)

    proc = envport("verify-sig", str(tiny_copy), "--key", str(pub), "--json", root=sif_project)
    no_traceback(proc)
    (step,) = as_json(proc)["steps"]
    assert proc.returncode == 3 and (step["verdict"], step["reason"]) == ("REFUSED", "bad_signature"), step
    assert "damaged" in step["detail"], step["detail"]

    proc = envport("inspect", str(tiny_copy), "--key", str(pub), "--json", root=sif_project)
    no_traceback(proc)
    steps = {s["step"].split()[0]: s for s in as_json(proc)["steps"]}
    assert proc.returncode == 3, fail_with(proc, "inspect --key")
    assert (steps["signatures"]["verdict"], steps["signatures"]["reason"]) == ("REFUSED", "bad_signature"), steps

    before = tiny_copy.read_bytes()
    proc = envport("sign", str(tiny_copy), "--key", str(priv), root=sif_project)
    no_traceback(proc)
    assert proc.returncode == 3 and "[already_signed]" in proc.stdout, fail_with(proc, "sign")
    assert tiny_copy.read_bytes() == before


def test_g6_the_envelope_decoder_refuses_too_deep_and_too_large_json():
    for data in (NESTED, crafted_signature("in_envelope"), crafted_signature("as_payload"),
                 b'{"payloadType":"x","payload":"","signatures":[],"pad":"' + b"a" * (2 << 20) + b'"}'):
        with pytest.raises(dsse.BadEnvelope):
            dsse.decode(data)
    # a real envelope still reads
    env = dsse.decode(dsse.encode(b'{"version":1}', [("SHA256:k", b"sig")]))
    assert env.payload == b'{"version":1}' and env.signatures == (("SHA256:k", b"sig"),)


# --- G10: distribution names pip would not accept ----------------------------------------------------------


def dist(site: Path, dirname: str, name: str, version: str) -> None:
    d = site / dirname
    d.mkdir()
    (d / "METADATA").write_bytes(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode())


def test_g10_sbom_skips_and_counts_distributions_whose_name_or_version_pip_would_not_accept(tmp_path, capsys):
    from envport.sif import sbom

    tree = tmp_path / "tree"
    venv = tree / "opt" / "envport" / "venv"
    site = venv / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    dist(site, "six-1.16.0.dist-info", "six", "1.16.0")
    dist(site, "passwd-1.0.dist-info", "../../../etc/passwd", "1.0")
    dist(site, "esc-1.0.dist-info", "evil\x1b[2Jname", "1.0")
    dist(site, "ver-1.0.dist-info", "fine", "1.0\x1b]0;owned\x07")
    dist(site, "dots-1.0.dist-info", "..", "1.0")
    facts = sbom.EnvFacts("hostile", "a" * 64, "docker")

    text, packages = sbom.make_sbom(tree, facts)
    assert [(p.name, p.version) for p in packages] == [("six", "1.16.0")]
    doc = json.loads(text)
    assert [c["purl"] for c in doc["components"]] == ["pkg:pypi/six@1.16.0"]
    assert "passwd" not in json.dumps(doc["components"]) and "\x1b" not in text, text
    props = {p["name"]: p["value"] for p in doc["metadata"]["properties"]}
    assert props["envport:skipped"].startswith("4 Python distributions"), props
    err = capsys.readouterr().err
    assert "skipped 4 Python distributions" in err and "etc/passwd" in err, err
    assert "\x1b" not in err and "\\x1b" in err, err  # named, escaped

    spdx, packages = sbom.make_sbom(tree, facts, fmt="spdx")
    assert len(packages) == 1 and "etc/passwd" not in json.dumps(json.loads(spdx)["packages"][1:])


# --- G11: a state dir another user owns and can write ------------------------------------------------------


@pytest.fixture
def foreign_state(tmp_path, monkeypatch) -> Path:
    """A state dir as another user would leave it: this test chowns a temp dir to uid 65534, mode 0777."""
    if os.geteuid() != 0:
        missing("a folder owned by another user (chown to uid 65534) needs root")
    state = tmp_path / "state"
    (state / "sifs").mkdir(parents=True)
    for d in (state, state / "sifs"):
        os.chown(d, 65534, 65534)
        os.chmod(d, 0o777)
    monkeypatch.setenv("ENVPORT_STATE_DIR", str(state))
    return state


def partition_sha256(path: Path) -> str:
    part = next(d for d in read_raw(path).descriptors if d.datatype == 0x4004 and d.extra[4:8] == b"\2\0\0\0")
    with open(path, "rb") as fh:
        fh.seek(part.offset)
        return hashlib.sha256(fh.read(part.size)).hexdigest()


def test_g11_a_build_record_forged_in_another_users_state_dir_is_never_read(tiny_copy, tiny_sif, sif_project,
                                                                             foreign_state):
    from envport.sif import record

    forged = Path(record.record_path(str(tiny_copy)))
    forged.write_text(f"{record.RECORD_HEADER}\n{os.path.realpath(tiny_copy)}\n{tiny_sif.hash}\n"
                      f"{record.stamp(os.stat(tiny_copy))}\n{partition_sha256(tiny_copy)}\nforged\n")
    os.chown(forged, 65534, 65534)

    proc = envport("inspect", str(tiny_copy), root=sif_project, env=dict(os.environ))
    no_traceback(proc)
    assert proc.returncode == 3 and "[state_dir_unsafe]" in proc.stderr, fail_with(proc, "inspect")
    assert f"{foreign_state} (the state dir" in proc.stderr and "uid 65534" in proc.stderr, proc.stderr
    assert "drwxrwxrwx" in proc.stderr and "chmod go-w" in proc.stderr, proc.stderr
    assert "integrity" not in proc.stdout, proc.stdout

    # the functions every reader and writer goes through
    with pytest.raises(EnvportError, match=r"\[state_dir_unsafe\] .*uid 65534") as refused:
        record.read(str(tiny_copy))
    assert refused.value.exit_code == 3
    assert record.unchanged(str(tiny_copy), tiny_sif.hash) is False  # the no-op build's doubt: the full path
    forged.unlink()
    with pytest.raises(EnvportError, match=r"\[state_dir_unsafe\]"):
        record.write(str(tiny_copy), tiny_sif.hash, "0" * 64, "layout")
    assert not forged.exists()


def test_g11_a_private_state_dir_is_made_0700_and_used(tmp_path, monkeypatch):
    from envport.sif import record

    state = tmp_path / "deep" / "state"
    monkeypatch.setenv("ENVPORT_STATE_DIR", str(state))
    sif = tmp_path / "x.sif"
    sif.write_bytes(b"x")
    record.write(str(sif), "h" * 64, "0" * 64, "layout")
    assert stat.S_IMODE(state.stat().st_mode) == 0o700 and stat.S_IMODE(state.parent.stat().st_mode) == 0o700
    assert record.read(str(sif))["hash"] == "h" * 64 and record.unchanged(str(sif), "h" * 64)


SETUP_TEMPLATE = REPO / "renderers" / "setup.sh.j2"


def shell_not_private(path: Path, role: str) -> str:
    """renderers/setup.sh.j2's own `not_private` (the envs-dir rule the setup scripts apply), run by bash."""
    text = SETUP_TEMPLATE.read_text()
    start = text.index("not_private() {")
    body = text[start:text.index("\n}\n", start) + 3]
    got = subprocess.run(["bash", "-c", body + 'not_private "$1" "$2"', "sh", str(path), role],
                         capture_output=True, text=True, timeout=30)
    return got.stdout.strip()


@pytest.mark.parametrize("owner, mode, role", [
    (None, 0o700, "dir"), (None, 0o755, "dir"), (None, 0o770, "dir"), (None, 0o777, "dir"),
    (65534, 0o700, "dir"), (None, 0o777, "parent"), (None, 0o1777, "parent"), (65534, 0o755, "parent"),
    (0, 0o1777, "parent"), (65534, 0o1777, "parent"),
])
def test_g11_the_state_dir_rule_is_the_envs_dir_rule(tmp_path, owner, mode, role):
    """The python rule (core/private.py) says what the setup scripts' shell rule says, on the same folders."""
    from envport.core.private import not_private

    if owner not in (None, os.getuid()) and os.geteuid() != 0:
        missing("a folder owned by another user (chown) needs root")
    d = tmp_path / "d"
    d.mkdir()
    if owner is not None:
        os.chown(d, owner, owner)
    os.chmod(d, mode)
    assert bool(not_private(str(d), role)) == bool(shell_not_private(d, role)), (
        not_private(str(d), role), shell_not_private(d, role))


# --- G12: key files that are no regular file, or too large -------------------------------------------------


@pytest.fixture
def bad_keys(tmp_path) -> dict[str, tuple[Path, str]]:
    """Each kind of bad key file and the words its refusal must hold."""
    fifo = tmp_path / "key.fifo"
    os.mkfifo(fifo)
    folder = tmp_path / "key-dir"
    folder.mkdir()
    big = tmp_path / "big.pem"
    with open(big, "wb") as fh:
        fh.truncate(2 << 20)
    return {"dev_zero": (Path("/dev/zero"), "a character device"), "fifo": (fifo, "a FIFO"),
            "directory": (folder, "a directory"), "oversized": (big, "larger than 1 MiB")}


@pytest.mark.parametrize("kind", ["dev_zero", "fifo", "directory", "oversized"])
def test_g12_a_key_that_is_no_small_regular_file_is_a_usage_error_naming_it(tiny_copy, sif_project, bad_keys,
                                                                             kind):
    path, words = bad_keys[kind]
    for args in (("verify-sig", str(tiny_copy), "--key", str(path)),
                 ("inspect", str(tiny_copy), "--key", str(path)),
                 ("sign", str(tiny_copy), "--key", str(path))):
        proc = envport(*args, root=sif_project)
        no_traceback(proc)
        assert proc.returncode == 2, fail_with(proc, " ".join(args[:1] + args[2:]))
        assert f"{path}: {words}" in proc.stderr, proc.stderr


def test_g12_a_site_whose_trust_keys_names_a_fifo_is_refused_naming_the_site_and_the_key(tiny_copy, sif_project,
                                                                                         bad_keys):
    fifo, _ = bad_keys["fifo"]
    site = fifo.parent / "fifo-site.yaml"
    site.write_text(yaml.safe_dump({"name": "fifo-site", "trust": {"keys": [fifo.name], "require_signed": True}}))
    proc = envport("inspect", str(tiny_copy), "--site", str(site), root=sif_project)
    no_traceback(proc)
    assert proc.returncode == 2, fail_with(proc, "inspect --site")
    assert str(site) in proc.stderr and "trust.keys" in proc.stderr and f"{fifo}: a FIFO" in proc.stderr, \
        proc.stderr


def test_g12_a_pgp_keyring_that_is_a_fifo_never_hangs(tmp_path, sif_project, bad_keys):
    if not (TESTDATA / "images").is_dir():
        missing(f"{TESTDATA} is absent: apptainer's SIF test vectors (shared/sif-testdata) lie beside the checkout")
    if shutil.which("gpg") is None:
        missing("gpg is not installed (apt-get install gnupg)")
    sif = tmp_path / "pgp.sif"
    shutil.copyfile(TESTDATA / "images" / "one-group-signed-pgp.sif", sif)
    fifo, _ = bad_keys["fifo"]
    proc = envport("verify-sig", str(sif), "--pgp-keyring", str(fifo), "--json", root=sif_project)
    no_traceback(proc)
    (step,) = as_json(proc)["steps"]
    assert proc.returncode == 3 and step["reason"] == "bad_key", step
    assert f"{fifo}: a FIFO" in step["detail"], step["detail"]

"""SIF signatures in apptainer's format: envport signs (sif/sign.py) and checks (sif/verify.py).

Two sources of truth, both real: apptainer's own signed test SIFs (../shared/sif-testdata, written by the
SIF library `apptainer sign` uses) and SIFs envport's `.def` builder makes (tests/sif_fixtures.py
`tiny_sif`). Every tamper case is a real edit of a copy: a flipped byte, or an object added with Debian's
`siftool add` (an independent SIF writer).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed25519, rsa

from envport.sif.header import DESCRIPTOR, DESCRIPTORS_OFFSET
from envport.sif.image import read_raw
from envport.sif.keys import load_private_key, load_public_key
from envport.sif.sign import sign_sif
from envport.sif.verify import check_signatures

from .sif_fixtures import SIF_TIMEOUT, require_sif_tools, sif_env
from .support import as_json, copy_project, fail_with, missing, run_envport, write_site, write_spec

pytest_plugins = ["tests.sif_fixtures"]

ROOT = Path(__file__).resolve().parents[1]
TESTDATA = ROOT.parent / "shared" / "sif-testdata"  # CI keeps a copy of shared/ beside the clone
NAME_AT = 4 + 1 + 4 * 3 + 8 * 7  # a descriptor's name field: after type, used, id/group/link, seven int64
UPSTREAM_FPR = "12045C8C0B1004D058DE4BEDA20C27EE7FF7BA84"  # keys/private.asc's primary key (gpg --show-keys)


def upstream(tmp_path: Path, name: str) -> Path:
    """A writable copy of an upstream test SIF."""
    if not (TESTDATA / "images").is_dir():
        missing(f"{TESTDATA} is absent: apptainer's SIF test vectors (shared/sif-testdata) lie beside the checkout")
    dest = tmp_path / name
    shutil.copyfile(TESTDATA / "images" / name, dest)
    return dest


def upstream_key(name: str):
    return load_public_key(TESTDATA / "keys" / name)


def flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([byte[0] ^ 0x01]))


def descriptor_at(path: Path, object_id: int) -> int:
    """The file offset of object OBJECT_ID's descriptor."""
    slot = next(d.slot for d in read_raw(path).descriptors if d.id == object_id)
    return DESCRIPTORS_OFFSET + slot * DESCRIPTOR.size


def partition(path: Path):
    return next(d for d in read_raw(path).descriptors if d.datatype == 0x4004 and d.extra[4:8] == b"\2\0\0\0")


def siftool_add_to_group(path: Path, tmp_path: Path) -> None:
    """Add an SBOM object to group 1 with Debian's siftool (what adding an SBOM after signing would do)."""
    if shutil.which("siftool") is None:
        missing("siftool is not installed (apt-get install siftool)")
    sbom = tmp_path / "late.cdx.json"
    sbom.write_text('{"bomFormat":"CycloneDX","specVersion":"1.5"}')
    got = subprocess.run(["siftool", "add", str(path), str(sbom), "--datatype", "9", "--sbomformat",
                          "cyclonedx-json", "--groupid", "1"], capture_output=True, text=True, timeout=60)
    assert got.returncode == 0, got.stdout + got.stderr


def verdict_and_problems(path: Path, keys) -> tuple[str, str]:
    report = check_signatures(path, keys)
    return report.verdict, " | ".join(report.problems)


# --- apptainer's own signed SIFs ----------------------------------------------------------------------------


@pytest.mark.parametrize("image", ["one-group-signed-dsse.sif", "two-groups-signed-dsse.sif"])
@pytest.mark.parametrize("key", ["ed25519-public.pem", "rsa-public.pem"])
def test_upstream_dsse_signatures_verify(tmp_path, image, key):
    path = upstream(tmp_path, image)
    report = check_signatures(path, [upstream_key(key)])
    assert report.verdict == "verified", report.problems
    groups = 2 if image.startswith("two") else 1
    assert [s.group for s in report.signatures] == list(range(1, groups + 1))
    assert all(s.form == "dsse" and s.hash == "sha256" and len(s.signers) == 2 for s in report.signatures)
    assert report.signatures[0].objects == (1, 2)
    assert upstream_key(key).keyid in report.signatures[0].by


def test_upstream_dsse_with_the_ecdsa_key_is_an_untrusted_signer(tmp_path):
    """Upstream's own tests expect the ECDSA key to fail: neither envelope signature names it."""
    path = upstream(tmp_path, "one-group-signed-dsse.sif")
    verdict, problems = verdict_and_problems(path, [upstream_key("ecdsa-public.pem")])
    assert verdict == "untrusted_signer", problems
    assert upstream_key("ed25519-public.pem").keyid in problems  # names who did sign


@pytest.mark.parametrize("tamper, expect", [
    ("partition", "the data of object 2 (FS"),
    ("descriptor", "the descriptor of object 1 (FS)"),
    ("header", "the global header changed"),
    ("added", "object 4 (SBOM) is in the group but not signed: added after signing"),
    ("signature", "signature"),
])
def test_upstream_dsse_tampered_is_a_bad_signature(tmp_path, tamper, expect):
    path = upstream(tmp_path, "one-group-signed-dsse.sif")
    key = upstream_key("ed25519-public.pem")
    assert check_signatures(path, [key]).ok
    if tamper == "partition":
        flip(path, partition(path).offset + 100)
    elif tamper == "descriptor":
        flip(path, descriptor_at(path, 1) + NAME_AT)
    elif tamper == "header":
        flip(path, 48)  # inside the uuid (bytes 48..63)
    elif tamper == "added":
        siftool_add_to_group(path, tmp_path)
    else:
        sig = read_raw(path).by_id(3)
        raw = path.read_bytes()[sig.offset:sig.end]
        # one byte inside the first signature value: still JSON and base64, the signature no longer checks
        flip(path, sig.offset + raw.index(b'"sig":"') + 12)
    verdict, problems = verdict_and_problems(path, [key])
    assert verdict == "bad_signature", problems
    assert expect in problems


def test_public_key_forms_apptainer_reads(tmp_path):
    """PKIX `PUBLIC KEY` and PKCS#1 `RSA PUBLIC KEY` both load; of a file with two keys only the first counts."""
    path = upstream(tmp_path, "one-group-signed-dsse.sif")
    rsa_pub = serialization.load_pem_public_key((TESTDATA / "keys" / "rsa-public.pem").read_bytes())
    pkcs1 = tmp_path / "rsa-pkcs1.pem"
    pkcs1.write_bytes(rsa_pub.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.PKCS1))
    assert pkcs1.read_bytes().startswith(b"-----BEGIN RSA PUBLIC KEY-----")
    assert check_signatures(path, [load_public_key(pkcs1)]).ok
    two = tmp_path / "two.pem"
    two.write_bytes((TESTDATA / "keys" / "ecdsa-public.pem").read_bytes() + pkcs1.read_bytes())
    assert load_public_key(two).keyid == upstream_key("ecdsa-public.pem").keyid
    assert check_signatures(path, [load_public_key(two)]).verdict == "untrusted_signer"


def covered_bytes(path: Path) -> list[range]:
    """The byte ranges a group signature covers (apptainer/sif `pkg/integrity`): the header's launch script, magic, version
    and uuid; each grouped descriptor's type, link, size, ctime, uid, gid, name and extra; each object. (The
    `used` byte is a boolean to sif as here: 0x01 and 0x03 both mean used, so its other bits change nothing.)"""
    ranges = [range(0, 45), range(48, 64)]
    for d in read_raw(path).descriptors:
        if d.datatype == 0x4005:
            continue
        base = DESCRIPTORS_OFFSET + d.slot * DESCRIPTOR.size
        ranges += [range(base + a, base + b) for a, b in ((0, 4), (13, 17), (25, 33), (41, 49), (57, 585))]
        ranges.append(range(d.offset, d.end))
    return ranges


@pytest.mark.parametrize("signer", ["apptainer", "envport"])
def test_any_flipped_covered_byte_is_never_verified(tmp_path, signer):
    """Property (hypothesis): flipping any one bit of any byte a signature covers leaves the SIF unverified
    (or not a SIF at all), for apptainer's signature and for envport's over the same image."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from envport.sif.format import SifError

    from .support import examples

    if signer == "apptainer":
        source, keys = upstream(tmp_path, "one-group-signed-dsse.sif"), [upstream_key("ed25519-public.pem")]
    else:
        source = upstream(tmp_path, "one-group.sif")
        priv, pub = new_key(tmp_path, "ed25519")
        sign_sif(source, [load_private_key(priv)])
        keys = [load_public_key(pub)]
    assert check_signatures(source, keys).ok
    offsets = [i for r in covered_bytes(source) for i in r]
    pristine = source.read_bytes()
    work = tmp_path / "flipped.sif"

    @settings(max_examples=examples(150, 1500, "ENVPORT_SIGN_FLIPS"), deadline=None, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(st.sampled_from(offsets), st.integers(0, 7))
    def flipped(offset, bit):
        data = bytearray(pristine)
        data[offset] ^= 1 << bit
        work.write_bytes(bytes(data))
        try:
            verdict = check_signatures(work, keys).verdict
        except SifError:
            return  # no longer a readable SIF: refused before any signature question
        assert verdict != "verified", f"byte {offset} bit {bit} flipped and the signature still verified"

    flipped()


def test_upstream_header_times_are_not_signed(tmp_path):
    """As in sif: the header's times and counts are outside the signature (a later append rewrites them)."""
    path = upstream(tmp_path, "one-group-signed-dsse.sif")
    flip(path, 64)  # created_at
    assert check_signatures(path, [upstream_key("rsa-public.pem")]).ok


@pytest.mark.parametrize("image", ["one-group.sif", "one-group-signed-legacy.sif"])
def test_upstream_unsigned_and_legacy_are_unsigned(tmp_path, image):
    verdict, problems = verdict_and_problems(upstream(tmp_path, image), [upstream_key("rsa-public.pem")])
    assert verdict == "unsigned", problems
    assert "object group 1 has no signature" in problems


def siftool_add_signature(path: Path, data: bytes, tmp_path: Path) -> None:
    """Link one more signature object to group 1 with Debian's siftool (hash SHA-256, zero entity)."""
    if shutil.which("siftool") is None:
        missing("siftool is not installed (apt-get install siftool)")
    blob = tmp_path / "extra-signature.bin"
    blob.write_bytes(data)
    got = subprocess.run(["siftool", "add", str(path), str(blob), "--datatype", "5", "--link", str(0xF0000001),
                          "--signhash", "1", "--signentity", "0" * 40], capture_output=True, text=True, timeout=60)
    assert got.returncode == 0, got.stdout + got.stderr


def test_a_group_signed_by_two_keys_needs_both_as_apptainer_does(tmp_path):
    """Every signature linked to a group must verify: a second signer's object fails the group with one key."""
    keys = {}
    for kind in ("ed25519", "rsa"):
        path = upstream(tmp_path, "one-group.sif")
        priv, pub = new_key(tmp_path, kind)
        sign_sif(path, [load_private_key(priv)])
        sig = read_raw(path).by_id(3)
        keys[kind] = (load_public_key(pub), path.read_bytes()[sig.offset:sig.end])
        path.unlink()
    path = upstream(tmp_path, "one-group.sif")
    siftool_add_signature(path, keys["ed25519"][1], tmp_path)
    siftool_add_signature(path, keys["rsa"][1], tmp_path)
    one = check_signatures(path, [keys["ed25519"][0]])
    assert one.verdict == "untrusted_signer", one.problems
    assert [s.verdict for s in one.signatures] == ["verified", "untrusted_signer"]
    assert check_signatures(path, [keys["ed25519"][0], keys["rsa"][0]]).ok


def test_an_oversized_signature_object_is_not_read_and_fails_its_group(tmp_path):
    path = upstream(tmp_path, "one-group-signed-dsse.sif")
    siftool_add_signature(path, os.urandom(2 << 20), tmp_path)
    report = check_signatures(path, [upstream_key("rsa-public.pem")])
    assert report.verdict == "bad_signature", report.problems
    assert "over 1048576: no signature is that large" in report.problems[0]


def _canonical(path: Path):
    """Every field of header and descriptors and every object's bytes, except what one newline moves."""
    image = read_raw(path)
    raw = path.read_bytes()
    header = {k: v for k, v in image.header.items() if k != "data_size"}
    descs = []
    for d in image.descriptors:
        data = raw[d.offset:d.end]
        descs.append((d.slot, d.datatype, d.id, d.group_word, d.link, d.ctime, d.mtime, d.uid, d.gid, d.name,
                      d.extra, data.rstrip(b"\n") if d.datatype == 0x4005 else data))
    return header, descs


@pytest.mark.parametrize("image", ["one-group", "two-groups"])
def test_envport_reproduces_apptainers_signatures_byte_for_byte(tmp_path, image):
    """Signing the unsigned upstream SIF with upstream's keys gives upstream's signed SIF: the same envelope
    (Ed25519 and RSA PKCS#1 v1.5 are deterministic), descriptors, IDs, links, Extra and times. The one
    difference is the newline older sif versions put after the envelope (newer ones, like envport, do not)."""
    path = upstream(tmp_path, f"{image}.sif")
    keys = [load_private_key(TESTDATA / "keys" / k) for k in ("ed25519-private.pem", "rsa-private.pem")]
    signed = sign_sif(path, keys)
    assert [s.group for s in signed] == ([1] if image == "one-group" else [1, 2])
    theirs = TESTDATA / "images" / f"{image}-signed-dsse.sif"
    assert _canonical(path) == _canonical(theirs)
    ours_raw, theirs_raw = path.read_bytes(), theirs.read_bytes()
    for ours_d, theirs_d in zip(read_raw(path).descriptors, read_raw(theirs).descriptors):
        if ours_d.datatype == 0x4005:
            assert ours_raw[ours_d.offset:ours_d.end] + b"\n" == theirs_raw[theirs_d.offset:theirs_d.end]


def test_upstream_pgp_signature_is_listed_and_needs_a_pgp_key(tmp_path):
    path = upstream(tmp_path, "one-group-signed-pgp.sif")
    report = check_signatures(path, [upstream_key("rsa-public.pem")])
    assert report.verdict == "untrusted_signer", report.problems
    (sig,) = report.signatures
    assert (sig.form, sig.signers, sig.objects) == ("pgp", (UPSTREAM_FPR,), (1, 2))
    assert "key material not provided" in sig.detail


def gpg_home(tmp_path: Path) -> dict:
    if shutil.which("gpg") is None:
        missing("gpg is not installed (apt-get install gnupg)")
    home = tmp_path / "gnupg"
    home.mkdir(mode=0o700)
    return dict(os.environ, GNUPGHOME=str(home))


def gpg(env: dict, *args: str, stdin: str | None = None) -> str:
    got = subprocess.run(["gpg", "--batch", *args], env=env, input=stdin, capture_output=True, text=True,
                         timeout=120)
    assert got.returncode == 0, got.stderr
    return got.stdout


@pytest.fixture
def gnupg(tmp_path):
    """A throwaway GNUPGHOME (the user's keyring is never touched); its agent is stopped afterwards."""
    env = gpg_home(tmp_path)
    yield env
    subprocess.run(["gpgconf", "--kill", "all"], env=env, capture_output=True, timeout=60)


def test_upstream_pgp_signature_verifies_with_its_pgp_key_and_not_when_tampered(tmp_path, gnupg):
    gpg(gnupg, "--import", str(TESTDATA / "keys" / "private.asc"))
    ring = tmp_path / "pub.asc"
    ring.write_text(gpg(gnupg, "--armor", "--export", UPSTREAM_FPR))
    path = upstream(tmp_path, "one-group-signed-pgp.sif")
    report = check_signatures(path, pgp_keyrings=[str(ring)])
    assert report.verdict == "verified", report.problems
    assert report.signatures[0].by == UPSTREAM_FPR
    flip(path, partition(path).offset + 7)
    verdict = check_signatures(path, pgp_keyrings=[str(ring)])
    assert verdict.verdict == "bad_signature" and "the data of object 2" in verdict.problems[0]


# --- SIFs envport built, signed by envport ------------------------------------------------------------------


def new_key(tmp_path: Path, kind: str) -> tuple[Path, Path]:
    key = {"ed25519": lambda: ed25519.Ed25519PrivateKey.generate(),
           "rsa": lambda: rsa.generate_private_key(public_exponent=65537, key_size=2048),
           "ecdsa": lambda: ec.generate_private_key(ec.SECP256R1())}[kind]()
    priv, pub = tmp_path / f"{kind}.pem", tmp_path / f"{kind}.pub.pem"
    priv.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    pub.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                  serialization.PublicFormat.SubjectPublicKeyInfo))
    return priv, pub


@pytest.fixture
def tiny_copy(tiny_sif, tmp_path) -> Path:
    dest = tmp_path / tiny_sif.path.name
    shutil.copyfile(tiny_sif.path, dest)
    return dest


def envport(*args: str, root: Path):
    return run_envport(*args, root=root, timeout=300)


def test_envport_signs_a_sif_it_built_and_its_verifier_accepts_it(tiny_copy, tmp_path, sif_project):
    priv, pub = new_key(tmp_path, "ed25519")
    proc = envport("sign", str(tiny_copy), "--key", str(priv), "--json", root=sif_project)
    assert proc.returncode == 0, fail_with(proc, "envport sign")
    (step,) = as_json(proc)["steps"]
    assert step["verdict"] == "OK", step
    objects = [d.id for d in read_raw(tiny_copy).descriptors if d.datatype != 0x4005]
    assert step["data"]["signed"] == [{"group": 1, "signature_id": len(objects) + 1, "form": "dsse",
                                       "signer": load_public_key(pub).keyid, "objects": objects}]
    proc = envport("verify-sig", str(tiny_copy), "--key", str(pub), root=sif_project)
    assert proc.returncode == 0, fail_with(proc, "envport verify-sig")
    assert "OK       signatures" in proc.stdout and load_public_key(pub).keyid in proc.stdout
    # Debian's siftool (an independent reader) sees a SHA-256 signature linked to group 1
    listing = subprocess.run(["siftool", "list", str(tiny_copy)], capture_output=True, text=True, timeout=60)
    assert "|NONE    |1   (G) |" in listing.stdout and "Signature (SHA-256)" in listing.stdout, listing.stdout
    # signing again with the same key changes nothing; another key is refused (apptainer would need both)
    before = tiny_copy.read_bytes()
    again = envport("sign", str(tiny_copy), "--key", str(priv), root=sif_project)
    assert again.returncode == 0 and again.stdout.startswith("present"), fail_with(again, "sign again")
    assert tiny_copy.read_bytes() == before
    other, _ = new_key(tmp_path, "rsa")
    refused = envport("sign", str(tiny_copy), "--key", str(other), root=sif_project)
    assert refused.returncode == 3 and "[already_signed]" in refused.stdout, fail_with(refused, "second signer")
    assert tiny_copy.read_bytes() == before


@pytest.mark.parametrize("kind", ["rsa", "ecdsa"])
def test_envport_signs_with_every_key_type_apptainer_accepts(tiny_copy, tmp_path, kind):
    priv, pub = new_key(tmp_path, kind)
    sign_sif(tiny_copy, [load_private_key(priv)])
    assert check_signatures(tiny_copy, [load_public_key(pub)]).ok


@pytest.mark.parametrize("tamper, reason, expect", [
    ("partition", "bad_signature", "the data of object {part} (FS"),
    ("descriptor", "bad_signature", "the descriptor of object {part} (FS)"),
    ("header", "bad_signature", "the global header changed"),
    ("added", "bad_signature", "(SBOM) is in the group but not signed: added after signing"),
    ("other_key", "untrusted_signer", "no given key made it"),
    ("unsigned", "unsigned", "object group 1 has no signature"),
])
def test_envport_signed_sif_tampered_is_refused_with_the_right_reason(tiny_copy, tmp_path, sif_project, tamper,
                                                                      reason, expect):
    priv, pub = new_key(tmp_path, "ed25519")
    if tamper != "unsigned":
        sign_sif(tiny_copy, [load_private_key(priv)])
    part = partition(tiny_copy)  # the last object envport's builder writes (sif/format.py write_sif)
    if tamper == "partition":
        flip(tiny_copy, part.offset + part.size // 2)
    elif tamper == "descriptor":
        flip(tiny_copy, descriptor_at(tiny_copy, part.id) + NAME_AT + 128 + 8)  # Extra: the partition's arch "02"
    elif tamper == "header":
        flip(tiny_copy, 5)  # the launch script
    elif tamper == "added":
        siftool_add_to_group(tiny_copy, tmp_path)
    elif tamper == "other_key":
        _, pub = new_key(tmp_path, "rsa")
    proc = envport("verify-sig", str(tiny_copy), "--key", str(pub), "--json", root=sif_project)
    out = as_json(proc)
    assert proc.returncode == 3, fail_with(proc, "verify-sig of a tampered SIF")
    (step,) = out["steps"]
    assert (step["verdict"], step["reason"]) == ("REFUSED", reason), step
    assert expect.format(part=part.id) in step["detail"], step["detail"]


def test_envport_pgp_signs_and_prints_the_ecl_execgroup(tiny_copy, tmp_path, gnupg, sif_project):
    gpg(gnupg, "--passphrase", "", "--quick-gen-key", "envport test <test@example.invalid>", "ed25519", "sign",
        "never")
    fpr = next(line.split(":")[9] for line in gpg(gnupg, "--with-colons", "--fingerprint",
                                                   "--list-secret-keys").splitlines() if line.startswith("fpr:"))
    env = dict(gnupg, ENVPORT_SIF_BUILDER="envport")
    proc = run_envport("sign", str(tiny_copy), "--pgp-key", fpr, root=sif_project, env=env, timeout=300)
    assert proc.returncode == 0, fail_with(proc, "envport sign --pgp-key")
    ring = tmp_path / "pub.asc"
    ring.write_text(gpg(gnupg, "--armor", "--export", fpr))
    report = check_signatures(tiny_copy, pgp_keyrings=[str(ring)])
    assert report.verdict == "verified", report.problems
    assert (report.signatures[0].form, report.signatures[0].signers) == ("pgp", (fpr,))
    ecl = run_envport("sign", str(tiny_copy), "--ecl", root=sif_project, env=env, timeout=60)
    assert ecl.returncode == 0, fail_with(ecl, "envport sign --ecl")
    assert ecl.stdout == ("# for apptainer's ecl.toml (with activated = true): SIFs anywhere signed by one of "
                          f'these PGP keys\n[[execgroup]]\n  tagname = "{tiny_copy.stem}"\n  mode = "whitelist"\n'
                          f'  dirpath = ""\n  keyfp = ["{fpr}"]\n')


def test_ecl_refuses_a_dsse_only_sif(tiny_copy, tmp_path, sif_project):
    priv, _ = new_key(tmp_path, "ed25519")
    sign_sif(tiny_copy, [load_private_key(priv)])
    proc = envport("sign", str(tiny_copy), "--ecl", root=sif_project)
    assert proc.returncode == 3 and "[no_pgp_signature]" in proc.stderr, fail_with(proc, "sign --ecl")


def test_bad_key_files_are_usage_errors_naming_the_file(tiny_copy, tmp_path, sif_project):
    dsa_key = dsa.generate_private_key(key_size=2048)
    bad = tmp_path / "dsa.pem"
    bad.write_bytes(dsa_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    proc = envport("sign", str(tiny_copy), "--key", str(bad), root=sif_project)
    assert proc.returncode == 2 and f"{bad}: a DSAPrivateKey key" in proc.stderr, fail_with(proc, "DSA key")
    proc = envport("verify-sig", str(tiny_copy), "--key", str(tmp_path / "nope.pem"), root=sif_project)
    assert proc.returncode == 2 and "nope.pem: cannot read the key file" in proc.stderr, fail_with(proc, "no key")


def test_build_sign_signs_the_sif_last_and_a_second_build_is_present(base_image, tmp_path):
    """`envport build NAME --target apptainer --sign KEY.pem`, in a project of its own (the session's tiny SIF
    is shared by other tests and must stay unsigned). The second build takes the signed SIF as present (the
    builder checks its content: the signature changed the file it recorded) and the signature as present."""
    require_sif_tools()
    root = copy_project(tmp_path / "project")
    write_spec(root, "tiny-signed")
    write_site(root, "sif-fast", apptainer={"compression": "lz4"})
    priv, pub = new_key(tmp_path, "ed25519")
    args = ("build", "tiny-signed", "--target", "apptainer", "--site", "sif-fast", "--sign", str(priv), "--json")
    proc = run_envport(*args, root=root, env=sif_env(), timeout=SIF_TIMEOUT)
    assert proc.returncode == 0, fail_with(proc, "build --sign")
    steps = as_json(proc)["steps"]
    assert [s["verdict"] for s in steps[-2:]] == ["OK", "OK"], steps
    assert steps[-1]["step"].startswith("sign tiny-signed-"), steps[-1]
    sif = Path(steps[-2]["data"]["sif"])
    report = check_signatures(sif, [load_public_key(pub)])
    assert report.ok, report.problems
    # every object the build wrote is covered: the signature came last
    assert report.signatures[0].objects == tuple(d.id for d in read_raw(sif).descriptors if d.datatype != 0x4005)
    signed = sif.read_bytes()
    again = run_envport(*args, root=root, env=sif_env(), timeout=SIF_TIMEOUT)
    assert again.returncode == 0, fail_with(again, "second build --sign")
    assert [s["verdict"] for s in as_json(again)["steps"][-2:]] == ["present", "present"], again.stdout
    assert sif.read_bytes() == signed
    refused = run_envport("build", "tiny-signed", "--target", "docker", "--sign", str(priv), root=root, timeout=60)
    assert refused.returncode == 2 and "--sign is for --target apptainer" in refused.stderr, refused.stderr

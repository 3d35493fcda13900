"""`envport pull` and `push --sif` against registries and files that lie (issue 35 rows G4, G5, G7, G8, G9, G13).

The registry that lies is a real HTTPS server of this module's own on 127.0.0.1 (a CA made here, sited as the
profile's `registry_ca`), answering the distribution API's GETs with what each test crafts: a manifest of the
wrong JSON types, a title naming another file, a layer of a PiB, a 64 MiB manifest, bytes trickled one at a
time. The pulls are the real CLI in a subprocess, bounded by timeouts; the layer served is a real SIF
written by envport's own writer (sif/format.py `write_sif`, mksquashfs for the partition). Row G13 pushes to
the real test registry (tests/registry_fixture.py) and reads its tags back over the registry's own HTTP API.
"""

from __future__ import annotations

import collections
import datetime
import hashlib
import ipaddress
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable

import pytest

from envport.core.files import remove_stale_partials, replacing

from .registry_fixture import SITE, SMALL, registry, small_project  # noqa: F401 (fixtures)
from .support import as_json, cli_env, copy_project, fail_with, missing, run_envport, unique, write_site

SIF_LAYER = "application/vnd.sylabs.sif.layer.v1.sif"
SIF_CONFIG = "application/vnd.sylabs.sif.config.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
TITLE = "org.opencontainers.image.title"
IDLE_VAR = "ENVPORT_REGISTRY_IDLE_S"
HOSTILE_SITE = "hostile"
REPO, TAG = "envs/tool", "v1"
NAME = "tool_v1.sif"  # what `apptainer pull oras://HOST/envs/tool:v1` names the file
RUN_S = 90  # the bound on any one envport run here: a pull that waits forever fails the test, never hangs it


# --- a CA, a server certificate for 127.0.0.1, a project whose site trusts that CA ------------------------


def _tls(folder: Path) -> tuple[Path, Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def cert(subject: str, key, issuer: str, issuer_key, ca: bool):
        b = (x509.CertificateBuilder()
             .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
             .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
             .public_key(key.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
             .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
             .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
             .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()),
                            critical=False))
        if ca:
            b = b.add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                              data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                              crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
        else:
            b = b.add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                                critical=False)
        return b.sign(issuer_key, hashes.SHA256())

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    paths = folder / "ca.crt", folder / "server.crt", folder / "server.key"
    paths[0].write_bytes(cert("hostile test CA", ca_key, "hostile test CA", ca_key, True)
                         .public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert("127.0.0.1", key, "hostile test CA", ca_key, False)
                         .public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return paths


@pytest.fixture(scope="module")
def tls(tmp_path_factory) -> tuple[Path, Path, Path]:
    return _tls(tmp_path_factory.mktemp("hostile-tls"))


@pytest.fixture(scope="module")
def project(tmp_path_factory, tls) -> Path:
    root = copy_project(tmp_path_factory.mktemp("hostile-project"))
    write_site(root, HOSTILE_SITE, registry_ca=str(tls[0]))
    return root


# --- a real SIF, small ----------------------------------------------------------------------------------


def make_sif(path: Path, labels: dict[str, str]) -> Path:
    """A SIF as envport's builder lays it out, with LABELS in its inspect-metadata.json."""
    from envport.sif.format import write_sif

    mksquashfs = shutil.which("mksquashfs")
    if mksquashfs is None:
        missing("mksquashfs missing: apt-get install squashfs-tools")
    tree = path.parent / f"{path.stem}-tree"
    (tree / "etc").mkdir(parents=True, exist_ok=True)
    (tree / "etc" / "hello").write_text("hello from a small SIF\n")
    sqfs = path.parent / f"{path.stem}.sqfs"
    subprocess.run([mksquashfs, str(tree), str(sqfs), "-noappend", "-comp", "gzip", "-all-root", "-mkfs-time", "0",
                    "-all-time", "0", "-quiet", "-no-progress"], check=True, capture_output=True, timeout=60)
    meta = json.dumps({"data": {"attributes": {"labels": labels}}, "type": "container"}).encode()
    write_sif(path, deffile=b"Bootstrap: docker\nFrom: debian:12\n", inspect_metadata=meta, squashfs_path=sqfs,
              created=1_700_000_000, uuid=bytes(range(16)))
    return path


@pytest.fixture(scope="module")
def sif_bytes(tmp_path_factory) -> bytes:
    return make_sif(tmp_path_factory.mktemp("hostile-sif") / "tool.sif", {"envport.name": "tool"}).read_bytes()


# --- the registry that lies -----------------------------------------------------------------------------

Answer = Callable[[BaseHTTPRequestHandler], None]


class Hostile:
    """HTTPS on 127.0.0.1 answering GET /v2/, GET .../manifests/TAG and GET .../blobs/DIGEST with the test's
    `manifest` and `blob` answers. `hits` counts the requests by kind, `sent` the body bytes written, `stop`
    ends every trickle at teardown."""

    def __init__(self, cert: Path, key: Path):
        self.manifest: Answer = lambda h: h.send_error(404)
        self.blob: Answer = lambda h: h.send_error(404)
        self.hits: collections.Counter = collections.Counter()
        self.sent = 0
        self.stop = threading.Event()
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(cert), str(key))
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self):
                self.request.settimeout(30)
                self.request = ctx.wrap_socket(self.request, server_side=True)  # on this thread, not the accept loop
                super().setup()

            def log_message(self, *args):
                pass

            def do_GET(self):
                kind = ("base" if self.path == "/v2/" else "manifest" if "/manifests/" in self.path
                        else "blob" if "/blobs/" in self.path else "other")
                outer.hits[kind] += 1
                answer = {"base": lambda h: body(b"{}", "application/json")(h), "manifest": outer.manifest,
                          "blob": outer.blob}.get(kind, lambda h: h.send_error(404))
                try:
                    answer(self)
                except (OSError, ssl.SSLError):
                    self.close_connection = True  # the client left

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address):
                pass  # a TCP probe that never speaks TLS (pull's `reachable`): nothing to say

        self.server = Server(("127.0.0.1", 0), Handler)
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()

    def url(self, repo: str = REPO, tag: str = TAG) -> str:
        return f"oras://{self.host}/{repo}:{tag}"

    def write(self, handler: BaseHTTPRequestHandler, data: bytes) -> None:
        handler.wfile.write(data)
        handler.wfile.flush()
        self.sent += len(data)

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hostile(tls):
    server = Hostile(tls[1], tls[2])
    yield server
    server.close()


def body(data: bytes, content_type: str = "application/octet-stream") -> Answer:
    def answer(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", content_type)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)
    return answer


def manifest_of(layer: dict | None = None, **top) -> bytes:
    config = {"mediaType": SIF_CONFIG, "size": 2, "digest": "sha256:" + hashlib.sha256(b"{}").hexdigest()}
    doc = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": config, "layers": [layer] if layer else []}
    doc.update(top)
    return json.dumps(doc).encode()


def sif_layer(data: bytes, title: str = NAME, **fields) -> dict:
    return {"mediaType": SIF_LAYER, "size": len(data), "digest": "sha256:" + hashlib.sha256(data).hexdigest(),
            "annotations": {TITLE: title}, **fields}


def serve(hostile: Hostile, data: bytes, title: str = NAME) -> None:
    hostile.manifest = body(manifest_of(sif_layer(data, title)), OCI_MANIFEST)
    hostile.blob = body(data)


def pull(project: Path, hostile: Hostile, out: Path, *args: str, env: dict | None = None,
         timeout: float = RUN_S) -> subprocess.CompletedProcess:
    return run_envport("pull", hostile.url(), "--site", HOSTILE_SITE, "-o", str(out), "--json", *args,
                       root=project, env=cli_env(**(env or {})), timeout=timeout)


def step_of(proc: subprocess.CompletedProcess) -> dict:
    assert "Traceback" not in proc.stderr, fail_with(proc, "pull")
    return as_json(proc)["steps"][0]


def listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


# --- G4: the file's name comes from the reference; nothing is replaced without --force ----------------------


def test_g4_the_title_annotation_does_not_name_the_file(project, hostile, sif_bytes, tmp_path):
    """A registry titling the layer `Justfile` must not replace DIR/Justfile: the file is named after the
    reference, REPO's last part + the tag + .sif, as `apptainer pull` names it."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "Justfile").write_text("build:\n\techo mine\n")
    serve(hostile, sif_bytes, title="Justfile")
    proc = pull(project, hostile, out)
    assert proc.returncode == 0, fail_with(proc, "pull of a layer titled Justfile")
    assert (out / "Justfile").read_bytes() == b"build:\n\techo mine\n"
    assert listing(out) == ["Justfile", NAME]
    assert (out / NAME).read_bytes() == sif_bytes
    assert step_of(proc)["data"]["path"] == str(out / NAME)


def test_g4_an_existing_file_is_replaced_only_with_force(project, hostile, sif_bytes, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / NAME).write_bytes(b"someone's own file")
    serve(hostile, sif_bytes)
    proc = pull(project, hostile, out)
    assert proc.returncode == 3, fail_with(proc, "pull over an existing file")
    step = step_of(proc)
    assert step["verdict"] == "REFUSED" and step["reason"] == "output_exists", step
    assert str(out / NAME) in step["detail"] and "--force" in step["detail"], step
    assert (out / NAME).read_bytes() == b"someone's own file" and listing(out) == [NAME]
    assert hostile.hits["blob"] == 0, "the layer was fetched for a pull that could not keep it"
    proc = pull(project, hostile, out, "--force")
    assert proc.returncode == 0, fail_with(proc, "pull --force")
    assert (out / NAME).read_bytes() == sif_bytes and listing(out) == [NAME]


def test_g4_a_symlink_under_the_name_is_not_followed_or_replaced(project, hostile, sif_bytes, tmp_path):
    out, target = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    target.write_text("not yours\n")
    (out / NAME).symlink_to(target)
    serve(hostile, sif_bytes)
    proc = pull(project, hostile, out)
    assert proc.returncode == 3 and step_of(proc)["reason"] == "output_exists", fail_with(proc, "pull over a link")
    assert target.read_text() == "not yours\n" and (out / NAME).is_symlink()


def test_g4_force_never_replaces_a_folder(project, hostile, sif_bytes, tmp_path):
    out = tmp_path / "out"
    (out / NAME).mkdir(parents=True)
    (out / NAME / "keep").write_text("x")
    serve(hostile, sif_bytes)
    proc = pull(project, hostile, out, "--force")
    assert proc.returncode == 3, fail_with(proc, "pull --force over a folder")
    step = step_of(proc)
    assert step["reason"] == "output_exists" and "folder" in step["detail"], step
    assert (out / NAME / "keep").read_text() == "x" and listing(out) == [NAME]


def test_g4_a_file_that_appears_during_the_pull_is_not_replaced(project, hostile, sif_bytes, tmp_path):
    """The check before the download is not the only one: the rename is a hard link, which fails when the
    name was taken meanwhile (here: while the layer is half sent)."""
    serve(hostile, sif_bytes)
    go_on = threading.Event()

    def halves(h):
        h.send_response(200)
        h.send_header("Content-Length", str(len(sif_bytes)))
        h.end_headers()
        hostile.write(h, sif_bytes[:len(sif_bytes) // 2])
        go_on.wait(RUN_S)
        hostile.write(h, sif_bytes[len(sif_bytes) // 2:])
    hostile.blob = halves
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "envport", "-C", str(project), "pull", hostile.url(), "--site",
                             HOSTILE_SITE, "-o", str(out), "--json"], cwd=project, env=cli_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + RUN_S
        while not hostile.sent and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        (out / NAME).write_bytes(b"written by someone else meanwhile")
        go_on.set()
        stdout, stderr = proc.communicate(timeout=RUN_S)
    finally:
        go_on.set()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 3, (proc.returncode, stdout, stderr)
    step = json.loads(stdout)["steps"][0]
    assert step["reason"] == "output_exists" and "appeared" in step["detail"], step
    assert (out / NAME).read_bytes() == b"written by someone else meanwhile" and listing(out) == [NAME]


# --- G5: a manifest of the wrong JSON types is not_a_sif_artifact, never a traceback ---------------------------

DIGEST0 = "sha256:" + "0" * 64


@pytest.mark.parametrize("manifest, names", [
    (b"[]", "a JSON array"),
    (b'"just a string"', "a JSON string"),
    (b"{not json", "not JSON"),
    (json.dumps({"layers": ["x"]}).encode(), "layers[0]"),
    (json.dumps({"layers": {"mediaType": SIF_LAYER}}).encode(), "layers"),
    (manifest_of({"mediaType": SIF_LAYER, "size": "abc", "digest": DIGEST0}), "layers[0].size"),
    (manifest_of({"mediaType": SIF_LAYER, "size": -1, "digest": DIGEST0}), "layers[0].size"),
    (manifest_of({"mediaType": SIF_LAYER, "size": True, "digest": DIGEST0}), "layers[0].size"),
    (manifest_of({"mediaType": SIF_LAYER, "size": 10, "digest": 12}), "layers[0].digest"),
    (manifest_of({"mediaType": SIF_LAYER, "size": 10, "digest": "sha256:../../etc"}), "layers[0].digest"),
    (manifest_of({"mediaType": ["x"], "size": 10, "digest": DIGEST0}), "layers[0].mediaType"),
    (manifest_of({"mediaType": SIF_LAYER, "size": 10, "digest": DIGEST0, "annotations": ["t"]}),
     "layers[0].annotations"),
    (manifest_of({"mediaType": SIF_LAYER, "size": 10, "digest": DIGEST0}, schemaVersion="2"), "schemaVersion"),
], ids=["list", "string", "not-json", "layer-string", "layers-object", "size-string", "size-negative", "size-bool",
        "digest-number", "digest-path", "mediatype-list", "annotations-list", "schema-version-string"])
def test_g5_a_manifest_of_the_wrong_types_is_refused_naming_the_field(project, hostile, tmp_path, manifest, names):
    hostile.manifest = body(manifest, OCI_MANIFEST)
    out = tmp_path / "out"
    proc = pull(project, hostile, out)
    assert proc.returncode == 3, fail_with(proc, "pull of a malformed manifest")
    step = step_of(proc)
    assert step["verdict"] == "REFUSED" and step["reason"] == "not_a_sif_artifact", step
    assert names in step["detail"] and f"{hostile.host}/{REPO}:{TAG}" in step["detail"], step
    assert hostile.hits["blob"] == 0 and listing(out) == []


# --- G7: a registry that trickles is refused after the idle timeout; SIGTERM is Ctrl-C --------------------------


def trickle(hostile: Hostile, data: bytes, every: float, content_type: str = "application/octet-stream") -> Answer:
    """Headers at once, then one byte of DATA every EVERY seconds (until the test ends)."""
    def answer(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", content_type)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.flush()
        for i in range(len(data)):
            if hostile.stop.wait(every):
                return
            hostile.write(h, data[i:i + 1])
    return answer


@pytest.mark.parametrize("what, every", [("blob", 0.3), ("blob", 5.0), ("manifest", 0.3)],
                         ids=["blob-faster-than-idle", "blob-slower-than-idle", "manifest"])
def test_g7_a_trickling_registry_is_refused_naming_the_stall(project, hostile, sif_bytes, tmp_path, what, every):
    """One byte every EVERY seconds, with the idle timeout at 2 s: refused registry_unreachable within a few
    idle timeouts, whether bytes stop for longer than the timeout or keep dribbling in below the floor."""
    serve(hostile, sif_bytes)
    if what == "blob":
        hostile.blob = trickle(hostile, sif_bytes, every)
    else:
        hostile.manifest = trickle(hostile, manifest_of(sif_layer(sif_bytes)), every, OCI_MANIFEST)
    out = tmp_path / "out"
    start = time.monotonic()
    try:
        proc = pull(project, hostile, out, env={IDLE_VAR: "2"}, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"pull from a registry trickling its {what} waited past 60 s (idle timeout 2 s)")
    took = time.monotonic() - start
    assert proc.returncode == 3, fail_with(proc, f"pull from a registry trickling its {what}")
    step = step_of(proc)
    assert step["verdict"] == "REFUSED" and step["reason"] == "registry_unreachable", step
    assert "stalled" in step["detail"] and what.replace("blob", "layer") in step["detail"] \
        and IDLE_VAR in step["detail"], step
    assert took < 30, f"refused after {took:.1f} s with a 2 s idle timeout"
    assert listing(out) == []


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP"])
def test_g7_sigterm_mid_pull_removes_the_partial_and_exits_130(project, hostile, sif_bytes, tmp_path, sig):
    """SIGTERM (a scheduler's, `timeout`'s) and SIGHUP (a closed terminal) end a pull as Ctrl-C does."""
    serve(hostile, sif_bytes)
    hostile.blob = trickle(hostile, sif_bytes, 0.2)
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "envport", "-C", str(project), "pull", hostile.url(), "--site",
                             HOSTILE_SITE, "-o", str(out)], cwd=project, env=cli_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + RUN_S
        while not (out.is_dir() and any(out.glob(f".{NAME}.partial-*")) and hostile.sent) \
                and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert any(out.glob(f".{NAME}.partial-*")), f"no partial appeared: {listing(out)}"
        proc.send_signal(getattr(signal, sig))
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, (proc.returncode, err)
    assert sig in err and "partial" in err and "Traceback" not in err, err
    assert listing(out) == []


# --- G8: a layer larger than the free space, a manifest of 64 MiB ---------------------------------------------


def test_g8_a_layer_larger_than_the_free_space_is_refused_before_the_first_byte(project, hostile, tmp_path):
    pib = 1 << 50
    layer = {"mediaType": SIF_LAYER, "size": pib, "digest": DIGEST0, "annotations": {TITLE: NAME}}
    hostile.manifest = body(manifest_of(layer), OCI_MANIFEST)

    def zeros(h):  # what a registry would start sending: bounded here, 8 MiB then the connection closes
        h.send_response(200)
        h.send_header("Content-Length", str(pib))
        h.end_headers()
        for _ in range(8):
            hostile.write(h, bytes(1 << 20))
        h.close_connection = True
    hostile.blob = zeros
    out = tmp_path / "out"
    proc = pull(project, hostile, out)
    assert proc.returncode == 3, fail_with(proc, "pull of a 1 PiB layer")
    step = step_of(proc)
    assert step["verdict"] == "REFUSED" and step["reason"] == "disk_low", step
    assert str(out) in step["detail"] and str(pib) in step["detail"], step
    assert hostile.hits["blob"] == 0, "the layer was requested"
    assert listing(out) == []


@pytest.mark.parametrize("length", [True, False], ids=["content-length", "close-delimited"])
def test_g8_a_huge_manifest_is_refused_without_reading_it_whole(project, hostile, tmp_path, length):
    size = 64 << 20
    pad = b" " * (1 << 20)

    def huge(h):
        h.send_response(200)
        h.send_header("Content-Type", OCI_MANIFEST)
        if length:
            h.send_header("Content-Length", str(size + 2))
        else:
            h.send_header("Connection", "close")
        h.end_headers()
        hostile.write(h, b"{")
        for _ in range(size >> 20):
            if hostile.stop.is_set():
                return
            hostile.write(h, pad)
        hostile.write(h, b"}")
        h.close_connection = True
    hostile.manifest = huge
    proc = pull(project, hostile, tmp_path / "out")
    assert proc.returncode == 3, fail_with(proc, "pull of a 64 MiB manifest")
    step = step_of(proc)
    assert step["reason"] == "not_a_sif_artifact" and "4 MiB" in step["detail"], step
    assert hostile.sent < 16 << 20, f"{hostile.sent >> 20} MiB of the manifest were read"


# --- G9: the stale-partial sweep touches this user's partials only ---------------------------------------------


def _dead_pid() -> int:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    return int(gone.stdout)


def test_g9_pull_leaves_another_users_partial_alone(project, hostile, sif_bytes, tmp_path):
    if os.geteuid() != 0:
        missing("a partial owned by another user is made with chown, which needs root")
    out = tmp_path / "shared"
    out.mkdir()
    os.chmod(out, 0o1777)  # a shared scratch folder
    dead = _dead_pid()
    theirs = out / f".{NAME}.partial-{dead}"  # another user's pull, on another host: its PID means nothing here
    theirs.write_bytes(b"their download so far")
    os.chown(theirs, 65534, 65534)
    mine = out / f".{NAME}.partial-{_dead_pid()}"  # this user's own pull, killed
    mine.write_bytes(b"my killed download")
    serve(hostile, sif_bytes)
    proc = pull(project, hostile, out)
    assert proc.returncode == 0, fail_with(proc, "pull into a shared folder")
    assert theirs.exists() and theirs.read_bytes() == b"their download so far", listing(out)
    assert not mine.exists(), listing(out)
    assert listing(out) == sorted([NAME, theirs.name])


def test_g9_on_a_shared_file_system_a_partial_is_swept_only_once_it_is_old(tmp_path):
    """On NFS (or any file system other hosts may mount) a PID gone here may be another host's live pull:
    this user's partial is removed only once it has not been written for an hour."""
    nfs = tmp_path / "mountinfo"
    nfs.write_text(f"36 25 0:32 / {tmp_path} rw,relatime - nfs4 server:/export rw\n")
    target = tmp_path / "out.sif"
    fresh, old = tmp_path / f".out.sif.partial-{_dead_pid()}", tmp_path / f".out.sif.partial-{_dead_pid()}"
    fresh.write_bytes(b"another host's live pull")
    old.write_bytes(b"a pull killed long ago")
    os.utime(old, (time.time() - 2 * 3600,) * 2)
    remove_stale_partials(target, mountinfo=str(nfs))
    assert fresh.exists() and not old.exists()
    with replacing(target) as partial:  # on the local disk the PID is this host's: removed at once
        partial.write_bytes(b"z")
    assert not fresh.exists() and target.read_bytes() == b"z"


# --- G13: push --sif tags the file with its own hash, never the project's ---------------------------------------


def _tags(registry, repo: str) -> list[str]:
    status, _, data = registry.get(f"/v2/{repo}/tags/list")
    return sorted(json.loads(data).get("tags") or []) if status == 200 else []


def test_g13_push_sif_tags_the_file_with_its_own_hash(registry, small_project, tmp_path):
    own = hashlib.sha256(b"another build of tiny-reg").hexdigest()
    sif = make_sif(tmp_path / "other-build.sif", {"envport.name": SMALL, "envport.hash": own})
    repo = f"envport/{unique('g13')}"
    proc = run_envport("push", SMALL, "--site", SITE, "--sif", str(sif), "--to", registry.url(repo), "--json",
                       root=small_project, timeout=RUN_S)
    assert proc.returncode == 0, fail_with(proc, "push --sif of another build")
    assert _tags(registry, repo) == [own[:12]], "the SIF was tagged with another hash than its own label's"
    step = as_json(proc)["steps"][0]
    assert step["data"]["tags"] == [own[:12]] and own[:12] in step["detail"], step


def test_g13_push_sif_of_another_env_is_refused(registry, small_project, tmp_path):
    sif = make_sif(tmp_path / "other-env.sif", {"envport.name": "other-env", "envport.hash": "a" * 64})
    repo = f"envport/{unique('g13')}"
    proc = run_envport("push", SMALL, "--site", SITE, "--sif", str(sif), "--to", registry.url(repo), "--json",
                       root=small_project, timeout=RUN_S)
    assert proc.returncode == 3, fail_with(proc, "push --sif of another env's SIF")
    step = as_json(proc)["steps"][0]
    assert step["reason"] == "sif_other_env" and "other-env" in step["detail"] and SMALL in step["detail"], step
    assert _tags(registry, repo) == []


def test_g13_push_sif_without_an_envport_hash_is_pushed_only_under_the_tags_given(registry, small_project,
                                                                                  tmp_path):
    sif = make_sif(tmp_path / "apptainer-built.sif", {"org.label-schema.build-arch": "amd64"})
    repo = f"envport/{unique('g13')}"
    proc = run_envport("push", SMALL, "--site", SITE, "--sif", str(sif), "--to", registry.url(repo), "--json",
                       root=small_project, timeout=RUN_S)
    assert proc.returncode == 3, fail_with(proc, "push --sif of a SIF without envport.hash, no tag")
    step = as_json(proc)["steps"][0]
    assert step["reason"] == "not_envport" and "--tag" in step["detail"], step
    assert _tags(registry, repo) == []
    proc = run_envport("push", SMALL, "--site", SITE, "--sif", str(sif), "--to", registry.url(repo, "v1"), "--json",
                       root=small_project, timeout=RUN_S)
    assert proc.returncode == 0, fail_with(proc, "push --sif of a SIF without envport.hash, tag v1")
    assert _tags(registry, repo) == ["v1"]


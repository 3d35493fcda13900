"""OCI registries over ORAS: the one module that talks to one (the `oras` package from PyPI).

- push: a SIF as `apptainer push FILE oras://REG/REPO:TAG` writes it (apptainer's ORAS media types, docs/registry.md): an OCI
  image manifest whose config is the 2 bytes `{}` of media type
  application/vnd.sylabs.sif.config.v1+json, exactly one layer of media type
  application/vnd.sylabs.sif.layer.v1.sif annotated org.opencontainers.image.title = the file's
  basename, and the manifest annotated org.opencontainers.image.created. Every further tag is the
  same manifest PUT again under that tag (blobs are not sent twice). oras's session, manifest checks and
  blob HEAD are used; the layer itself is envport's own streamed PUT (oras's reads the whole file into
  memory after hashing it 4 KiB at a time), a blob the repository has is not sent again.
- pull: the manifest must have exactly one SIF layer (apptainer's own rule); its bytes stream into a
  hidden partial file in the destination folder, hashed as they arrive; only a file whose size and
  sha256 are the layer's, whose SIF header reads, and which passes the caller's checks is renamed to
  its final name. Any failure or interruption removes the partial (a SIGKILL leaves a partial, never a
  final file; the next pull removes partials whose process is gone).
- A registry that does not accept a TCP connection is RegistryError `registry_unreachable` naming the
  address, at once: oras's own retry would wait ~2 minutes before saying so.
- TLS: the site profile's `registry_ca` (a PEM bundle) when set, else the system's store. Plain HTTP
  only for a loopback registry with `insecure=True`.
- Credentials, in this order: ENVPORT_REGISTRY_USER + ENVPORT_REGISTRY_PASSWORD, else the docker
  config file's `auths` entry for the host ($DOCKER_CONFIG/config.json, else ~/.docker/config.json).
  They never reach an argv, a log line or the ledger: only the Authorization header of requests.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import json
import os
import re
import socket
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Optional

from envport.core.errors import ReasonError
from envport.core.files import replacing

SCHEME = "oras://"
SIF_CONFIG_MEDIA_TYPE = "application/vnd.sylabs.sif.config.v1+json"
SIF_LAYER_MEDIA_TYPE = "application/vnd.sylabs.sif.layer.v1.sif"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
TITLE = "org.opencontainers.image.title"
CREATED = "org.opencontainers.image.created"
SIF_CONFIG = b"{}"  # apptainer's config blob for a SIF
USER_VAR, PASSWORD_VAR = "ENVPORT_REGISTRY_USER", "ENVPORT_REGISTRY_PASSWORD"
CONNECT_TIMEOUT_S = 5.0
CHUNK = 4 << 20
# A tag as the distribution spec allows it; a repository as lowercase path components.
TAG_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
REPO_RE = re.compile(r"[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*")
HOST_RE = re.compile(r"[A-Za-z0-9.-]+(?::[0-9]{1,5})?|\[[0-9A-Fa-f:]+\](?::[0-9]{1,5})?")


class RegistryError(ReasonError):
    """A push or pull that did not happen; `reason` is a stable token (registry_unreachable, not_found,
    tls_failed, denied, not_a_sif_artifact, digest_mismatch, not_a_sif, registry_error)."""


@dataclass(frozen=True)
class Ref:
    host: str  # host[:port]
    repo: str
    tag: Optional[str] = None

    def with_tag(self, tag: str) -> "Ref":
        return Ref(self.host, self.repo, tag)

    def __str__(self) -> str:
        return f"{self.host}/{self.repo}" + (f":{self.tag}" if self.tag else "")


def parse_ref(text: str) -> Ref:
    """oras://HOST[:PORT]/REPO[:TAG] as a Ref; ValueError with what was expected otherwise."""
    if not text.startswith(SCHEME):
        raise ValueError(f"{text!r}: expected oras://HOST[:PORT]/REPO[:TAG]")
    host, _, rest = text[len(SCHEME):].partition("/")
    repo, tag = rest, None
    if ":" in rest.rsplit("/", 1)[-1]:
        repo, _, tag = rest.rpartition(":")
    if not HOST_RE.fullmatch(host) or not REPO_RE.fullmatch(repo) or (tag is not None and not TAG_RE.fullmatch(tag)):
        raise ValueError(f"{text!r}: expected oras://HOST[:PORT]/REPO[:TAG] with a lowercase REPO "
                         "(a-z, 0-9, . _ - and /) and a TAG of at most 128 of A-Za-z0-9._-")
    return Ref(host, repo, tag)


def check_tag(tag: str) -> None:
    if not TAG_RE.fullmatch(tag):
        raise ValueError(f"tag {tag!r}: at most 128 of A-Za-z0-9._-, not starting with . or -")


def _host_port(host: str) -> tuple[str, int]:
    name, _, port = host.rpartition(":") if not host.endswith("]") and ":" in host else (host, "", "")
    return name.strip("[]"), int(port) if port else 443


def reachable(host: str, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Raise `registry_unreachable` unless HOST accepts a TCP connection within TIMEOUT."""
    name, port = _host_port(host)
    try:
        socket.create_connection((name, port), timeout=timeout).close()
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        raise RegistryError("registry_unreachable", f"registry {host} does not answer ({why}); start it "
                            "(here: .ci/services/registry.sh) or check the address in oras://HOST/REPO") from None


def credentials(host: str, environ=os.environ) -> Optional[tuple[str, str]]:
    """(user, password) for HOST from the environment, else the docker config file; None: anonymous."""
    user, password = environ.get(USER_VAR), environ.get(PASSWORD_VAR)
    if user and password:
        return user, password
    config = Path(environ.get("DOCKER_CONFIG") or Path.home() / ".docker") / "config.json"
    try:
        auths = json.loads(config.read_text()).get("auths") or {}
    except (OSError, ValueError, AttributeError):
        return None
    entry = auths.get(host) or auths.get(f"https://{host}") or {}
    token = entry.get("auth") if isinstance(entry, dict) else None
    if not token:
        return None
    try:
        user, _, password = base64.b64decode(token).decode("utf-8").partition(":")
    except (ValueError, UnicodeDecodeError):
        return None
    return (user, password) if user and password else None


@dataclass
class Client:
    """One registry host: an oras Registry with TLS and credentials set."""

    host: str
    ca: Optional[str] = None
    insecure: bool = False
    registry: object = field(default=None, repr=False)
    credentials: Optional[tuple[str, str]] = field(default=None, repr=False)

    def __post_init__(self):
        import oras.logger
        import oras.provider

        # oras prints the registry's error words and every retry on stderr, whatever `quiet` says; envport's
        # verdict carries them.
        oras.logger.setup_logger(quiet=True)
        oras.logger.logger.log_handler = []
        self.registry = oras.provider.Registry(hostname=self.host, insecure=self.insecure,
                                               tls_verify=self.ca or True, auth_backend="basic")
        self.credentials = found = credentials(self.host)
        if found:
            self.registry.auth.set_basic_auth(*found)
        # oras re-reads ~/.docker/config.json before each push and manifest GET; the credentials chosen
        # above (environment first) must stay the ones used.
        self.registry.auth.load_configs = lambda *a, **k: None

    def container(self, ref: Ref):
        return self.registry.get_container(f"{ref.host}/{ref.repo}:{ref.tag or 'latest'}")

    @contextlib.contextmanager
    def errors(self, ref: Ref, what: str):
        """Registry and TLS failures as RegistryError naming REF and what was being done."""
        import requests

        try:
            yield
        except RegistryError:
            raise
        except requests.exceptions.SSLError as exc:
            raise RegistryError("tls_failed", f"{what} {ref}: TLS to {ref.host} failed ({_short(exc)}); set the "
                                "site profile's registry_ca to the CA that signed the registry's certificate"
                                ) from None
        except requests.exceptions.ConnectionError as exc:
            raise RegistryError("registry_unreachable", f"{what} {ref}: registry {ref.host} dropped the "
                                f"connection ({_short(exc)})") from None
        except Exception as exc:  # oras raises ValueError/HTTPError with the registry's words
            text = _short(exc)
            reason = "denied" if re.search(r"\b40[13]\b|unauthori[sz]ed|denied", text, re.I) else \
                "not_found" if re.search(r"\b404\b|not found|MANIFEST_UNKNOWN", text, re.I) else "registry_error"
            fix = {"denied": f"; log in (docker login {ref.host}) or set {USER_VAR}/{PASSWORD_VAR}",
                   "not_found": "; check the repository and tag"}.get(reason, "")
            raise RegistryError(reason, f"{what} {ref}: {text}{fix}") from None

    def put_blob(self, container, blob: dict, opener: Callable, progress: Callable[[int, int], None] =
                 lambda done, total: None) -> None:
        """BLOB (mediaType, size, digest) into CONTAINER's repository unless it is there: POST an upload,
        then one PUT of the bytes OPENER() streams (the distribution spec's monolithic upload). The PUT is
        sent once, with the credentials up front: oras's retry after a 401 would send a spent stream."""
        if self.registry.blob_exists(blob, container):
            return
        start = f"{self.registry.prefix}://{container.upload_blob_url()}"
        r = self.registry.do_request(start, "POST", headers={"Content-Length": "0"})
        if r.status_code != 202 or not r.headers.get("Location"):
            raise ValueError(f"starting an upload: {r.status_code} {r.reason} {r.text[:200]}")
        location = urllib.parse.urljoin(start, r.headers["Location"])
        url = f"{location}{'&' if '?' in location else '?'}{urllib.parse.urlencode({'digest': blob['digest']})}"
        headers = {"Content-Type": "application/octet-stream", "Content-Length": str(blob["size"])}
        if self.credentials:
            headers.update(self.registry.auth.get_auth_header())
        with opener() as fh:
            r = self.registry.session.put(url, data=_Body(fh, blob["size"], progress), headers=headers,
                                          verify=self.ca or True)
        if r.status_code != 201:
            raise ValueError(f"uploading {blob['digest']}: {r.status_code} {r.reason} {r.text[:300]}")

    def manifest(self, ref: Ref) -> dict:
        accept = [OCI_MANIFEST, "application/vnd.docker.distribution.manifest.v2+json"]
        with self.errors(ref, "reading the manifest of"):
            return self.registry.get_manifest(self.container(ref), allowed_media_type=accept)


def _short(exc: Exception) -> str:
    return " ".join(str(exc).split())[:300]


# --- push ---------------------------------------------------------------------------------


def push_sif(sif: Path, ref: Ref, tags: list[str], *, ca: Optional[str] = None, insecure: bool = False,
             progress: Callable[[int, int], None] = lambda done, total: None) -> dict:
    """Push SIF under every tag of TAGS to REF's repository; {digest, size, tags, manifest_digest}.
    PROGRESS(sent, total) while the layer is sent."""
    from envport.plan.lock import sha256_file

    reachable(ref.host)
    client = Client(ref.host, ca, insecure)
    first = ref.with_tag(tags[0])
    sif = Path(sif).resolve()
    size = sif.stat().st_size
    layer = {"mediaType": SIF_LAYER_MEDIA_TYPE, "size": size, "digest": f"sha256:{sha256_file(sif)}",
             "annotations": {TITLE: sif.name}}
    config = {"mediaType": SIF_CONFIG_MEDIA_TYPE, "size": len(SIF_CONFIG),
              "digest": f"sha256:{hashlib.sha256(SIF_CONFIG).hexdigest()}"}
    manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": config, "layers": [layer],
                "annotations": {CREATED: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}}
    container = client.container(first)
    with client.errors(first, "pushing"):
        client.put_blob(container, config, lambda: io.BytesIO(SIF_CONFIG))
        client.put_blob(container, layer, lambda: open(sif, "rb"), progress)
        response = client.registry.upload_manifest(manifest, container)
        response.raise_for_status()
    for tag in tags[1:]:
        other = first.with_tag(tag)
        with client.errors(other, "tagging"):
            client.registry.upload_manifest(manifest, client.container(other)).raise_for_status()
    return {"digest": layer["digest"], "size": size, "tags": list(tags),
            "manifest_digest": response.headers.get("Docker-Content-Digest", "")}


class _Body:
    """An upload body read in large blocks whatever http.client asks (8 KiB: 34,000 TLS records and
    sendall calls for a 281 MB SIF), with PROGRESS as it goes."""

    def __init__(self, fh, size: int, progress: Callable[[int, int], None]):
        self.fh, self.size, self.progress, self.sent = fh, size, progress, 0

    def __len__(self) -> int:
        return self.size

    def read(self, _n: int = -1) -> bytes:
        data = self.fh.read(CHUNK)
        self.sent += len(data)
        self.progress(self.sent, self.size)
        return data


# --- pull ---------------------------------------------------------------------------------


def sif_layer(manifest: dict, ref: Ref) -> dict:
    layers = [x for x in manifest.get("layers") or [] if x.get("mediaType") == SIF_LAYER_MEDIA_TYPE]
    if len(layers) != 1:
        types = sorted({str(x.get("mediaType")) for x in manifest.get("layers") or []}) or ["no layers"]
        raise RegistryError("not_a_sif_artifact", f"{ref}: expected exactly one layer of media type "
                            f"{SIF_LAYER_MEDIA_TYPE} (what apptainer push writes), found {len(layers)} "
                            f"({', '.join(types)}): not a SIF pushed with oras")
    return layers[0]


def file_name(layer: dict, ref: Ref) -> str:
    """The layer's title when it is a plain file name, else REPO's last part + the tag + .sif."""
    title = str((layer.get("annotations") or {}).get(TITLE) or "")
    if re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9._+-]{0,200}", title) and ".." not in title:
        return title
    return f"{ref.repo.rsplit('/', 1)[-1]}_{ref.tag or 'latest'}.sif"


def pull_sif(ref: Ref, out_dir: Path, *, ca: Optional[str] = None, insecure: bool = False,
             check: Callable[[Path], None] = lambda path: None,
             progress: Callable[[int, int], None] = lambda done, total: None) -> dict:
    """Download REF's SIF into OUT_DIR; {path, digest, size}. CHECK(partial) runs on the complete,
    digest-checked file before the rename and raises to refuse it (the file is then removed)."""
    from envport.engines.sif import SifError, read_sif

    reachable(ref.host)
    client = Client(ref.host, ca, insecure)
    layer = sif_layer(client.manifest(ref), ref)
    digest, size = str(layer.get("digest", "")), int(layer.get("size", -1))
    algo, _, want = digest.partition(":")
    if algo != "sha256" or not re.fullmatch(r"[0-9a-f]{64}", want):
        raise RegistryError("registry_error", f"{ref}: layer digest {digest!r} is not sha256:<64 hex>")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    final = out_dir / file_name(layer, ref)
    # 0o755 as apptainer pull leaves it: the launch script runs the file.
    with replacing(final, mode=0o755) as partial:
        got, n = _download(client, ref, digest, partial, size, progress)
        if n != size or got != want:
            raise RegistryError("digest_mismatch", f"{ref}: received {n} bytes with sha256:{got}; the manifest "
                                f"says {size} bytes with {digest}: the transfer or the registry is corrupt; "
                                "nothing was written")
        try:
            read_sif(partial)
        except SifError as exc:
            raise RegistryError("not_a_sif", f"{ref}: the layer is not a usable SIF ({exc.message})") from None
        check(partial)
    return {"path": str(final), "digest": digest, "size": size}


def _download(client: Client, ref: Ref, digest: str, partial: Path, size: int,
              progress: Callable[[int, int], None]) -> tuple[str, int]:
    """Stream the blob into PARTIAL; (sha256 hex, bytes). engines/blob_writer hashes and writes on two threads
    while this one reads TLS; its errors (a full disk) are raised as they are, not as registry errors."""
    from envport.engines.blob_writer import BlobWriter, open_new

    fd = open_new(partial)
    try:
        with BlobWriter(fd) as sink:
            for chunk in _blob_chunks(client, ref, digest):
                sink.write(chunk)
                progress(sink.bytes, size)
                if sink.bytes > size:
                    break  # more than announced: stop reading, the size check refuses it
            return sink.close(), sink.bytes
    finally:
        os.close(fd)


def _blob_chunks(client: Client, ref: Ref, digest: str) -> Iterator[bytes]:
    with client.errors(ref, "downloading"):
        with client.registry.get_blob(client.container(ref), digest, stream=True) as r:
            r.raise_for_status()
            yield from r.iter_content(chunk_size=CHUNK)

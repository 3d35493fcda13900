"""OCI registries over ORAS: the one module that talks to one (the `oras` package from PyPI).

- push: a SIF as `apptainer push FILE oras://REG/REPO:TAG` writes it (apptainer's ORAS media types, docs/registry.md): an OCI
  image manifest whose config is the 2 bytes `{}` of media type
  application/vnd.sylabs.sif.config.v1+json, exactly one layer of media type
  application/vnd.sylabs.sif.layer.v1.sif annotated org.opencontainers.image.title = the file's
  basename, and the manifest annotated org.opencontainers.image.created. Every further tag is the
  same manifest PUT again under that tag (blobs are not sent twice). oras's session, manifest checks and
  blob HEAD are used; the layer itself is envport's own streamed PUT (oras's reads the whole file into
  memory after hashing it 4 KiB at a time), a blob the repository has is not sent again.
- pull: the manifest (read up to MANIFEST_MAX bytes, never whole) is checked against the fields it
  uses, their JSON types included (`check_manifest`), and must have exactly one SIF layer (apptainer's own
  rule). The file is named after the reference, REPO's last part + `_TAG.sif` as `apptainer pull` names it,
  never after the registry's title annotation, and an existing file (or link) under that name is replaced
  only with `force`. A layer larger than the free space of the folder is refused before the first byte.
  Its bytes stream into a hidden partial file in the destination folder, hashed as they arrive; only a
  file whose size and sha256 are the layer's and which passes the caller's checks (the SIF header among
  them) is renamed to its final name. Any failure or interruption removes the partial (a SIGKILL leaves a
  partial, never a final file; the next pull by the same user removes it: core/files.py
  `remove_stale_partials`).
- A pull that, waiting on the registry, receives less than STALL_BYTES in ENVPORT_REGISTRY_IDLE_S seconds
  (default 60: about 1 KiB/s; a registry that stops, or trickles) is RegistryError `registry_unreachable`
  naming the stall: a pull never waits forever.
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
import shutil
import signal
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Callable, Iterator, Optional

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
IDLE_VAR = "ENVPORT_REGISTRY_IDLE_S"
IDLE_S = 60.0  # a pull that, waiting on the registry, receives less than STALL_BYTES for this long has stalled
STALL_BYTES = 64 << 10  # so ~1 KiB/s at the default: a 100 MB SIF in 28 hours; also the size of each read
MANIFEST_MAX = 4 << 20  # apptainer's SIF manifest is under 1 KiB; an OCI manifest of 4 MiB is already absurd
# A tag as the distribution spec allows it; a repository as lowercase path components.
TAG_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
REPO_RE = re.compile(r"[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*")
HOST_RE = re.compile(r"[A-Za-z0-9.-]+(?::[0-9]{1,5})?|\[[0-9A-Fa-f:]+\](?::[0-9]{1,5})?")


class RegistryError(ReasonError):
    """A push or pull that did not happen; `reason` is a stable token (registry_unreachable, not_found,
    tls_failed, denied, not_a_sif_artifact, output_exists, disk_low, digest_mismatch, not_a_sif,
    registry_error)."""


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


def idle_seconds(environ=os.environ) -> float:
    """ENVPORT_REGISTRY_IDLE_S as seconds (default IDLE_S); ValueError naming the variable when it is not a
    number of seconds > 0."""
    raw = environ.get(IDLE_VAR, "").strip()
    if not raw:
        return IDLE_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value < 1e6:
        raise ValueError(f"{IDLE_VAR}={raw!r}: expected the seconds a pull waits on a registry that sends "
                         f"(almost) nothing before it stops, a number > 0 (default {IDLE_S:g})")
    return value


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
        import urllib3

        try:
            yield
        except RegistryError:
            raise
        except requests.exceptions.Timeout as exc:  # before ConnectionError: ConnectTimeout is both
            raise RegistryError("registry_unreachable", f"{what} {ref}: registry {ref.host} did not answer "
                                f"({_short(exc)}); check that it is up, or the network to it (the wait is "
                                f"{IDLE_VAR})") from None
        except urllib3.exceptions.ProtocolError as exc:  # the body cut short, the connection reset
            raise RegistryError("registry_unreachable", f"{what} {ref}: registry {ref.host} dropped the "
                                f"connection ({_short(exc)}); nothing was written") from None
        except requests.exceptions.SSLError as exc:
            raise RegistryError("tls_failed", f"{what} {ref}: TLS to {ref.host} failed ({_tls_reason(exc)}); set the "
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

    def fetch(self, ref: Ref, url: str, accept: str, what: str, idle: float, *, limit: Optional[int] = None,
              too_big: Optional[RegistryError] = None) -> Iterator[bytes]:
        """The body of a GET of URL (the distribution API's) as it arrives, its status checked; more than LIMIT
        bytes (announced or received) raise TOO_BIG. Not oras's `do_request`: that retries any failure five
        times over two minutes and sets no read timeout. Here the connection has CONNECT_TIMEOUT_S; the
        answer's headers must arrive within IDLE seconds, and every STALL_BYTES of the body too (`_deadlines`),
        so a registry that trickles, or stops, is `registry_unreachable` naming the stall. The body is asked
        for as it is (identity): what is counted and capped is what arrives."""
        import urllib3

        headers = {"Accept": accept, "Accept-Encoding": "identity"}
        if self.credentials:
            headers.update(self.registry.auth.get_auth_header())
        start, done, total = time.monotonic(), 0, "?"

        def stalled(why: str) -> RegistryError:
            return RegistryError("registry_unreachable", f"{ref}: the registry stalled sending the {what}: {why} "
                                 f"({done} of {total} bytes taken in {time.monotonic() - start:.0f} s); "
                                 f"nothing was written. A pull stops when, waiting on the registry, it receives "
                                 f"less than {STALL_BYTES >> 10} KiB in {IDLE_VAR}={idle:g} s: check the registry "
                                 f"and the network to {ref.host}, or raise {IDLE_VAR} for a slow link")

        with _deadlines() as bounded:
            try:
                r = bounded(idle, lambda: self.registry.session.request(
                    "GET", url, headers=headers, stream=True, verify=self.ca or True,
                    timeout=(CONNECT_TIMEOUT_S, idle)))
            except _Stalled:
                raise stalled(f"no answer within {idle:g} s") from None
            with r:
                total = r.headers.get("Content-Length", "?")
                try:
                    if r.status_code != 200:
                        text = bounded(idle, lambda: r.raw.read(4096, decode_content=False))
                        raise ValueError(f"{r.status_code} {r.reason}: {text.decode('utf-8', 'replace')}")
                    if limit is not None and total.isdigit() and int(total) > limit:
                        raise too_big
                    while data := bounded(idle, lambda: r.raw.read(STALL_BYTES, decode_content=False)):
                        done += len(data)
                        if limit is not None and done > limit:
                            raise too_big
                        yield data
                except _Stalled:
                    raise stalled(f"less than {STALL_BYTES >> 10} KiB in {idle:g} s") from None
                except urllib3.exceptions.ReadTimeoutError:
                    raise stalled(f"no byte for {idle:g} s") from None

    def manifest_bytes(self, ref: Ref, idle: float = IDLE_S) -> bytes:
        """REF's manifest as the registry serves it (its sha256 is the manifest's digest); at most MANIFEST_MAX
        bytes are read, and a registry that stalls is `registry_unreachable`."""
        accept = ", ".join([OCI_MANIFEST, "application/vnd.docker.distribution.manifest.v2+json"])
        url = f"{self.registry.prefix}://{self.container(ref).manifest_url()}"
        too_big = RegistryError("not_a_sif_artifact", f"{ref}: the registry's manifest is larger than "
                                f"{MANIFEST_MAX >> 20} MiB (a SIF's, as apptainer push writes it, is under 1 KiB): "
                                "not read further; not a SIF pushed with oras")
        with self.errors(ref, "reading the manifest of"):
            return b"".join(self.fetch(ref, url, accept, "manifest", idle, limit=MANIFEST_MAX, too_big=too_big))

    def manifest(self, ref: Ref, idle: float = IDLE_S) -> object:
        """REF's manifest as parsed JSON (any JSON: `check_manifest` judges it)."""
        data = self.manifest_bytes(ref, idle)
        try:
            return json.loads(data)
        except (ValueError, RecursionError) as exc:
            why = "nested too deeply" if isinstance(exc, RecursionError) else _short(exc)
            raise RegistryError("not_a_sif_artifact", f"{ref}: the registry's manifest is not JSON ({why}): "
                                "not a SIF pushed with oras") from None


class _Stalled(Exception):
    """A call `_deadlines` bounded ran past its seconds."""


@contextlib.contextmanager
def _deadlines() -> Iterator[Callable]:
    """`bounded(SECONDS, CALL)`: CALL() run with a deadline. A socket's timeout bounds each wait for bytes, so a
    registry sending one byte every few seconds passes it forever; here a one-shot SIGALRM, armed for the call
    alone, raises _Stalled inside it (a blocked read is interrupted, as Ctrl-C interrupts it). The time the
    caller spends between calls (writing to a slow disk) is not counted. Only the main thread takes signals:
    elsewhere CALL runs unbounded, the socket's timeout alone applies."""
    if threading.current_thread() is not threading.main_thread():
        yield lambda seconds, call: call()
        return
    armed = [False]

    def on_alarm(signum, frame):
        if armed[0]:
            armed[0] = False
            raise _Stalled()

    def bounded(seconds: float, call: Callable):
        armed[0] = True
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            return call()
        finally:
            armed[0] = False
            signal.setitimer(signal.ITIMER_REAL, 0)

    previous = signal.signal(signal.SIGALRM, on_alarm)
    try:
        yield bounded
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _short(exc: Exception, limit: int = 300) -> str:
    """EXC's words on one line, at most about LIMIT characters: cut after a whole word, with ` …` saying so (a
    reason cut mid-word reads as a different reason)."""
    text = " ".join(str(exc).split())
    if len(text) <= limit:
        return text
    return text[:limit].rsplit(" ", 1)[0] + " …"


def _tls_reason(exc: BaseException) -> str:
    """What OpenSSL said about a TLS failure, whole ("certificate verify failed: unable to get local issuer
    certificate"), found in the chain requests and urllib3 wrap it in (their text puts the URL first, and a long
    URL pushed the reason past any cut); the wrapper's own words when no ssl error is inside."""
    import ssl

    seen, todo = set(), [exc]
    while todo:
        e = todo.pop(0)
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, ssl.SSLCertVerificationError):
            return f"certificate verify failed: {e.verify_message}"
        if isinstance(e, ssl.SSLError):
            return e.reason or str(e)
        todo += [x for x in (*getattr(e, "args", ()), getattr(e, "reason", None), e.__cause__, e.__context__)
                 if isinstance(x, BaseException)]
    return _short(exc, 2000)


# --- push ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Layer:
    """The bytes a push sends: their file name (the title annotation), size, sha256, and how to read them
    from the start. `envport push` builds it from the SIF the trust gate opened (its descriptor, not the
    path); `file_layer` from a path."""

    name: str
    size: int
    sha256: str
    open: Callable[[], BinaryIO]


def file_layer(path: Path) -> Layer:
    from envport.plan.lock import sha256_file

    path = Path(path).resolve()
    return Layer(path.name, path.stat().st_size, sha256_file(path), lambda: open(path, "rb"))


def push_sif(sif: "Layer | Path", ref: Ref, tags: list[str], *, ca: Optional[str] = None, insecure: bool = False,
             progress: Callable[[int, int], None] = lambda done, total: None) -> dict:
    """Push SIF (a Layer, or a file's path) under every tag of TAGS to REF's repository; {digest, size, tags,
    manifest_digest, present, layer_sent, tags_sent}. PROGRESS(sent, total) while the layer is sent.

    What the registry already holds is asked, never assumed (issue 37 U21): a tag whose manifest names this
    very layer (its sha256) is not written again, and a blob the registry has (HEAD) is not sent again.
    `present`: every tag was there and the registry has the blob: nothing was sent at all. A missing tag gets
    the manifest the other tags already have, so every tag names one manifest."""
    source = sif if isinstance(sif, Layer) else file_layer(sif)
    reachable(ref.host)
    client = Client(ref.host, ca, insecure)
    first = ref.with_tag(tags[0])
    layer = {"mediaType": SIF_LAYER_MEDIA_TYPE, "size": source.size, "digest": f"sha256:{source.sha256}",
             "annotations": {TITLE: source.name}}
    there = {tag: _manifest_naming(client, first.with_tag(tag), layer["digest"]) for tag in tags}
    existing = next((m for m in there.values() if m is not None), None)
    container = client.container(first)
    with client.errors(first, "pushing"):
        has_blob = client.registry.blob_exists(layer, container)
    if existing is not None and has_blob and all(m is not None for m in there.values()):
        return {"digest": layer["digest"], "size": source.size, "tags": list(tags), "manifest_digest": "",
                "present": True, "layer_sent": False, "tags_sent": []}
    manifest = existing or _sif_manifest(layer)
    with client.errors(first, "pushing"):
        client.put_blob(container, manifest["config"], lambda: io.BytesIO(SIF_CONFIG))
        if not has_blob:
            client.put_blob(container, layer, source.open, progress)
    missing = [tag for tag in tags if there[tag] is None]
    digest = ""
    for tag in missing:
        other = first.with_tag(tag)
        with client.errors(other, "pushing" if tag == tags[0] else "tagging"):
            response = client.registry.upload_manifest(manifest, client.container(other))
            response.raise_for_status()
        digest = digest or response.headers.get("Docker-Content-Digest", "")
    return {"digest": layer["digest"], "size": source.size, "tags": list(tags), "manifest_digest": digest,
            "present": False, "layer_sent": not has_blob, "tags_sent": missing}


def _sif_manifest(layer: dict) -> dict:
    """The manifest `apptainer push` writes for LAYER: config `{}` of the SIF config type, one SIF layer."""
    return {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": _sif_config(), "layers": [layer],
            "annotations": {CREATED: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}}


def _sif_config() -> dict:
    return {"mediaType": SIF_CONFIG_MEDIA_TYPE, "size": len(SIF_CONFIG),
            "digest": f"sha256:{hashlib.sha256(SIF_CONFIG).hexdigest()}"}


def _manifest_naming(client: Client, ref: Ref, digest: str) -> Optional[dict]:
    """REF's manifest when the registry has one whose one SIF layer is DIGEST (and its config is apptainer's);
    None when the tag is not there or names something else (then it is written, as before)."""
    try:
        manifest = client.manifest(ref)
        layer = check_manifest(manifest, ref)
    except RegistryError as exc:
        if exc.reason in ("not_found", "not_a_sif_artifact"):
            return None
        raise
    return manifest if layer["digest"] == digest and manifest.get("config") == _sif_config() else None


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


def _shown(value: object) -> str:
    """A value from the registry as a person should see it: JSON, escapes escaped, cut at 60 characters."""
    text = json.dumps(value, ensure_ascii=True)
    return text if len(text) <= 60 else text[:57] + "..."


def _kind(value: object) -> str:
    return {dict: "a JSON object", list: "a JSON array", str: "a JSON string", bool: "a JSON boolean",
            type(None): "JSON null"}.get(type(value), "a JSON number")


def check_manifest(manifest: object, ref: Ref) -> dict:
    """MANIFEST (parsed JSON from the registry) checked against the OCI image manifest's schema, for every field
    pull reads, and its one SIF layer returned: {mediaType: str, size: int >= 0, digest: sha256:<64 hex>,
    annotations: {str: str}}. Anything else is RegistryError `not_a_sif_artifact` naming the field, what was
    expected and what was found."""
    def bad(name: str, expected: str, found: object) -> RegistryError:
        return RegistryError("not_a_sif_artifact", f"{ref}: manifest field {name}: expected {expected}, found "
                             f"{_kind(found)} {_shown(found)}: not a SIF manifest as apptainer push or envport "
                             "push writes it (docs/registry.md); ask whoever pushed it")

    if not isinstance(manifest, dict):
        raise RegistryError("not_a_sif_artifact", f"{ref}: the registry's manifest is {_kind(manifest)}, not a "
                            "JSON object: not a SIF pushed with oras")
    version = manifest.get("schemaVersion", 2)
    if type(version) is not int or version != 2:
        raise bad("schemaVersion", "the number 2", version)
    if not isinstance(manifest.get("mediaType", ""), str):
        raise bad("mediaType", "a string", manifest["mediaType"])
    layers = manifest.get("layers", [])
    if not isinstance(layers, list):
        raise bad("layers", "a JSON array of layer objects", layers)
    for i, layer in enumerate(layers):
        if not isinstance(layer, dict):
            raise bad(f"layers[{i}]", "a layer object {mediaType, size, digest}", layer)
        if not isinstance(layer.get("mediaType"), str):
            raise bad(f"layers[{i}].mediaType", "a string", layer.get("mediaType"))
    found = [(i, x) for i, x in enumerate(layers) if x["mediaType"] == SIF_LAYER_MEDIA_TYPE]
    if len(found) != 1:
        types = sorted({x["mediaType"] for x in layers}) or ["no layers"]
        raise RegistryError("not_a_sif_artifact", f"{ref}: expected exactly one layer of media type "
                            f"{SIF_LAYER_MEDIA_TYPE} (what apptainer push writes), found {len(found)} "
                            f"({', '.join(_shown(t) for t in types)}): not a SIF pushed with oras")
    i, layer = found[0]
    size, digest, notes = layer.get("size"), layer.get("digest"), layer.get("annotations", {})
    if type(size) is not int or size < 0:
        raise bad(f"layers[{i}].size", "a whole number of bytes >= 0", size)
    if not isinstance(digest, str) or not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
        raise bad(f"layers[{i}].digest", "sha256:<64 lowercase hex digits> (envport checks sha256)", digest)
    if not isinstance(notes, dict) or not all(isinstance(v, str) for v in notes.values()):
        raise bad(f"layers[{i}].annotations", "an object of strings", notes)
    return layer


def file_name(ref: Ref) -> str:
    """The pulled file's name, from the reference alone, as `apptainer pull` names it: REPO's last part, `_`,
    the tag, `.sif`. Never the registry's title annotation: a registry must not choose which file of the
    folder it writes (a title `Justfile` would replace DIR/Justfile). REPO_RE and TAG_RE admit no `/` and no
    leading `.`."""
    return f"{ref.repo.rsplit('/', 1)[-1]}_{ref.tag or 'latest'}.sif"


def _existing_folder(path: Path) -> Path:
    """PATH, or its nearest parent that exists (where its free space is read before it is made)."""
    path = path.absolute()
    while not path.is_dir() and path.parent != path:
        path = path.parent
    return path


def pull_sif(ref: Ref, out_dir: Path, *, ca: Optional[str] = None, insecure: bool = False, force: bool = False,
             idle: float = IDLE_S, check: Callable[[Path], None] = lambda path: None,
             progress: Callable[[int, int], None] = lambda done, total: None) -> dict:
    """Download REF's SIF into OUT_DIR/`file_name(REF)`; {path, digest, size}. A file or link already under
    that name is `output_exists` unless FORCE (checked before the registry is asked, and again, atomically,
    at the rename). CHECK(partial) runs on the complete, digest-checked file before the rename and raises to
    refuse it (the file is then removed): the caller reads it as a SIF there (the format is the sif layer's,
    above this one). IDLE: the stall timeout (`Client.fetch`)."""
    out_dir = Path(out_dir)
    final = out_dir / file_name(ref)
    if final.is_dir() and not final.is_symlink():
        raise RegistryError("output_exists", f"{final} is a folder: --force replaces a file or a link, never a "
                            "folder; pull into another folder (-o DIR)")
    reachable(ref.host)
    client = Client(ref.host, ca, insecure)
    layer = check_manifest(client.manifest(ref, idle), ref)
    digest, size = layer["digest"], layer["size"]
    if os.path.lexists(final):
        if _holds(final, digest, size):
            check(final)  # the same checks a download gets: a file already there is not trusted for being there
            return {"path": str(final), "digest": digest, "size": size, "present": True}
        if not force:
            raise RegistryError("output_exists", f"{final} exists and is not this layer (its size or sha256 "
                                f"differs from {digest}, or it is a link): envport pull never replaces a file "
                                "unasked; pass --force to replace it, or pull into another folder (-o DIR)")
    free = shutil.disk_usage(_existing_folder(out_dir)).free
    if size > free:
        raise RegistryError("disk_low", f"{ref}: the layer is {size} bytes ({size / 2**30:.1f} GiB), more than "
                            f"the {free} bytes ({free / 2**30:.1f} GiB) free in {out_dir}: nothing was "
                            "downloaded; free space there or pull into another folder (-o DIR)")
    out_dir.mkdir(parents=True, exist_ok=True)
    # 0o755 as apptainer pull leaves it: the launch script runs the file.
    try:
        with replacing(final, mode=0o755, replace=force) as partial:
            got, n = _download(client, ref, digest, partial, size, progress, idle)
            if n != size or got != digest.partition(":")[2]:
                raise RegistryError("digest_mismatch", f"{ref}: received {n} bytes with sha256:{got}; the "
                                    f"manifest says {size} bytes with {digest}: the transfer or the registry is "
                                    "corrupt; nothing was written")
            check(partial)
    except FileExistsError as exc:
        if exc.filename and Path(exc.filename).name != final.name and not exc.filename2:
            raise RegistryError("output_exists", f"{exc.filename} is in the way of the partial download (another "
                                "user's?): nothing was written; remove it or pull into another folder (-o DIR)"
                                ) from None
        raise RegistryError("output_exists", f"{final} appeared while it was being pulled; it was left as it "
                            "is and the download removed: pass --force to replace it") from None
    return {"path": str(final), "digest": digest, "size": size, "present": False}


def pinned(ref: Ref, *, ca: Optional[str] = None, insecure: bool = False) -> tuple[str, dict]:
    """(the digest of REF's manifest, its one SIF layer): what pins a tag's content for a reader that pulls by
    digest (shpc's container.yaml). The manifest is judged as a pull judges it (`check_manifest`)."""
    reachable(ref.host)
    client = Client(ref.host, ca, insecure)
    data = client.manifest_bytes(ref)
    try:
        manifest = json.loads(data)
    except (ValueError, RecursionError):
        raise RegistryError("not_a_sif_artifact", f"{ref}: the registry's manifest is not JSON: not a SIF pushed "
                            "with oras") from None
    return f"sha256:{hashlib.sha256(data).hexdigest()}", check_manifest(manifest, ref)


def _holds(path: Path, digest: str, size: int) -> bool:
    """Whether PATH is a regular file (never a link: lstat, O_NOFOLLOW) of SIZE bytes whose sha256 is DIGEST's:
    the layer is already there, checked byte for byte, not assumed from its name (issue 37 U21)."""
    import stat

    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_size != size:
            return False
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return False
    sha = hashlib.sha256()
    with os.fdopen(fd, "rb") as fh:
        while block := fh.read(CHUNK):
            sha.update(block)
    return f"sha256:{sha.hexdigest()}" == digest


def _download(client: Client, ref: Ref, digest: str, partial: Path, size: int,
              progress: Callable[[int, int], None], idle: float) -> tuple[str, int]:
    """Stream the blob into PARTIAL; (sha256 hex, bytes). engines/blob_writer hashes and writes on two threads
    while this one reads TLS; its errors (a full disk) are raised as they are, not as registry errors."""
    from envport.engines.blob_writer import BlobWriter, open_new

    url = f"{client.registry.prefix}://{client.container(ref).get_blob_url(digest)}"
    fd = open_new(partial)
    try:
        with BlobWriter(fd) as sink:
            for chunk in _blob_chunks(client, ref, url, idle):
                sink.write(chunk)
                progress(sink.bytes, size)
                if sink.bytes > size:
                    break  # more than announced: stop reading, the size check refuses it
            return sink.close(), sink.bytes
    finally:
        os.close(fd)


def _blob_chunks(client: Client, ref: Ref, url: str, idle: float) -> Iterator[bytes]:
    """The layer's bytes as they arrive; registry and network failures as RegistryError (a generator: what
    fails on the writing side is not the registry's)."""
    with client.errors(ref, "downloading"):
        yield from client.fetch(ref, url, "*/*", "layer", idle)

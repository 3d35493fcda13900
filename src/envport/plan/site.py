"""Site profiles: what varies by place, never by env, and never enters the spec.

`sites/<name>.yaml`, chosen with `--site` (default `local`).  The fields that
reach a recipe (CA bundle bytes, pip sources, wheelhouse use, base-image
rewrites) are applied to the plan by `apply_site`, so they feed the content
hash through it; the others (network mode, SSH hosts, Apptainer dirs) only
steer how a build or launch runs and do not change what is built.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import ssl
from pathlib import Path
from typing import Annotated, Literal, NamedTuple, Optional

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from envport.core import secrets
from envport.core.errors import EnvportError, Problem, SpecError
from envport.spec.model import IMAGE_RE, FindLinkList, Line, Url, UrlList
from envport.spec.yamlfile import RawSpec, read_bytes, read_mapping, validate
from envport.plan.steps import BaseStep, CaStep, PipStep, Plan, pip_source_args

SITES_DIR = "sites"
DEFAULT_SITE = "local"
# Where container builds see the site's CA bundle and the env's wheelhouse.
CA_PATH_IN_ENV = "/etc/envport/ca-bundle.crt"
WHEELHOUSE_IN_BUILD = "/tmp/envport-wheelhouse"
# A CA bundle is a few hundred KiB (Debian's: 215 KiB, 144 certificates); a bound, not a style rule.
MAX_CA_BYTES = 16 * 1024 * 1024
PEM_CERT_RE = re.compile(rb"-----BEGIN CERTIFICATE-----\r?\n[A-Za-z0-9+/=\r\n]{1,65536}?-----END CERTIFICATE-----")


def _image_ref(value: str) -> str:
    if not IMAGE_RE.match(value):
        raise ValueError(f"{value!r} is not an image reference like 'mirror.example/debian:bookworm-slim'")
    return value


def _ssh_destination(value: str) -> str:
    if value.startswith("-"):
        raise ValueError(f"{value!r} starts with '-', which ssh would read as an option; "
                         "write a Host alias or user@host")
    return value


# Every string of a site profile reaches a recipe, a shell or a log: one line each (no newline can
# add a RUN line to a Dockerfile or a .def's %post), in the spec's own rules (spec/model.py).
ImageRef = Annotated[str, AfterValidator(_image_ref)]
# docker's --network: a mode or a network's name, never a word a shell or a recipe could split.
NetworkMode = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")]
SshDestination = Annotated[Line, AfterValidator(_ssh_destination)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PipSources(_Model):
    index_url: Optional[Url] = None
    # One string is a one-element list, as in a spec's pip phase (and pip's own `-f URL`).
    extra_index_urls: UrlList = []
    find_links: FindLinkList = []


class SshHost(_Model):
    ssh: SshDestination = Field(description="ssh destination (a Host alias or user@host)")
    ssh_config: Optional[Line] = None
    connect_timeout: int = Field(default=5, ge=1, le=60)


DEFAULT_SIF_DIR = ".cache/sif"
SIF_DIR_ENV = "ENVPORT_SIF_DIR"


class ApptainerDirs(_Model):
    cachedir: Optional[Line] = Field(default=None, description="APPTAINER_CACHEDIR for `apptainer build`")
    tmpdir: Optional[Line] = Field(default=None, description="APPTAINER_TMPDIR for `apptainer build`")
    sif_dir: Line = Field(default=DEFAULT_SIF_DIR, description="where <name>-<hash12>.sif files live "
                         "(relative to the project root, or absolute); $ENVPORT_SIF_DIR overrides it (a root "
                         "build in a checkout another user owns: root mounts no SIF from that user's folder)")
    compression: Literal["gzip", "zstd", "xz", "lz4", "lzo", "lzma"] = Field(
        default="gzip", description="mksquashfs -comp for envport's .def builder (apptainer's default: gzip)")
    local_bootstrap: Literal["docker-daemon", "localimage"] = Field(
        default="docker-daemon", description="`Bootstrap:` for a base no registry serves (envport/* "
        "images, or every base when `registry: false`): the local docker engine's image, or a "
        "SIF/sandbox dir named in local_images")
    local_images: dict[ImageRef, Line] = Field(default={}, description="base image -> SIF file or sandbox "
                                         "directory, for `local_bootstrap: localimage`")
    build_dir: Optional[Line] = Field(default=None, description="where envport's .def builder unpacks the "
                                     "rootfs (default: /dev/shm when it has room, else <sif_dir>/.build)")

    def sif_path(self, root: Path) -> Path:
        path = Path(self.sif_dir).expanduser()
        return path if path.is_absolute() else root / path


class Trust(_Model):
    keys: list[Line] = Field(default=[], description="PEM public keys (PUBLIC KEY or RSA PUBLIC KEY) whose "
                             "signatures this place trusts, relative to the site file's folder or absolute; "
                             "each must exist when the profile is read; `envport inspect` and `envport pull` "
                             "refuse a SIF they do not verify")
    require_signed: bool = Field(default=False, description="refuse [unsigned] or [untrusted_signer] (or "
                                 "[bad_signature]) before a SIF is mounted or run by verify, witness, slurm "
                                 "submit and up, and before `envport pull` names the file; needs keys")

    require_witnessed: list[Line] = Field(default=[], description="witness checks (imports, collectives, ...: "
                                          "`envport witness --only`'s names) that a SIF must carry a witness "
                                          "statement for, signed by a key in trust.keys, about its primary "
                                          "partition, in which each passed; else REFUSED [unwitnessed] before "
                                          "it is mounted or run (docs/provenance.md); needs keys")

    @model_validator(mode="after")
    def _keys_for_required(self):
        from envport.core.witness_checks import CHECKS

        for what, asked in (("require_signed: true", self.require_signed),
                            ("require_witnessed", bool(self.require_witnessed))):
            if asked and not self.keys:
                raise ValueError(f"{what} needs the keys to trust: list PEM public key files under trust.keys")
        unknown = [c for c in self.require_witnessed if c not in CHECKS]
        if unknown:
            raise ValueError(f"require_witnessed: {', '.join(unknown)} is no witness check; choose from "
                             f"{', '.join(CHECKS)}")
        return self


class TrustPolicy(NamedTuple):
    """The trust every site loaded in this process asked for (`active_trust`)."""
    require_signed: bool
    keys: tuple[str, ...]  # absolute paths of PEM public keys
    require_witnessed: tuple[str, ...] = ()  # checks a trusted witness statement must show passed


# Once a site asks for signed SIFs this process keeps asking (a later site cannot loosen it): one policy for
# every SIF mount and run (sif/run.py `admit`), however many profiles a command reads.
_active: dict = {"require_signed": False, "keys": (), "require_witnessed": ()}


def active_trust() -> TrustPolicy:
    return TrustPolicy(_active["require_signed"], tuple(_active["keys"]), tuple(_active["require_witnessed"]))


class Site(_Model):
    name: Line
    description: Line = ""
    network: NetworkMode = Field(default="default", description="docker build/run network mode, e.g. host")
    ca_bundle: Optional[Line] = Field(default=None, description="host CA bundle (PEM certificates) injected into "
                                      "container builds; only its certificates travel")
    pip: PipSources = PipSources()
    wheelhouse: bool = Field(default=False, description="install from `envport wheelhouse NAME` with --no-index")
    wheelhouse_dir: Line = Field(default=".cache/wheelhouse", description="relative to the project root")
    base_images: dict[ImageRef, ImageRef] = Field(default={}, description="base image rewrites (mirrors)")
    registry: bool = Field(default=True, description="the engine can pull base images it lacks; false: "
                           "a missing base is REFUSED with the fix instead of a pull that cannot succeed")
    registry_ca: Optional[str] = Field(default=None, description="CA bundle (PEM) trusted for TLS to the OCI "
                                       "registries of `envport push`/`pull`, instead of the system's")
    hosts: dict[Line, SshHost] = {}
    trust: Trust = Trust()
    apptainer: ApptainerDirs = ApptainerDirs()
    ledger_dir: Optional[Line] = Field(default=None, description="where this place keeps envport's ledgers "
                                      "(default: $XDG_STATE_HOME/envport); $ENVPORT_STATE_DIR overrides it")
    installer: Literal["pip", "uv"] = Field(
        default="pip", description="what installs each pip phase where the env is built: pip, or uv "
        "(`uv pip install`, from the PyPI wheel, kept outside the env); with a lock both give the same env")
    bytecode: Optional[Literal["build", "first-import"]] = Field(
        default=None, description="when the env's .py files are compiled to bytecode: `build` (each "
        "phase's, before the next phase) or `first-import`; unset: the installer's own default (pip: build, uv: first-import). "
        "An image cannot keep what a run compiles, so with first-import every process compiles again what "
        "it imports")
    lock: bool = Field(default=True, description="install each phase from specs/<name>.lock when the spec "
                       "has one that fits it; `envport build --no-lock` turns this off for one build")

    # The file this profile was read from, for errors found after loading (None: built-in defaults).
    _source: Optional[str] = PrivateAttr(default=None)

    def ca_bytes(self) -> bytes:
        """The CA bundle's certificates (PEM), as they go into an image; REFUSED when it holds none."""
        if not self.ca_bundle:
            return b""
        return ca_certificates(self.ca_bundle, self._source or f"site {self.name}")

    def trust_keys(self) -> list[str]:
        """trust.keys as absolute paths: relative ones from the site file's folder (the project root's
        sites/ for a named profile), so a key beside the profile is found from any working directory."""
        base = Path(self._source).parent if self._source else Path.cwd()
        return [str(k if k.is_absolute() else (base / k).resolve()) for k in map(Path, self.trust.keys)]

    def bytecode_mode(self) -> str:
        """`build` or `first-import`: the profile's choice, else its installer's own default."""
        return self.bytecode or ("first-import" if self.installer == "uv" else "build")

    def pip_source_args(self) -> list[str]:
        """pip arguments for this site's index, extra indexes and find-links."""
        return pip_source_args(self.pip.index_url, self.pip.extra_index_urls, self.pip.find_links)

    def wheelhouse_path(self, root: Path, env_name: str) -> Path:
        return (root / self.wheelhouse_dir / env_name).resolve()


def load_site(name_or_path: str | None, root: Path) -> Site:
    """A site by name (sites/<name>.yaml) or path; `local` falls back to built-in defaults."""
    ref = name_or_path or DEFAULT_SITE
    path = Path(ref) if ref.endswith((".yaml", ".yml")) else root / SITES_DIR / f"{ref}.yaml"
    # lexists, not is_file: a directory, FIFO or unreadable file is reported by the reader, not as missing.
    if not os.path.lexists(path):
        if ref == DEFAULT_SITE:
            return _sif_dir_from_env(Site(name=DEFAULT_SITE))
        raise EnvportError(f"site profile {path} not found; create it or pass --site local")
    raw = read_mapping(path, "site profile", "sites/local.yaml")
    site = validate(raw, raw.data, Site, str(path))
    site = _sif_dir_from_env(site)
    site._source = str(path)
    _check_trust_keys(site, raw)
    # A token in a pip URL (https://user:TOKEN@host/simple) is a configured secret: never printed.
    secrets.register(secrets.url_password(u) for u in (site.pip.index_url, *site.pip.extra_index_urls,
                                                       *site.pip.find_links))
    if site.trust.require_signed:
        _active["require_signed"] = True
    _active["keys"] = tuple(dict.fromkeys((*_active["keys"], *site.trust_keys())))
    _active["require_witnessed"] = tuple(dict.fromkeys((*_active["require_witnessed"], *site.trust.require_witnessed)))
    return site


def _sif_dir_from_env(site: Site) -> Site:
    """$ENVPORT_SIF_DIR over the profile's apptainer.sif_dir, as the profile is read (so a copy of the site
    that names its own folder, as rebuild-check's does, keeps it)."""
    if not os.environ.get(SIF_DIR_ENV):
        return site
    return site.model_copy(update={"apptainer": site.apptainer.model_copy(update={"sif_dir": os.environ[SIF_DIR_ENV]})})


def _check_trust_keys(site: Site, raw: RawSpec) -> None:
    """Each trust.keys file exists and is a regular file of at most MAX_KEY_BYTES, judged by stat (never
    blocks): a FIFO there would hang every SIF check, `/dev/zero` would be read without end, and a missing one
    was found only after a pull had downloaded the whole layer (issue 37 U11). Exit 2, naming the site file,
    its line, the field and the path, before anything is asked of a registry or a SIF."""
    problems = [p for i, (given, path) in enumerate(zip(site.trust.keys, site.trust_keys()))
                for p in [_trust_key_problem(site, raw, i, given, path)] if p]
    if problems:
        raise SpecError(problems)


def _trust_key_problem(site: Site, raw: RawSpec, i: int, given: str, path: str) -> Optional[Problem]:
    """Why trust.keys[I] (GIVEN, PATH once resolved) is no key file, as a Problem; None when it may be one
    (whether it holds a key is sif/keys.py's to say, when the key is loaded)."""
    from envport.core.smallfile import MAX_KEY_BYTES, MIB, problem

    listed = "" if path == given else f" (listed as {given}, relative to {Path(str(site._source)).absolute().parent})"
    try:
        why = problem(os.stat(path), MAX_KEY_BYTES)
    except OSError as exc:
        what = "does not exist" if isinstance(exc, FileNotFoundError) else f"cannot be read ({exc.strerror})"
        return Problem(str(site._source), raw.lines.get(("trust", "keys")), f"trust.keys[{i}]",
                       f"{path} {what}{listed}; a site's trust keys must all be there before any SIF is judged",
                       "put the signer's PEM public key at that path (from a private key: `openssl pkey -in "
                       "KEY.pem -pubout -out PUB.pem`), or correct or remove the entry")
    if not why:
        return None
    return Problem(str(site._source), raw.lines.get(("trust", "keys")), f"trust.keys[{i}]",
                   f"{path}: {why}, not a key file{listed}; expected a PEM public key file, a "
                   f"regular file of at most {MAX_KEY_BYTES // MIB} MiB",
                   "list the public key file itself (e.g. keys/site.pub.pem)")


def ca_certificates(path: str, source: str) -> bytes:
    """The PEM certificate blocks of the bundle at PATH, checked by OpenSSL (the ssl module).

    Only the blocks travel: a file that is not a bundle (`/etc/shadow`) is refused without a
    word of its content, and a private key or comment beside the certificates stays on the host."""
    def refused(message: str, fix: str) -> EnvportError:
        return EnvportError(str(Problem(source, None, "ca_bundle", f"{path}: {message}", fix)), exit_code=3)

    fix = "point ca_bundle at a PEM bundle of CA certificates, e.g. /etc/ssl/certs/ca-certificates.crt"
    try:
        size = os.stat(path).st_size
    except OSError:
        size = 0  # read_bytes says why
    if size > MAX_CA_BYTES:
        raise refused(f"is {size} bytes, larger than a CA bundle ({MAX_CA_BYTES // 2**20} MiB)", fix)
    try:
        data = read_bytes(Path(path), path, limit=MAX_CA_BYTES)
    except SpecError as exc:
        raise refused(exc.problems[0].message, exc.problems[0].fix) from None
    blocks = PEM_CERT_RE.findall(data)
    if not blocks:
        raise refused("holds no PEM certificate (no -----BEGIN CERTIFICATE----- block)", fix)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    for i, block in enumerate(blocks, 1):
        try:
            ctx.load_verify_locations(cadata=block.decode("ascii"))
        except (ssl.SSLError, ValueError):
            raise refused(f"certificate {i} of {len(blocks)} is not a valid X.509 certificate", fix) from None
    return b"".join(block + b"\n" for block in blocks)


def apply_site(plan: Plan, site: Site) -> Plan:
    """The plan as this site builds it: base rewrites, CA bundle, pip sources, wheelhouse."""
    steps = []
    ca = site.ca_bytes()
    for step in plan.steps:
        if isinstance(step, BaseStep):
            image = site.base_images.get(step.image, step.image)
            bootstrap, source = bootstrap_for(site, image)
            steps.append(dataclasses.replace(step, image=image, bootstrap=bootstrap, bootstrap_from=source))
            if ca:
                steps.append(CaStep(CA_PATH_IN_ENV, hashlib.sha256(ca).hexdigest(), ca))
        elif isinstance(step, PipStep):
            steps.append(dataclasses.replace(step, site_args=tuple(_site_pip_args(site)), installer=site.installer,
                                             bytecode=site.bytecode_mode()))
        else:
            steps.append(step)
    return dataclasses.replace(plan, steps=tuple(steps))


def is_local_base(image: str) -> bool:
    """envport/* bases are made on the host (`envport base`): no registry serves them."""
    return image.startswith("envport/")


def bootstrap_for(site: Site, image: str) -> tuple[str, str]:
    """(`Bootstrap:`, `From:`) of the .def for this base at this site.

    `Bootstrap: docker` makes apptainer pull the name from a registry, so a base
    only the local engine holds needs `docker-daemon` (or `localimage` from a
    SIF/sandbox the site names)."""
    if not (is_local_base(image) or not site.registry):
        return "docker", image
    if site.apptainer.local_bootstrap == "localimage" and image in site.apptainer.local_images:
        return "localimage", site.apptainer.local_images[image]
    return "docker-daemon", image


def apply_installer(plan: Plan, site: Site) -> Plan:
    """A host build's plan keeps the host's own pip sources; only the site's installer and its bytecode
    mode reach it."""
    if site.installer == "pip" and site.bytecode_mode() == "build":
        return plan
    return dataclasses.replace(plan, steps=tuple(
        dataclasses.replace(s, installer=site.installer, bytecode=site.bytecode_mode()) if isinstance(s, PipStep)
        else s for s in plan.steps))


def _site_pip_args(site: Site) -> list[str]:
    if site.wheelhouse:
        return ["--no-index", "--find-links", WHEELHOUSE_IN_BUILD]
    return site.pip_source_args()


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
from pathlib import Path
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

from envport.core.errors import EnvportError
from envport.spec.yamlfile import load_model
from envport.plan.steps import BaseStep, CaStep, PipStep, Plan, pip_source_args

SITES_DIR = "sites"
DEFAULT_SITE = "local"
# Where container builds see the site's CA bundle and the env's wheelhouse.
CA_PATH_IN_ENV = "/etc/envport/ca-bundle.crt"
WHEELHOUSE_IN_BUILD = "/tmp/envport-wheelhouse"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PipSources(_Model):
    index_url: Optional[str] = None
    extra_index_urls: list[str] = []
    find_links: list[str] = []


class SshHost(_Model):
    ssh: str = Field(description="ssh destination (a Host alias or user@host)")
    ssh_config: Optional[str] = None
    connect_timeout: int = Field(default=5, ge=1, le=60)


DEFAULT_SIF_DIR = ".cache/sif"


class ApptainerDirs(_Model):
    cachedir: Optional[str] = Field(default=None, description="APPTAINER_CACHEDIR for `apptainer build`")
    tmpdir: Optional[str] = Field(default=None, description="APPTAINER_TMPDIR for `apptainer build`")
    sif_dir: str = Field(default=DEFAULT_SIF_DIR, description="where <name>-<hash12>.sif files live "
                         "(relative to the project root, or absolute)")
    compression: Literal["gzip", "zstd", "xz", "lz4", "lzo", "lzma"] = Field(
        default="gzip", description="mksquashfs -comp for envport's .def builder (apptainer's default: gzip)")
    local_bootstrap: Literal["docker-daemon", "localimage"] = Field(
        default="docker-daemon", description="`Bootstrap:` for a base no registry serves (envport/* "
        "images, or every base when `registry: false`): the local docker engine's image, or a "
        "SIF/sandbox dir named in local_images")
    local_images: dict[str, str] = Field(default={}, description="base image -> SIF file or sandbox "
                                         "directory, for `local_bootstrap: localimage`")
    build_dir: Optional[str] = Field(default=None, description="where envport's .def builder unpacks the "
                                     "rootfs (default: /dev/shm when it has room, else <sif_dir>/.build)")

    def sif_path(self, root: Path) -> Path:
        path = Path(self.sif_dir).expanduser()
        return path if path.is_absolute() else root / path


class Site(_Model):
    name: str
    description: str = ""
    network: str = Field(default="default", description="docker build/run network mode, e.g. host")
    ca_bundle: Optional[str] = Field(default=None, description="host CA bundle injected into container builds")
    pip: PipSources = PipSources()
    wheelhouse: bool = Field(default=False, description="install from `envport wheelhouse NAME` with --no-index")
    wheelhouse_dir: str = Field(default=".cache/wheelhouse", description="relative to the project root")
    base_images: dict[str, str] = Field(default={}, description="base image rewrites (mirrors)")
    registry: bool = Field(default=True, description="the engine can pull base images it lacks; false: "
                           "a missing base is REFUSED with the fix instead of a pull that cannot succeed")
    registry_ca: Optional[str] = Field(default=None, description="CA bundle (PEM) trusted for TLS to the OCI "
                                       "registries of `envport push`/`pull`, instead of the system's")
    hosts: dict[str, SshHost] = {}
    apptainer: ApptainerDirs = ApptainerDirs()
    ledger_dir: Optional[str] = Field(default=None, description="where this place keeps envport's ledgers "
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

    def ca_bytes(self) -> bytes:
        if not self.ca_bundle:
            return b""
        try:
            return Path(self.ca_bundle).read_bytes()
        except OSError as exc:
            raise EnvportError(f"site {self.name}: ca_bundle {self.ca_bundle}: {exc.strerror}; "
                               "fix the path in the site profile", exit_code=3) from None

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
            return Site(name=DEFAULT_SITE)
        raise EnvportError(f"site profile {path} not found; create it or pass --site local")
    return load_model(path, Site, "site profile", "sites/local.yaml")


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


"""The base rootfs of a `.def`, as its `Bootstrap:` header asks, without apptainer.

- `docker` / `docker-daemon`: the image from the local docker engine
  (`docker create` + `docker export | tar -x`, engines/docker.py); `docker`
  names a registry image, pulled through the engine only when the site
  profile says the engine can reach a registry;
- `localimage`: a SIF (its primary squashfs partition, unpacked with
  `unsquashfs -o OFFSET`) or a sandbox directory (copied with `cp -a`).

Anything that cannot be had is a `BootstrapRefused` naming the base and the
fix (a site-profile field or a command), never a half-made rootfs.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from envport.builders.apptainer.deffile import DefFile
from envport.core.proc import run
from envport.engines import docker as engine
from envport.sif.format import SifError, primary_partition, read_sif

BOOTSTRAPS = ("docker", "docker-daemon", "localimage")


class BootstrapRefused(Exception):
    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class Base:
    """What the base image brings besides its files: apptainer writes these into /.singularity.d."""

    source: str  # "docker-daemon envport/debian-bookworm:base (sha256:...)"
    env: list[str] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)


def base_fix(image: str, site) -> str:
    """How to make IMAGE available to the builder at this site."""
    from envport.builders.base_image import RECIPES

    local = {tag: name for name, tag in RECIPES.items()}
    if image in local:
        return f"build it here: `envport base {local[image]}`"
    name = getattr(site, "name", "local")
    return (f"`docker pull {image}` on a host with registry access and `docker save | docker load` it here, "
            f"or name a local SIF/sandbox for it in sites/{name}.yaml (apptainer: {{local_bootstrap: "
            f"localimage, local_images: {{{image!r}: /path/base.sif}}}}), or map it to a local image with "
            f"base_images")


def _header(deffile: DefFile) -> tuple[str, str]:
    kind, source = deffile.bootstrap, deffile.base
    if kind not in BOOTSTRAPS:
        raise BootstrapRefused("unsupported_bootstrap", f"{deffile.source}: `Bootstrap: {kind}` is not supported "
                                                        f"by envport's builder ({', '.join(BOOTSTRAPS)}); "
                                                        "build it with apptainer")
    if not source:
        raise BootstrapRefused("bad_def", f"{deffile.source}: `Bootstrap: {kind}` without a `From:` line")
    return kind, source.removeprefix("docker://").removeprefix("docker-daemon:")


def check(deffile: DefFile, site) -> None:
    """Raise BootstrapRefused when the base cannot be had, before anything slow starts (a wheelhouse
    download for a base that is not here would be wasted)."""
    kind, source = _header(deffile)
    if kind == "localimage":
        if not Path(source).exists():
            raise BootstrapRefused("base_image_missing", f"`Bootstrap: localimage` {source}: no such SIF or "
                                                         f"sandbox; fix local_images in sites/{site.name}.yaml")
        return
    problem = engine.engine_problem()
    if problem is None and engine.image_config(source) is not None:
        return
    if problem is None and kind == "docker" and site.registry:
        return  # pulled through the engine by bootstrap()
    where = f"no docker engine answers ({problem})" if problem else "the local docker engine does not have it"
    raise BootstrapRefused("base_image_missing", f"base image {source} (`Bootstrap: {kind}`): {where}; "
                                                 f"{base_fix(source, site)}")


def bootstrap(deffile: DefFile, dest: Path, site, *, progress=lambda _l: None) -> Base:
    """Unpack the .def's base into DEST (an empty directory)."""
    kind, source = _header(deffile)
    if kind == "localimage":
        return _localimage(Path(source), dest, site)
    return _docker(kind, source, dest, site, progress)


def _docker(kind: str, image: str, dest: Path, site, progress) -> Base:
    problem = engine.engine_problem()
    config = None if problem else engine.image_config(image)
    if config is None and not problem and kind == "docker" and getattr(site, "registry", False):
        progress(f"envport: [apptainer] pulling {image} through the docker engine")
        run(["docker", "pull", image], env=engine.cli_env(), timeout=3600)  # image_config below says if it came
        config = engine.image_config(image)
    if config is None:
        where = (f"no docker engine answers ({problem})" if problem
                 else "the local docker engine does not have it")
        raise BootstrapRefused("base_image_missing", f"base image {image} (`Bootstrap: {kind}`): {where}; "
                                                     f"{base_fix(image, site)}")
    progress(f"envport: [apptainer] unpacking {image} ({config['id'][:19]})")
    try:
        engine.export_rootfs(image, dest)
    except engine.ExportError as exc:
        raise BootstrapRefused("base_image_unreadable", str(exc)) from None
    return Base(source=f"{kind} {image} ({config['id']})", env=config["env"], labels=config["labels"],
                entrypoint=config["entrypoint"], cmd=config["cmd"])


def _localimage(source: Path, dest: Path, site) -> Base:
    if source.is_dir():
        # No timeout on the copies: the base's size bounds them, not envport.
        proc = run(["cp", "-a", "--", f"{source}/.", str(dest)], timeout=None)
        if not proc.ok:
            raise BootstrapRefused("base_image_unreadable", f"copying sandbox {source} failed: "
                                                            f"{(proc.stderr or proc.why).strip()[-300:]}")
        return Base(source=f"localimage {source}")
    try:
        part = primary_partition(read_sif(source))
    except SifError as exc:
        reason = "base_image_missing" if exc.reason == "not_found" else "base_image_unreadable"
        raise BootstrapRefused(reason, f"`Bootstrap: localimage` {exc.message}; fix local_images in "
                                       f"sites/{getattr(site, 'name', 'local')}.yaml") from None
    if shutil.which("unsquashfs") is None:
        raise BootstrapRefused("missing_tool", "unsquashfs is not installed (it unpacks a localimage SIF): "
                                               "apt-get install squashfs-tools")
    dest.rmdir()  # unsquashfs makes the directory itself
    proc = run(["unsquashfs", "-no-progress", "-quiet", "-o", str(part.offset), "-d", str(dest), str(source)],
               timeout=None)
    if not proc.ok:
        raise BootstrapRefused("base_image_unreadable", f"unsquashfs of {source} failed: "
                                                        f"{(proc.stderr or proc.stdout or proc.why).strip()[-300:]}")
    return Base(source=f"localimage {source}")


def base_identity(deffile: DefFile) -> str | None:
    """What names the base's bytes before it is unpacked (the phase cache's first key part): the docker
    engine's image id, or a localimage SIF's size and mtime; None when nothing cheap names it (a sandbox
    directory, an image the engine lacks): that build is not cached."""
    kind, source = _header(deffile)
    if kind == "localimage":
        path = Path(source)
        if not path.is_file():
            return None
        st = path.stat()
        return f"localimage {path.resolve()} {st.st_size} {st.st_mtime_ns}"
    if engine.engine_problem() is not None:
        return None
    config = engine.image_config(source)
    return f"{kind} {source} {config['id']}" if config else None

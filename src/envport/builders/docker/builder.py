"""The docker builder: image `envport/<name>:<hash12>` (and `:latest`) from the site's plan.

Order of checks, each cheap before anything expensive:

1. the engine answers (else REFUSED `docker_unreachable`, exit 3);
2. `envport/<name>:<hash12>` exists with that `envport.hash` label: `present`,
   no build at all (one `images.get`, ~0.02 s), unless `rebuild`;
3. the base image is local, or the site can pull it (else REFUSED
   `base_image_missing` with the fix);
4. the wheelhouse (site `wheelhouse: true`) via `ensure_wheelhouse`;
5. the build: BuildKit through a docker CLI that runs it (Debian's
   /usr/bin/docker 20.10 with DOCKER_BUILDKIT=1; probed once), else the
   docker SDK's legacy builder.  A site that installs from the wheelhouse
   needs BuildKit (`RUN --mount`): without it the build is REFUSED
   `no_buildkit` with the fix, rather than copying the wheels into the image;
6. the SBOM: the built image's filesystem exported and read (sif/sbom.py), the CycloneDX file added in
   one layer at SBOM_PATH with the label SBOM_LABEL naming its sha256 (docs/registry.md).

The build gets no tag at all (`--iidfile`); only a successful build is tagged,
so a killed build leaves no tag and a re-run continues from the engine's
layer cache.  Nothing from the host environment reaches the build: the docker
CLI runs with a minimal environment and no `--build-arg`, so a token such as
HF_TOKEN never lands in a layer, the history or a label.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from pathlib import Path
from typing import Optional

from envport import __version__
from envport.recipe.identity import resolve
from envport.spec.loader import Loaded
from envport.plan.steps import BaseStep, Plan
from envport.recipe.render import render_plan
from envport.plan.site import Site
from envport.core.progress import Progress
from envport.core.progress import human_size as _size
from envport.core.verdict import StepResult, Verdict
from envport.builders.docker import context as docker_context
from envport.engines.docker import NO_BUILDKIT_FIX, buildkit_cli, connect, get_image, run_buildkit
from envport.builders.docker.log import BuildkitLog, LegacyLog, StepRef, instruction_steps
from envport.builders.pins import check_image as pin_check

TARGET = "docker"
# Where every image envport builds carries its CycloneDX SBOM, and the label naming that file's sha256.
SBOM_PATH = "/opt/envport/sbom.cdx.json"
SBOM_LABEL = "envport.sbom.sha256"


def repo(name: str) -> str:
    return f"envport/{name}"


def image_tag(name: str, hash_: str) -> str:
    return f"{repo(name)}:{hash_[:12]}"
















def _fix_for_base(image: str) -> str:
    from envport.builders.base_image import RECIPES

    local = {tag: name for name, tag in RECIPES.items()}
    if image in local:
        return f"build it here: `envport base {local[image]}`"
    if image.startswith("envport/"):
        made = ", ".join(f"`envport base {name}` makes {tag}" for name, tag in sorted(RECIPES.items()))
        return f"envport/* images are built locally ({made}); build or `docker load` {image} here"
    return (f"`docker pull {image}` on a host with registry access and `docker save | docker load` it here, "
            "or map it to a local image in the site profile's base_images")


def image_labels_for(loaded: Loaded, hash_: str) -> dict[str, str]:
    """The labels every envport image carries (docker's and podman's builds): its hash, name, version, spec."""
    return {
        "envport.hash": hash_,
        "envport.name": loaded.spec.name,
        "envport.version": __version__,
        "envport.spec": json.dumps(loaded.spec.model_dump(mode="json"), sort_keys=True, separators=(",", ":")),
    }






def _build_buildkit(cli: str, context: Path, iidfile: Path, plan_ops: list, site: Site, labels: dict,
                    no_cache: bool, progress: Progress) -> tuple[bool, Optional[str], BuildkitLog]:
    argv = [cli, "build", "--progress=plain", "--iidfile", str(iidfile), "--network", site.network]
    for k, v in labels.items():
        argv += ["--label", f"{k}={v}"]
    if no_cache:
        argv.append("--no-cache")
    argv.append(".")
    log = BuildkitLog(plan_ops, progress)
    rc = run_buildkit(argv, context, log.feed)
    image_id = iidfile.read_text().strip() if rc == 0 and iidfile.is_file() else None
    return rc == 0 and bool(image_id), image_id, log


def _build_legacy(client, context: Path, plan_all: list, site: Site, labels: dict, no_cache: bool,
                  progress: Progress) -> tuple[bool, Optional[str], LegacyLog]:
    log = LegacyLog(plan_all, progress)
    image_id = None
    for chunk in client.api.build(path=str(context), dockerfile="Dockerfile", labels=labels,
                                  network_mode=site.network, nocache=no_cache, rm=True, forcerm=True,
                                  pull=False, decode=True):
        log.feed_chunk(chunk)
        aux = chunk.get("aux")
        if isinstance(aux, dict) and aux.get("ID"):
            image_id = aux["ID"]
    return log.failed is None and bool(image_id), image_id, log



def build(loaded: Loaded, site: Site, root: Path, *, rebuild: bool = False, no_cache: bool = False,
          progress: Progress) -> list[StepResult]:
    """Build (or find) the env's image; each step's StepResult, stopping at the first not ok."""
    start = time.monotonic()
    resolved = resolve(loaded, site, TARGET)
    if not rebuild:
        present = _present_by_socket(resolved)
        if present is not None:
            return [present]
    client, refusal = connect("docker engine")
    if client is None:
        return [refusal]
    previous = get_image(client, resolved.identity.image_tag)
    present = _present(previous, resolved, rebuild, progress)
    if present is not None:
        return [present]
    results = [_base(client, resolved.plan, site)]
    if not results[-1].verdict.ok:
        return results
    cli = buildkit_cli()
    wheelhouse = _wheelhouse(loaded, site, root, resolved, cli, progress)
    if wheelhouse is not None:
        results.append(wheelhouse)
        if not wheelhouse.verdict.ok:
            return results
    results.append(_build_image(client, cli, loaded, site, root, resolved, previous, no_cache, progress, start))
    return results


def _present(image, resolved, rebuild: bool, progress: Progress) -> Optional[StepResult]:
    """PRESENT when the image with this identity exists and its label carries the hash (checked, not assumed)."""
    tag, hash_ = resolved.identity.image_tag, resolved.hash
    if image is None or rebuild:
        return None
    if image.labels.get("envport.hash") != hash_:
        progress(f"envport: [docker] {tag} exists but its envport.hash label is not {hash_[:12]}...; rebuilding")
        return None
    name = resolved.identity.name
    if f"{repo(name)}:latest" not in image.tags:
        image.tag(repo(name), "latest")
    return present_result(tag, image.id, image.attrs.get("Size", 0))


def _present_by_socket(resolved) -> Optional[StepResult]:
    """PRESENT from one request on the engine's socket, before the SDK client's own ping and version
    requests; None whenever anything is left to do or say (absent, relabelled, no :latest yet)."""
    from envport.engines.docker_socket import image_labels

    tag = resolved.identity.image_tag
    info = image_labels(tag)
    if (info is None or info["labels"].get("envport.hash") != resolved.hash
            or f"{repo(resolved.identity.name)}:latest" not in info["tags"]):
        return None
    return present_result(tag, info["id"], info["size"])


def present_result(tag: str, image_id: str, size: int) -> StepResult:
    """The `present` verdict of an image TAG already built (docker's and podman's builds word it alike)."""
    return StepResult(f"image {tag}", Verdict.PRESENT, f"{image_id[:19]} ({_size(size)})",
                      data={"image": tag, "image_id": image_id, "size": size})


def _base(client, plan: Plan, site: Site) -> StepResult:
    base = next(s.image for s in plan.steps if isinstance(s, BaseStep))
    if get_image(client, base) is not None:
        return StepResult(f"base {base}", Verdict.PRESENT, "local")
    if not site.registry or base.startswith("envport/"):
        return StepResult(f"base {base}", Verdict.REFUSED, f"base image {base} is not in the engine and site "
                          f"{site.name!r} cannot pull it; {_fix_for_base(base)}", reason="base_image_missing")
    return StepResult(f"base {base}", Verdict.SKIPPED, "not local; the build pulls it")


def _wheelhouse(loaded: Loaded, site: Site, root: Path, resolved, cli: Optional[str],
                progress: Progress) -> Optional[StepResult]:
    """The env's wheelhouse when the site installs from one (None when it does not)."""
    uv = any(s.kind == "pip" and s.installer == "uv" for s in resolved.plan.steps)
    if uv and cli is None:
        return StepResult(f"build {resolved.identity.image_tag}", Verdict.REFUSED,
                          f"site {site.name!r} installs with uv, bind-mounted with RUN --mount, which needs "
                          f"BuildKit, and no docker client here runs it; {NO_BUILDKIT_FIX}", reason="no_buildkit")
    if not any(s.kind == "pip" and s.uses_wheelhouse for s in resolved.plan.steps):
        return None
    if cli is None:
        return StepResult(f"build {resolved.identity.image_tag}", Verdict.REFUSED,
                          f"site {site.name!r} installs from the wheelhouse with RUN --mount, which needs "
                          f"BuildKit, and no docker client here runs it; {NO_BUILDKIT_FIX}", reason="no_buildkit")
    from envport.builders.wheelhouse import ensure_wheelhouse

    return ensure_wheelhouse(loaded, site, root, progress)


def _build_image(client, cli: Optional[str], loaded: Loaded, site: Site, root: Path, resolved, previous,
                 no_cache: bool, progress: Progress, start: float) -> StepResult:
    """Render the context, run the build, and tag the image only when it succeeded and carries the hash."""
    name, tag, hash_, plan = resolved.identity.name, resolved.identity.image_tag, resolved.hash, resolved.plan
    wheelhouse = site.wheelhouse_path(root, name) if any(
        s.kind == "pip" and s.uses_wheelhouse for s in plan.steps) else None
    rendering = render_plan(plan, hash_, (TARGET,), site=site.name)
    plan_ops, plan_all = instruction_steps(rendering.files["Dockerfile"][0].decode())
    labels = image_labels_for(loaded, hash_)
    step = f"build {tag}"
    t0 = time.monotonic()
    work = docker_context.make_workdir(root, name)
    try:
        with docker_context.env_context(root, name, work / "context") as context:
            docker_context.write_context(context, rendering, plan, wheelhouse,
                                         docker_context.build_dir(root) / docker_context.PHASES_CACHE, progress)
            if any(s.kind == "pip" and s.installer == "uv" for s in plan.steps):
                from envport.builders.tools import stage_uv

                failed = stage_uv(context, root, progress)
                if failed is not None:
                    return failed
            how = f"BuildKit via {cli}" if cli else "legacy builder (docker SDK)"
            progress(f"envport: [docker] building {tag} ({how}, network {site.network}"
                     f"{', no cache' if no_cache else ''})")
            if cli:
                ok, image_id, log = _build_buildkit(cli, context, work / "iid", plan_ops, site, labels, no_cache,
                                                    progress)
            else:
                ok, image_id, log = _build_legacy(client, context, plan_all, site, labels, no_cache, progress)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    seconds = time.monotonic() - t0
    builder = "buildkit" if cli else "legacy"
    if not ok:
        ref, lines = log.tail()
        where = f"{ref.label()} ({ref.title})" if isinstance(ref, StepRef) else "the build"
        return StepResult(step, Verdict.FAILED, f"{where} failed; no tag was written", lines=lines,
                          seconds=seconds, data={"image": tag, "failed_step": ref.marker if ref else None,
                                                 "builder": builder})
    image = client.images.get(image_id)
    if image.labels.get("envport.hash") != hash_:
        return StepResult(step, Verdict.FAILED, f"built image {image_id[:19]} lacks envport.hash={hash_[:12]}",
                          seconds=seconds)
    # A build that says OK holds the spec's pins; a failing image gets no tag, so it is never `present`.
    python = next(s.venv for s in plan.steps if s.kind == "python") + "/bin/python"
    progress(f"envport: [docker] pin check in {image.id[:19]}")
    failed = pin_check(client, image.id, plan, python, step)
    if failed is not None:
        return dataclasses.replace(failed, seconds=seconds,
                                   data={"image": tag, "image_id": image.id, "builder": builder})
    progress(f"envport: [docker] SBOM of {image.id[:19]} into {SBOM_PATH}")
    image, components = _with_sbom(client, image, loaded, site, hash_)
    _tag(client, image, name, hash_, previous)
    size = image.attrs.get("Size", 0)
    return StepResult(step, Verdict.OK,
                      f"{image.id[:19]} ({_size(size)}; {len(set(log.built))} step(s) built, "
                      f"{len(set(log.cached))} cached)",
                      seconds=seconds,
                      data={"image": tag, "image_id": image.id, "size": size,
                            "built_steps": list(dict.fromkeys(log.built)),
                            "cached_steps": list(dict.fromkeys(log.cached)), "builder": builder,
                            "sbom_components": components, "sbom_sha256": image.labels.get(SBOM_LABEL),
                            "total_seconds": round(time.monotonic() - start, 3)})


def _with_sbom(client, image, loaded: Loaded, site: Site, hash_: str):
    """(IMAGE plus one layer holding its CycloneDX SBOM at SBOM_PATH and the label SBOM_LABEL = the file's
    sha256, component count). The SBOM is read from IMAGE's exported filesystem (what it holds, as `envport
    sbom --target docker` reads it); the layer is built FROM the image's id, so its config is kept."""
    import hashlib
    import io
    import tarfile
    import tempfile
    from datetime import datetime

    from envport.engines.docker import export_rootfs
    from envport.sif import sbom

    created = datetime.fromisoformat(image.attrs["Created"][:19] + "+00:00")
    facts = sbom.EnvFacts(loaded.spec.name, hash_, TARGET, lock=sbom.lock_fact(loaded, site), created=created)
    with tempfile.TemporaryDirectory(prefix="envport-sbom-") as tmp:
        export_rootfs(image.id, Path(tmp) / "rootfs")
        text, packages = sbom.make_sbom(Path(tmp) / "rootfs", facts)
    data = text.encode("utf-8")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, body in (("Dockerfile", f"FROM {image.id}\nCOPY {sbom.SBOM_NAME} {SBOM_PATH}\n".encode()),
                           (sbom.SBOM_NAME, data)):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(body), int(created.timestamp()), 0o644
            tar.addfile(info, io.BytesIO(body))
    buf.seek(0)
    built, _ = client.images.build(fileobj=buf, custom_context=True, rm=True, network_mode="none",
                                   labels={SBOM_LABEL: hashlib.sha256(data).hexdigest()})
    return built, len(packages)


def _tag(client, image, name: str, hash_: str, previous) -> None:
    image.tag(repo(name), hash_[:12])
    image.tag(repo(name), "latest")
    if previous is not None and previous.id != image.id:
        # The image this rebuild replaces is now untagged: drop it, unless something still uses it.
        import docker

        try:
            client.images.remove(previous.id, noprune=False)
        except docker.errors.APIError:
            pass

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
6. the pin check (builders/pins.py), in a throwaway container of the built image;
7. the SBOM: only the files it reads, read from the built image (sif/sbom.py `image_sbom`: its layers
   mounted read-only where envport may, else its export streamed and filtered; never the whole filesystem
   written out), the CycloneDX file committed in one layer at SBOM_PATH with the label SBOM_LABEL naming its
   sha256 (docs/registry.md).  A `present` image (2.) is never read again: its SBOM is the one it carries.

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
    # The SBOM that ends a build validates with jsonschema: seconds of imports, paid while the engine builds.
    from envport.sif.sbom import warm_validator

    warm_validator()
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
            context_s = time.monotonic() - t0  # staging, and which wheels each phase needs (pip, cached)
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
    return _finish(client, client.images.get(image_id), loaded, site, resolved, previous, log,
                   {"builder": builder, "start": start, "engine_build": seconds, "context": context_s}, progress)


def _finish(client, image, loaded: Loaded, site: Site, resolved, previous, log, run: dict,
            progress: Progress) -> StepResult:
    """After the engine's build: the hash label and pin check, the SBOM layer, then the tags, each timed
    (data `timings`, with the context's staging and the engine's build before them: what an edit's rebuild
    spends outside the engine shows there)."""
    name, tag, hash_, plan = resolved.identity.name, resolved.identity.image_tag, resolved.hash, resolved.plan
    step, seconds, builder = f"build {tag}", run["engine_build"], run["builder"]
    if image.labels.get("envport.hash") != hash_:
        return StepResult(step, Verdict.FAILED, f"built image {image.id[:19]} lacks envport.hash={hash_[:12]}",
                          seconds=seconds)
    # A build that says OK holds the spec's pins; a failing image gets no tag, so it is never `present`.
    # The SBOM is read meanwhile (a thread: both mostly wait, on the engine and on the disk).
    from concurrent.futures import ThreadPoolExecutor

    python = next(s.venv for s in plan.steps if s.kind == "python") + "/bin/python"
    progress(f"envport: [docker] pin check in {image.id[:19]}, SBOM of it read beside")
    t = time.monotonic()
    with ThreadPoolExecutor(1, thread_name_prefix="envport-sbom") as pool:
        read = pool.submit(_read_sbom, image, loaded, site, hash_)
        failed = pin_check(client, image.id, plan, python, step)
        timings = {"context": round(run["context"], 3), "engine_build": round(seconds - run["context"], 3),
                   "pin_check": round(time.monotonic() - t, 3)}
        if failed is not None:
            return dataclasses.replace(failed, seconds=seconds,
                                       data={"image": tag, "image_id": image.id, "builder": builder})
        t = time.monotonic()
        text, packages, how, read_s = read.result()
    timings["sbom_read"] = round(time.monotonic() - t, 3)  # what it added after the pin check: its wall cost
    progress(f"envport: [docker] SBOM: {len(packages)} components ({how}: {_READ_HOW[how]}, {read_s:.1f}s); "
             f"committed into {SBOM_PATH}")
    t = time.monotonic()
    image = _sbom_layer(client, image, text.encode("utf-8"))
    timings["sbom_layer"] = round(time.monotonic() - t, 3)
    t = time.monotonic()
    _tag(client, image, name, hash_, previous)
    timings["tag"] = round(time.monotonic() - t, 3)
    components = len(packages)
    size = image.attrs.get("Size", 0)
    return StepResult(step, Verdict.OK,
                      f"{image.id[:19]} ({_size(size)}; {len(set(log.built))} step(s) built, "
                      f"{len(set(log.cached))} cached)",
                      seconds=seconds,
                      data={"image": tag, "image_id": image.id, "size": size,
                            "built_steps": list(dict.fromkeys(log.built)),
                            "cached_steps": list(dict.fromkeys(log.cached)), "builder": builder,
                            "sbom_components": components, "sbom_sha256": image.labels.get(SBOM_LABEL),
                            "timings": timings, "total_seconds": round(time.monotonic() - run["start"], 3)})


_READ_HOW = {"mounted": "the image's layers mounted read-only, only the SBOM's files read",
             "streamed": "the image's export streamed, only the SBOM's files kept"}


def _read_sbom(image, loaded: Loaded, site: Site, hash_: str) -> tuple[str, list, str, float]:
    """(text, packages, how, seconds) of IMAGE's CycloneDX SBOM, read from IMAGE's files, only those it reads
    (sif/sbom.py `image_sbom`: its layers mounted read-only, or its export filtered to them; HOW says which),
    as `envport sbom --target docker` reads it; its time the image's Created."""
    from envport.sif import sbom

    t0 = time.monotonic()
    facts = sbom.EnvFacts(loaded.spec.name, hash_, TARGET, lock=sbom.lock_fact(loaded, site),
                          created=_created(image))
    text, packages, how = sbom.image_sbom(image.id, facts, graph=image.attrs.get("GraphDriver"))
    return text, packages, how, time.monotonic() - t0


def _created(image):
    """IMAGE's Created time (the engine's, to the second, UTC): its SBOM's timestamp and the SBOM file's mtime."""
    from datetime import datetime

    return datetime.fromisoformat(image.attrs["Created"][:19] + "+00:00")


def _sbom_layer(client, image, data: bytes):
    """IMAGE plus one layer holding DATA at SBOM_PATH, its config IMAGE's own plus the label SBOM_LABEL naming
    DATA's sha256; the file's mtime is IMAGE's Created (the SBOM's own timestamp).

    A container of IMAGE is created (never started), the file put into it and the container committed with
    IMAGE's own config (~0.2 s: no build, no context).  The engine fills what a commit's config leaves empty
    from the container's, so an image with neither Cmd nor Entrypoint (its container gets one to exist) takes
    a one-line build instead, FROM IMAGE."""
    import hashlib
    import io
    import tarfile

    sha256, created = hashlib.sha256(data).hexdigest(), _created(image)
    config = {**image.attrs["Config"], "Image": image.id}
    if not (config.get("Cmd") or config.get("Entrypoint")):
        return _sbom_layer_built(client, image, data, sha256, created)
    config["Labels"] = {**(config.get("Labels") or {}), SBOM_LABEL: sha256}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(SBOM_PATH.lstrip("/"))
        info.size, info.mtime, info.mode = len(data), int(created.timestamp()), 0o644
        tar.addfile(info, io.BytesIO(data))
    # Never run: its command is only what the image's history shows for this layer, as a build's would read.
    container = client.containers.create(image.id, ["/bin/sh", "-c", f"#(nop) COPY sbom.cdx.json {SBOM_PATH}"],
                                         network_disabled=True)
    try:
        container.put_archive("/", buf.getvalue())  # parent folders the image lacks are made 0755
        committed = container.commit(conf=config, message=f"envport: the CycloneDX SBOM at {SBOM_PATH}")
    finally:
        container.remove(force=True)
    return client.images.get(committed.id)


def _sbom_layer_built(client, image, data: bytes, sha256: str, created):
    """_sbom_layer by the legacy builder: `FROM IMAGE` + `COPY` of the file, the label added."""
    import io
    import tarfile

    from envport.sif.sbom import SBOM_NAME

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, body in (("Dockerfile", f"FROM {image.id}\nCOPY {SBOM_NAME} {SBOM_PATH}\n".encode()),
                           (SBOM_NAME, data)):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(body), int(created.timestamp()), 0o644
            tar.addfile(info, io.BytesIO(body))
    buf.seek(0)
    built, _ = client.images.build(fileobj=buf, custom_context=True, rm=True, network_mode="none",
                                   labels={SBOM_LABEL: sha256})
    return built


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

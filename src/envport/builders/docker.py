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
   `no_buildkit` with the fix, rather than copying the wheels into the image.

The build gets no tag at all (`--iidfile`); only a successful build is tagged,
so a killed build leaves no tag and a re-run continues from the engine's
layer cache.  Nothing from the host environment reaches the build: the docker
CLI runs with a minimal environment and no `--build-arg`, so a token such as
HF_TOKEN never lands in a layer, the history or a label.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable, Optional

from .. import __version__
from ..hashing import content_hash
from ..ledger import append
from ..loader import Loaded
from ..plan import BaseStep, Plan, make_plan
from ..render import render_plan
from ..site import Site, apply_site
from ..verdict import StepResult, Verdict
from . import docker_context
from .docker_log import BuildkitLog, LegacyLog, StepRef, instruction_steps

Progress = Callable[[str], None]
TARGET = "docker"
# Clients that may run BuildKit, in order; ENVPORT_DOCKER_CLI overrides (tests use it to
# pick a client without BuildKit and see the legacy path).
CLI_CANDIDATES = ("/usr/bin/docker", "docker")
# What the docker CLI needs to find and talk to the engine; nothing else of the host's
# environment is passed, so no secret can reach the build by accident.
CLI_ENV_KEEP = ("PATH", "HOME", "DOCKER_HOST", "DOCKER_CONFIG", "DOCKER_CERT_PATH", "DOCKER_TLS_VERIFY",
                "DOCKER_CONTEXT", "DOCKER_API_VERSION", "TMPDIR")
DOCKER_UNREACHABLE_FIX = ("start the engine (`bash .ci/services/dockerd.sh`, or `dockerd &`), "
                          "or point DOCKER_HOST at one that runs")
NO_BUILDKIT_FIX = ("install a docker client that runs BuildKit (Debian's docker.io: /usr/bin/docker with "
                   "DOCKER_BUILDKIT=1, or docker-buildx), or build with a site profile that has "
                   "`wheelhouse: false`")
_buildkit_cli: dict[str, Optional[str]] = {}


def repo(name: str) -> str:
    return f"envport/{name}"


def image_tag(name: str, hash_: str) -> str:
    return f"{repo(name)}:{hash_[:12]}"


def docker_host() -> str:
    return os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")


def connect(timeout: int = 60, ping_timeout: int = 10):
    """(client, None) when the engine answers a ping within ping_timeout, else (None, why)."""
    try:
        import docker

        client = docker.from_env(timeout=ping_timeout)
        client.ping()
    except Exception as exc:  # DockerException, requests/urllib3 and socket errors alike
        return None, f"{type(exc).__name__}: {str(exc)[:300]}"
    client.api.timeout = timeout  # streamed builds pass no timeout of their own and wait as long as they run
    return client, None


def unreachable(step: str, why: str) -> StepResult:
    return StepResult(step, Verdict.REFUSED,
                      f"the docker engine at {docker_host()} does not answer ({why}); {DOCKER_UNREACHABLE_FIX}",
                      reason="docker_unreachable")


def get_image(client, ref: str):
    import docker

    try:
        return client.images.get(ref)
    except docker.errors.ImageNotFound:
        return None


def buildkit_cli() -> Optional[str]:
    """The first docker client that runs BuildKit without buildx (`DOCKER_BUILDKIT=1`), probed once."""
    override = os.environ.get("ENVPORT_DOCKER_CLI")
    candidates = (override,) if override else CLI_CANDIDATES
    key = ":".join(candidates)
    if key not in _buildkit_cli:
        _buildkit_cli[key] = None
        for cand in candidates:
            path = shutil.which(cand)
            if not path:
                continue
            # The 28.x client without buildx fails `build --help` with "buildx component is missing".
            proc = subprocess.run([path, "build", "--help"], capture_output=True, text=True,
                                  env={**_cli_env(), "DOCKER_BUILDKIT": "1"}, timeout=30)
            if proc.returncode == 0 and "--iidfile" in proc.stdout and "--secret" in proc.stdout:
                _buildkit_cli[key] = path
                break
    return _buildkit_cli[key]


def _cli_env() -> dict[str, str]:
    return {k: os.environ[k] for k in CLI_ENV_KEEP if k in os.environ}


def _die_with_parent() -> None:
    # If envport itself is killed, the docker client must not keep building on its own.
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _fix_for_base(image: str) -> str:
    from ..base_image import RECIPES

    local = {tag: name for name, tag in RECIPES.items()}
    if image in local:
        return f"build it here: `envport base {local[image]}`"
    if image.startswith("envport/"):
        made = ", ".join(f"`envport base {name}` makes {tag}" for name, tag in sorted(RECIPES.items()))
        return f"envport/* images are built locally ({made}); build or `docker load` {image} here"
    return (f"`docker pull {image}` on a host with registry access and `docker save | docker load` it here, "
            "or map it to a local image in the site profile's base_images")


def _labels(loaded: Loaded, hash_: str) -> dict[str, str]:
    return {
        "envport.hash": hash_,
        "envport.name": loaded.spec.name,
        "envport.version": __version__,
        "envport.spec": json.dumps(loaded.spec.model_dump(mode="json"), sort_keys=True, separators=(",", ":")),
    }


class _Interrupted(KeyboardInterrupt):
    pass


def _run_cli(argv: list[str], cwd: Path, log: BuildkitLog) -> int:
    """Run the BuildKit client; a SIGTERM/SIGINT to envport stops it (and with it the build)."""
    env = {**_cli_env(), "DOCKER_BUILDKIT": "1"}
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace", preexec_fn=_die_with_parent)
    previous = None
    if threading.current_thread() is threading.main_thread():
        def _stop(signum, frame):
            raise _Interrupted(signum)
        previous = signal.signal(signal.SIGTERM, _stop)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            log.feed(line)
        return proc.wait()
    except BaseException:
        proc.send_signal(signal.SIGINT)  # the client cancels the build in the engine
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _build_buildkit(cli: str, context: Path, iidfile: Path, plan_ops: list, site: Site, labels: dict,
                    no_cache: bool, progress: Progress) -> tuple[bool, Optional[str], BuildkitLog]:
    argv = [cli, "build", "--progress=plain", "--iidfile", str(iidfile), "--network", site.network]
    for k, v in labels.items():
        argv += ["--label", f"{k}={v}"]
    if no_cache:
        argv.append("--no-cache")
    argv.append(".")
    log = BuildkitLog(plan_ops, progress)
    rc = _run_cli(argv, context, log)
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


def _record(root: Path, loaded: Loaded, hash_: str, result: StepResult, **extra) -> None:
    spec = loaded.spec
    append(root, spec.name, {
        "kind": "build", "target": TARGET, "hash": hash_, "verdict": result.verdict.value,
        "summary": result.detail, "seconds": round(result.seconds, 3),
        "resources": spec.resources.model_dump(), "sm_range": spec.sm_range,
        "weights": {n: w.path for n, w in spec.weight_dirs.items()},
        **result.data, **extra,
    })


def _size(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


def build(loaded: Loaded, site: Site, root: Path, *, rebuild: bool = False, no_cache: bool = False,
          progress: Progress) -> list[StepResult]:
    """Build (or find) the env's image; each step's StepResult, stopping at the first not ok."""
    start = time.monotonic()
    name = loaded.spec.name
    hash_ = content_hash(loaded, site)
    tag = image_tag(name, hash_)
    results: list[StepResult] = []

    client, why = connect()
    if client is None:
        return [unreachable("docker engine", why)]

    t0 = time.monotonic()
    image = previous = get_image(client, tag)
    if image is not None and image.labels.get("envport.hash") == hash_ and not rebuild:
        if f"{repo(name)}:latest" not in image.tags:
            image.tag(repo(name), "latest")
        size = image.attrs.get("Size", 0)
        return [StepResult(f"image {tag}", Verdict.PRESENT, f"{image.id[:19]} ({_size(size)})",
                           seconds=time.monotonic() - t0,
                           data={"image": tag, "image_id": image.id, "size": size})]
    if image is not None and not rebuild:
        progress(f"envport: [docker] {tag} exists but its envport.hash label is not {hash_[:12]}...; rebuilding")

    plan: Plan = apply_site(make_plan(loaded), site)
    base = next(s.image for s in plan.steps if isinstance(s, BaseStep))
    t0 = time.monotonic()
    if get_image(client, base) is not None:
        results.append(StepResult(f"base {base}", Verdict.PRESENT, "local", seconds=time.monotonic() - t0))
    elif not site.registry or base.startswith("envport/"):
        results.append(StepResult(
            f"base {base}", Verdict.REFUSED,
            f"base image {base} is not in the engine and site {site.name!r} cannot pull it; {_fix_for_base(base)}",
            reason="base_image_missing"))
        return results
    else:
        results.append(StepResult(f"base {base}", Verdict.SKIPPED, "not local; the build pulls it"))

    uses_wheelhouse = any(s.kind == "pip" and s.uses_wheelhouse for s in plan.steps)
    cli = buildkit_cli()
    if uses_wheelhouse and cli is None:
        results.append(StepResult(f"build {tag}", Verdict.REFUSED,
                                  f"site {site.name!r} installs from the wheelhouse with RUN --mount, which needs "
                                  f"BuildKit, and no docker client here runs it; {NO_BUILDKIT_FIX}",
                                  reason="no_buildkit"))
        return results
    wheelhouse = None
    if uses_wheelhouse:
        from ..wheelhouse import ensure_wheelhouse

        wh = ensure_wheelhouse(loaded, site, root, progress)
        results.append(wh)
        if not wh.verdict.ok:
            return results
        wheelhouse = site.wheelhouse_path(root, name)

    rendering = render_plan(plan, hash_, (TARGET,))
    dockerfile = rendering.files["Dockerfile"][0].decode()
    plan_ops, plan_all = instruction_steps(dockerfile)
    labels = _labels(loaded, hash_)
    step = f"build {tag}"
    t0 = time.monotonic()
    work = docker_context.make_workdir(root, name)
    try:
        context = work / "context"
        context.mkdir()
        docker_context.write_context(context, rendering, plan, wheelhouse,
                                     docker_context.build_dir(root) / docker_context.PHASES_CACHE, progress)
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
        result = StepResult(step, Verdict.FAILED, f"{where} failed; no tag was written", lines=lines,
                            seconds=seconds, data={"image": tag, "failed_step": ref.marker if ref else None})
        results.append(result)
        _record(root, loaded, hash_, result, builder=builder)
        return results

    image = client.images.get(image_id)
    if image.labels.get("envport.hash") != hash_:
        result = StepResult(step, Verdict.FAILED, f"built image {image_id[:19]} lacks envport.hash={hash_[:12]}",
                            seconds=seconds)
        results.append(result)
        return results
    image.tag(repo(name), hash_[:12])
    image.tag(repo(name), "latest")
    if previous is not None and previous.id != image.id:
        # The image this rebuild replaces is now untagged: drop it, unless something still uses it.
        import docker

        try:
            client.images.remove(previous.id, noprune=False)
        except docker.errors.APIError:
            pass
    size = image.attrs.get("Size", 0)
    result = StepResult(step, Verdict.OK,
                        f"{image.id[:19]} ({_size(size)}; {len(set(log.built))} step(s) built, "
                        f"{len(set(log.cached))} cached)",
                        seconds=seconds,
                        data={"image": tag, "image_id": image.id, "size": size,
                              "built_steps": list(dict.fromkeys(log.built)),
                              "cached_steps": list(dict.fromkeys(log.cached))})
    results.append(result)
    _record(root, loaded, hash_, result, builder=builder, total_seconds=round(time.monotonic() - start, 3))
    return results

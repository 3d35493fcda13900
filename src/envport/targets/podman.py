"""podman, rootless: the docker recipe (the same rendered Dockerfile) built by `podman build` as this user.

The image is `envport/<name>:<hash12>` in the user's own podman storage, with
the same labels, the same hash and the same plan as a docker build of the
same site, so parity compares the two freezes directly.  Order of checks,
each cheap before anything expensive: podman answers with a usable id
mapping (else REFUSED, engines/podman.py), the tag carries the hash
(`present`), the base image is in this user's storage, the wheelhouse, the
build (tagged only when it succeeded and its pins hold).  docs/podman.md has
the measurements.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import shutil
import time
from pathlib import Path
from typing import Optional

from envport.core.verdict import StepResult, Verdict
from envport.targets.base import (PRESENT, SLURM, BuildRequest, GcRequest, Need, NeedsRequest, Target, Unavailable,
                                  VerifyRequest, WitnessRequest)

NAME = "podman"
RECIPE = "docker"  # the Dockerfile docker builds, byte for byte: one identity, one plan
# Rootless podman here has no /dev/mqueue for --ipc host (measured: "statfs /dev/mqueue: no such file or
# directory"); the ranks' tensors go through a private /dev/shm of this size instead.
WITNESS_SHM = "2g"


def _engine():
    # Imported when a podman operation runs, never at `--help` (tests/test_cli.py: help imports no engine).
    from envport.engines import podman

    return podman


def _resolve(loaded, site):
    from envport.recipe.identity import resolve

    return resolve(loaded, site, RECIPE)


def _present(resolved, found: Optional[dict]) -> Optional[StepResult]:
    from envport.builders.docker.builder import _present_result, repo

    if found is None or found["labels"].get("envport.hash") != resolved.hash:
        return None
    latest = f"{repo(resolved.identity.name)}:latest"
    if latest not in found["tags"]:
        _engine().tag(found["id"], latest)
    return _present_result(resolved.identity.image_tag, found["id"], found["size"])


def _base(plan) -> StepResult:
    from envport.plan.steps import BaseStep

    base = next(s.image for s in plan.steps if isinstance(s, BaseStep))
    if _engine().image(base) is not None:
        return StepResult(f"base {base}", Verdict.PRESENT, "local")
    return StepResult(f"base {base}", Verdict.REFUSED,
                      f"base image {base} is not in this user's podman storage; copy it from the docker engine: "
                      f"`docker save {base} | podman load` (or `bash .ci/services/podman.sh` for the test user)",
                      reason="base_image_missing")


def _wheelhouse(req: BuildRequest, plan) -> Optional[StepResult]:
    if not any(s.kind == "pip" and s.uses_wheelhouse for s in plan.steps):
        return None
    from envport.builders.wheelhouse import ensure_wheelhouse

    return ensure_wheelhouse(req.loaded, req.site, req.root, req.progress)


class _Log:
    """podman's build output: `STEP n/m: ...` lines are progress, the tail is a failure's lines."""

    def __init__(self, progress):
        self.progress, self.lines, self.steps = progress, [], 0

    def feed(self, line: str) -> None:
        line = line.rstrip("\n")
        self.lines = [*self.lines[-199:], line]
        if line.startswith("STEP "):
            self.steps += 1
            self.progress(f"envport: [podman] {line[:200]}")


def _build_image(req: BuildRequest, resolved, previous: Optional[dict]) -> StepResult:
    from envport.builders import pins
    from envport.builders.docker import context as docker_context
    from envport.builders.docker.builder import _labels, _size
    from envport.recipe.render import render_plan

    name, tag, hash_, plan = resolved.identity.name, resolved.identity.image_tag, resolved.hash, resolved.plan
    site, root, step = req.site, req.root, f"build {tag}"
    wheelhouse = site.wheelhouse_path(root, name) if any(
        s.kind == "pip" and s.uses_wheelhouse for s in plan.steps) else None
    rendering = render_plan(plan, hash_, (RECIPE,), site=site.name)
    argv = ["--network", site.network, "--layers", "--format", "docker", "-f", "Dockerfile"]
    for k, v in _labels(req.loaded, hash_).items():
        argv += ["--label", f"{k}={v}"]
    if req.no_cache:
        argv.append("--no-cache")
    log = _Log(req.progress)
    t0 = time.monotonic()
    work = docker_context.make_workdir(root, name)
    try:
        with docker_context.env_context(root, name, work / "context") as context:
            docker_context.write_context(context, rendering, plan, wheelhouse,
                                         docker_context.build_dir(root) / docker_context.PHASES_CACHE, req.progress)
            if any(s.kind == "pip" and s.installer == "uv" for s in plan.steps):
                from envport.builders.tools import stage_uv

                failed = stage_uv(context, root, req.progress)
                if failed is not None:
                    return failed
            req.progress(f"envport: [podman] building {tag} (podman build, rootless, network {site.network}"
                         f"{', no cache' if req.no_cache else ''})")
            iid = (work / "iid").absolute()  # podman resolves a relative --iidfile in the context
            rc = _engine().build([*argv, "--iidfile", str(iid), "."], context, log.feed)
            image_id = iid.read_text().strip().removeprefix("sha256:") if rc == 0 and iid.is_file() else ""
    finally:
        shutil.rmtree(work, ignore_errors=True)
    seconds = time.monotonic() - t0
    if not image_id:
        return StepResult(step, Verdict.FAILED, f"podman build exited {rc}; no tag was written",
                          lines=log.lines[-20:], seconds=seconds, data={"image": tag, "builder": NAME})
    built = _engine().image(image_id)
    if built is None or built["labels"].get("envport.hash") != hash_:
        return StepResult(step, Verdict.FAILED, f"built image {image_id[:12]} lacks envport.hash={hash_[:12]}",
                          seconds=seconds)
    python = next(s.venv for s in plan.steps if s.kind == "python") + "/bin/python"
    if pins.pins(plan):
        req.progress(f"envport: [podman] pin check in {image_id[:12]}")
        ran = _engine().run_in_image(image_id, pins.probe_argv(python))
        failed = _pin_verdict(step, plan, image_id, ran)
        if failed is not None:
            return dataclasses.replace(failed, seconds=seconds, data={"image": tag, "image_id": image_id})
    _engine().tag(image_id, tag, f"envport/{name}:latest")
    if previous is not None and previous["id"] != image_id:
        _engine().remove_image(previous["id"])
    return StepResult(step, Verdict.OK, f"{image_id[:19]} ({_size(built['size'])}; {log.steps} podman step(s))",
                      seconds=seconds, data={"image": tag, "image_id": image_id, "size": built["size"],
                                             "builder": NAME})


def _pin_verdict(step: str, plan, image_id: str, ran) -> Optional[StepResult]:
    from envport.builders import pins

    if not ran.ok:
        return StepResult(step, Verdict.FAILED, f"the pin check could not run in {image_id[:12]} "
                          f"(exit {ran.returncode})", reason="pin_check_failed", lines=ran.text.splitlines()[-20:])
    try:
        installed = pins.parse_probe(ran.stdout)
    except ValueError as exc:
        return StepResult(step, Verdict.FAILED, str(exc), reason="pin_check_failed")
    return pins.result(step, plan, installed)


def build(req: BuildRequest) -> list[StepResult]:
    resolved = _resolve(req.loaded, req.site)
    refused = _engine().problem(f"image {resolved.identity.image_tag}")
    if refused is not None:
        return [refused]
    previous = _engine().image(resolved.identity.image_tag)
    present = None if req.rebuild else _present(resolved, previous)
    if present is not None:
        return [present]
    results = [_base(resolved.plan)]
    if not results[-1].verdict.ok:
        return results
    wheelhouse = _wheelhouse(req, resolved.plan)
    if wheelhouse is not None:
        results.append(wheelhouse)
        if not wheelhouse.verdict.ok:
            return results
    results.append(_build_image(req, resolved, previous))
    return results


def verify(req: VerifyRequest) -> StepResult:
    """The spec's checks (and tests/images/) through testinfra's podman:// backend in a throwaway container."""
    import contextlib
    import io
    import tempfile

    import pytest

    from envport.builders import weights
    from envport.core.proc import sigterm_interrupts
    from envport.plan.steps import CONTAINER_VENV
    from envport.verify.docker import pytest_args
    from envport.verify.checks import Facts, spec_checks
    from envport.verify.docker import VERIFY_LABEL, default_junit
    from envport.verify.plugin import VerifyPlugin
    from envport.core.files import shown_path
    from envport.verify.report import outcome, progress_line

    start = time.monotonic()
    spec, identity = req.loaded.spec, _resolve(req.loaded, req.site).identity
    ref = req.image or identity.image_tag
    step = f"verify {spec.name}@{identity.hash[:12]} ({NAME} {ref})"
    refused = _engine().problem(step)
    if refused is not None:
        return refused
    img = _engine().image(ref)
    if img is None:
        return StepResult(step, Verdict.REFUSED, f"image {ref} is not in this user's podman storage; build it: "
                          f"`envport build {spec.name} --target podman`", reason="image_missing")
    junit = Path(req.junit) if req.junit else default_junit(req.root, spec.name)
    junit.parent.mkdir(parents=True, exist_ok=True)
    name = f"envport-verify-{spec.name}-{secrets.token_hex(4)}"

    def make_facts() -> Facts:
        import testinfra

        return Facts(testinfra.get_host(f"podman://{name}"), labels=dict(img["labels"]), venv=CONTAINER_VENV,
                     foreign_hash_ok=req.image is not None)

    plugin = VerifyPlugin(spec=spec, spec_path=req.loaded.path, checks=spec_checks(req.loaded, identity.hash),
                          make_facts=make_facts, image=ref, on_result=progress_line(req.progress))
    out = io.StringIO()
    with sigterm_interrupts():
        try:
            req.progress(f"envport: [verify] starting {name} from {ref} (podman, network {req.site.network})")
            started = _engine().start(img["id"], name, req.site.network,
                                   weights.existing_mounts(spec, weights.weights_root()), {VERIFY_LABEL: spec.name})
            if not started.ok:
                return StepResult(step, Verdict.FAILED, f"podman could not start {name}",
                                  lines=started.text.splitlines()[-20:])
            with tempfile.TemporaryDirectory(prefix="envport-verify-") as tmp, contextlib.redirect_stdout(out):
                code = pytest.main(pytest_args(req.root, req.loaded.path, [f"--hosts=podman://{name}"], junit,
                                                Path(tmp)), plugins=[plugin])
        finally:
            _engine().remove_container(name)
    verdict, lines, summary = outcome(code, plugin.results, out.getvalue())
    junit_shown = shown_path(junit, req.root)
    return StepResult(step, verdict, f"{summary}; junit {junit_shown}", lines=lines,
                      seconds=time.monotonic() - start,
                      data={"image": ref, "image_id": img["id"], "size": img["size"], "junit": junit_shown,
                            "image_hash": img["labels"].get("envport.hash"), "checks": plugin.results})



class Podman(Target):
    name = NAME
    recipe = RECIPE
    summary = ("image envport/<name>:<hash12> built rootless by `podman build` from the same Dockerfile, "
               "in the user's own podman storage")
    engine_lock = "podman storage"
    unsupported = {
        PRESENT: "a podman build checks the image's envport.hash label itself and reports present",
        SLURM: "no Slurm profile runs podman tasks yet (container_runtime is docker or apptainer)",
    }

    def env_disk(self, spec, project_root):
        # Rootless storage is the user's own (containers-storage.conf's default graphroot).
        return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "containers"

    def runtime_findings(self, ctx) -> list:
        from envport.core.finding import Finding

        refused = _engine().problem("runtime")
        if refused is None:
            return []
        return [Finding(refused.reason, refused.detail.split("; ")[0], refused.detail.split("; ", 1)[-1])]

    def needs(self, req: NeedsRequest) -> list[Need]:
        refused = _engine().problem("podman")
        if refused is not None:
            detail, _, fix = refused.detail.partition("; ")
            return [Need("podman engine", False, detail, refused.reason, fix)]
        data, _ = _engine().info()
        base = _base(_resolve(req.loaded, req.site).plan)
        detail, _, fix = base.detail.partition("; ")
        return [Need("podman engine", True, _engine().mode(data or {})),
                Need(base.step.replace("base ", "base image ", 1), base.verdict.ok, detail, base.reason, fix)]

    def parity_unavailable(self) -> Optional[str]:
        refused = _engine().problem("podman")
        return None if refused is None else f"{refused.reason}: {refused.detail}"

    def build(self, req: BuildRequest):
        return build(req)

    def verify(self, req: VerifyRequest):
        return verify(req)

    def launcher(self, req: WitnessRequest):
        from envport.builders import weights

        spec = req.loaded.spec
        image = req.image or req.identity.image_tag
        from envport.witness.launchers.podman import PodmanLauncher

        launcher = PodmanLauncher(image, python=req.python or "python3", gpus=False, shm_size=WITNESS_SHM,
                                  docker=_engine().podman(), name_prefix="envport-witness",
                                  missing_fix=f"envport build {spec.name} --target podman, or pass --image TAG",
                                  mounts=weights.existing_mounts(spec, weights.weights_root()))
        return launcher, {"image": image, "engine": NAME}

    def probe(self, run, where, names, site=None, host=None):
        return run([_engine().podman(), "run", "--rm", "-i", "--network", "none", where, "python3", "-", *names])


    def artefacts(self, req: GcRequest):
        from envport.targets.gc import image_artefacts

        cache = req.cache.setdefault(self.name, {})
        if "refused" not in cache:
            cache["refused"] = _engine().problem("gc podman")
        if cache["refused"] is not None:
            raise Unavailable(cache["refused"])
        images = _engine().repo_images(f"envport/{req.name}", cache)
        return image_artefacts(self.name, req.name, images, "podman rm")

    def remove(self, art):
        from envport.targets.gc import remove_image

        # podman counts no layer total cheaply: what the image held alone when gc looked
        why = remove_image(art, _engine().untag, _engine().image_tags)
        return (0 if why else art.bytes), why

TARGET = Podman()

"""podman, rootless: the docker recipe (the same rendered Dockerfile) built by `podman build` as this user.

The image is `envport/<name>:<hash12>` in the user's own podman storage, with
the same labels, the same hash and the same plan as a docker build of the
same site, so parity compares the two freezes directly.  Order of checks,
each cheap before anything expensive: podman answers with a usable id
mapping (else REFUSED, engines/podman.py), the tag carries the hash
(`present`), the base image is in this user's storage, the wheelhouse, the
build (tagged only when it succeeded and its pins hold).  docs/podman.md has
the measurements.  targets/podman.py is the target; this module only builds.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from typing import Optional

from envport.core.verdict import StepResult, Verdict

NAME = "podman"
RECIPE = "docker"  # the renderer whose Dockerfile podman builds


def _engine():
    # Imported when a podman build runs, never at `--help` (tests/test_cli.py: help imports no engine).
    from envport.engines import podman

    return podman


def _present(resolved, found: Optional[dict]) -> Optional[StepResult]:
    from envport.builders.docker.builder import present_result, repo

    if found is None or found["labels"].get("envport.hash") != resolved.hash:
        return None
    latest = f"{repo(resolved.identity.name)}:latest"
    if latest not in found["tags"]:
        _engine().tag(found["id"], latest)
    return present_result(resolved.identity.image_tag, found["id"], found["size"])


def base_result(plan) -> StepResult:
    """The plan's base image in this user's podman storage: PRESENT, or REFUSED with the fix."""
    from envport.plan.steps import BaseStep

    base = next(s.image for s in plan.steps if isinstance(s, BaseStep))
    if _engine().image(base) is not None:
        return StepResult(f"base {base}", Verdict.PRESENT, "local")
    return StepResult(f"base {base}", Verdict.REFUSED,
                      f"base image {base} is not in this user's podman storage; copy it from the docker engine: "
                      f"`docker save {base} | podman load` (or `bash .ci/services/podman.sh` for the test user)",
                      reason="base_image_missing")


def _wheelhouse(req, plan) -> Optional[StepResult]:
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


def _build_image(req, resolved, previous: Optional[dict]) -> StepResult:
    from envport.builders import pins
    from envport.builders.docker import context as docker_context
    from envport.builders.docker.builder import image_labels_for
    from envport.core.progress import human_size
    from envport.recipe.render import render_plan

    name, tag, hash_, plan = resolved.identity.name, resolved.identity.image_tag, resolved.hash, resolved.plan
    site, root, step = req.site, req.root, f"build {tag}"
    wheelhouse = site.wheelhouse_path(root, name) if any(
        s.kind == "pip" and s.uses_wheelhouse for s in plan.steps) else None
    rendering = render_plan(plan, hash_, (RECIPE,), site=site.name)
    argv = ["--network", site.network, "--layers", "--format", "docker", "-f", "Dockerfile"]
    for k, v in image_labels_for(req.loaded, hash_).items():
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
    return StepResult(step, Verdict.OK, f"{image_id[:19]} ({human_size(built['size'])}; {log.steps} podman step(s))",
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


def build(req, resolved) -> list[StepResult]:
    """REQ (targets.base.BuildRequest) built as RESOLVED (its podman target's plan): present, or the base
    image, the wheelhouse and the image, each checked before the next."""
    refused = _engine().problem(f"image {resolved.identity.image_tag}")
    if refused is not None:
        return [refused]
    previous = _engine().image(resolved.identity.image_tag)
    present = None if req.rebuild else _present(resolved, previous)
    if present is not None:
        return [present]
    results = [base_result(resolved.plan)]
    if not results[-1].verdict.ok:
        return results
    wheelhouse = _wheelhouse(req, resolved.plan)
    if wheelhouse is not None:
        results.append(wheelhouse)
        if not wheelhouse.verdict.ok:
            return results
    results.append(_build_image(req, resolved, previous))
    return results

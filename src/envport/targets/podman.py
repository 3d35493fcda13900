"""podman, rootless: the docker recipe (the same rendered Dockerfile) built by `podman build` as this user.

The image is `envport/<name>:<hash12>` in the user's own podman storage, with
the same labels, the same hash and the same plan as a docker build of the
same site (it declares `recipe = "docker"`: recipe.identity gives it the
container plan), so parity compares the two freezes directly.  The build is
builders/podman.py; docs/podman.md has the measurements.
"""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path
from typing import Optional

from envport.core.verdict import StepResult, Verdict
from envport.targets.base import (PRESENT, SLURM, BuildRequest, GcRequest, Need, NeedsRequest, Target, Unavailable,
                                  VerifyRequest, WitnessRequest)

NAME = "podman"
# Rootless podman here has no /dev/mqueue for --ipc host (measured: "statfs /dev/mqueue: no such file or
# directory"); the ranks' tensors go through a private /dev/shm of this size instead.
WITNESS_SHM = "2g"


def _engine():
    # Imported when a podman operation runs, never at `--help` (tests/test_cli.py: help imports no engine).
    from envport.engines import podman

    return podman


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
    from envport.recipe.identity import identify
    from envport.verify.report import outcome, progress_line

    start = time.monotonic()
    spec, identity = req.loaded.spec, identify(req.loaded, req.site)
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
                                   weights.existing_mounts(spec), {VERIFY_LABEL: spec.name})
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



def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


class Podman(Target):
    name = NAME
    recipe = "docker"  # the Dockerfile docker builds, byte for byte: one identity, one plan
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
        from envport.builders.podman import base_result
        from envport.recipe.identity import resolve

        base = base_result(resolve(req.loaded, req.site, self).plan)
        detail, _, fix = base.detail.partition("; ")
        return [Need("podman engine", True, _engine().mode(data or {})),
                Need(base.step.replace("base ", "base image ", 1), base.verdict.ok, detail, base.reason, fix)]

    def parity_unavailable(self) -> Optional[str]:
        refused = _engine().problem("podman")
        return None if refused is None else f"{refused.reason}: {refused.detail}"

    def build(self, req: BuildRequest):
        from envport.builders import podman
        from envport.recipe.identity import resolve

        return podman.build(req, resolve(req.loaded, req.site, self))

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
                                  mounts=weights.existing_mounts(spec))
        return launcher, {"image": image, "engine": NAME}

    def push(self, req):
        import tempfile

        from envport.targets.push import ImageEngine, push_image

        refused = _engine().problem(f"push {req.identity.image_tag}", starts=False)
        if refused is not None:
            return refused
        with tempfile.TemporaryDirectory(prefix="envport-push-") as tmp:
            work = Path(tmp)
            engine = ImageEngine(self.name, _engine().podman(), _engine().cli_env(), _engine().has_image,
                                 push_args=lambda host: _engine().push_options(work, host, req.site.registry_ca),
                                 read_digest=lambda: _read(work / "digest"))
            tags = list(dict.fromkeys([req.identity.hash12, *req.named]))
            return push_image(engine, req, tags, self)

    def sbom(self, req):
        from datetime import datetime

        from envport.targets import sbom

        step = f"sbom {req.identity.image_tag} (podman)"
        refused = _engine().problem(step, starts=False)  # the image's files are exported, nothing is started
        if refused is not None:
            return refused, None
        img = _engine().image(req.identity.image_tag)
        if img is None:
            return sbom.missing(step, f"this user's podman storage has no image {req.identity.image_tag}",
                                "image_missing", f"envport build {req.loaded.spec.name} --target podman"), None
        created = datetime.fromisoformat(img["created"][:19] + "+00:00") if img["created"] else None
        facts = sbom.facts_of(req.loaded, req.identity, self.name, req.lock, created)
        return sbom.from_image(step, req.identity, _engine().podman(), _engine().cli_env(), facts, req.fmt)

    def probe(self, run, where, names, site=None, host=None):
        return run([_engine().podman(), "run", "--rm", "-i", "--network", "none", where, "python3", "-", *names])


    def artefacts(self, req: GcRequest):
        from envport.targets.gc import image_artefacts

        cache = req.cache.setdefault(self.name, {})
        if "refused" not in cache:
            cache["refused"] = _engine().problem("gc podman", starts=False)
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

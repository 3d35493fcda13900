"""docker: the rendered Dockerfile built by the local engine (BuildKit CLI, else the SDK); image envport/<name>:<hash12>."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

from envport.core.verdict import StepResult, Verdict
from envport.targets import needs
from envport.targets.base import (PRESENT, BuildRequest, GcRequest, Need, NeedsRequest, Target, Unavailable,
                                  VerifyRequest, WitnessRequest)


class Docker(Target):
    name = "docker"
    recipe = "docker"
    engine_lock = "docker engine"
    summary = "image envport/<name>:<hash12> built by the local docker engine from images/<name>/Dockerfile"
    unsupported = {
        PRESENT: "a docker build checks the image's envport.hash label itself and reports present",
    }

    def env_disk(self, spec, project_root):
        return Path("/var/lib/docker")

    def runtime_findings(self, ctx) -> list:
        from envport.engines.docker import engine_finding, engine_problem

        client = shutil.which("docker")
        found = engine_finding(client, engine_problem(timeout=5) if client else None)
        return [found] if found.is_problem else []

    def needs(self, req: NeedsRequest) -> list[Need]:
        return [*needs.engine_need(req, self, "answers"), needs.base_need(req.loaded, req.site, self.name, req.probes)]

    def build(self, req: BuildRequest):
        from envport.builders.docker import builder
        from envport.builders.docker.present import remember

        results = builder.build(req.loaded, req.site, req.root, rebuild=req.rebuild, no_cache=req.no_cache,
                                progress=req.progress)
        if results[-1].verdict.ok and req.remember:
            remember(req.root, req.loaded.spec.name, req.site_name, req.identity.hash, req.identity.image_tag)
        return results

    def verify(self, req: VerifyRequest):
        from envport.verify.docker import verify

        return verify(req.loaded, req.site, req.root, image=req.image, junit=req.junit, progress=req.progress)

    def launcher(self, req: WitnessRequest):
        from envport.builders import weights
        from envport.witness.launchers.docker import DockerLauncher

        spec = req.loaded.spec
        image = req.image or req.identity.image_tag
        launcher = DockerLauncher(image, python=req.python or "python3", gpus=req.gpus,
                                  missing_fix=f"envport build {spec.name} --target docker, or pass --image TAG",
                                  mounts=weights.existing_mounts(spec))
        return launcher, {"image": image}

    def slurm_wrap(self, req):
        return {"image": req.image or req.identity.image_tag}

    def slurm_task(self, job):
        from envport.builders import weights
        from envport.witness.launchers.docker import DockerLauncher
        from envport.witness.slurm_job import TaskEnv, wants_gpus

        # The weights bound at their paths in the image, from the weights root the nodes share with this host.
        return TaskEnv(DockerLauncher(job.image, python=job.python, docker=job.docker_bin,
                                      witness_dir=job.witness_dir, gpus=wants_gpus(job.profile),
                                      mounts=weights.existing_mounts(job.loaded.spec)))

    def slurm_refusal(self, profile):
        if profile.container_runtime == "docker":
            return None
        return StepResult("slurm", Verdict.REFUSED, f"cluster {profile.name} runs containers with "
                          f"{profile.container_runtime}, not docker", reason="no_container_runtime",
                          lines=["fix: --target venv, or set container_runtime: docker in the profile"])

    def push(self, req):
        from envport.engines.docker import cli_env, image_exists
        from envport.targets.push import ImageEngine, push_image

        engine = ImageEngine(self.name, "docker", cli_env(), image_exists)
        tags = list(dict.fromkeys([req.identity.hash12, *req.named]))
        return push_image(engine, req, tags, self)

    def sbom(self, req):
        from envport.targets.sbom import from_docker_image

        return from_docker_image(req.loaded, req.identity, req.lock, req.fmt)

    def probe(self, run, where, names, site=None, host=None):
        return run(["docker", "run", "--rm", "-i", "--network", "none", where, "python3", "-", *names])

    def _client(self, req_cache: dict):
        from envport.engines.docker import connect

        if "client" not in req_cache:
            client, refused = connect("gc docker", timeout=300)
            if refused is not None:
                raise Unavailable(refused)
            req_cache["client"] = client
        return req_cache["client"]

    def artefacts(self, req: GcRequest):
        from envport.engines.docker import repo_images
        from envport.targets.gc import image_artefacts

        cache = req.cache.setdefault(self.name, {})
        client = self._client(cache)
        arts = image_artefacts(self.name, req.name, repo_images(client, f"envport/{req.name}", cache), "docker rm")
        return [dataclasses.replace(a, handle={**a.handle, "cache": cache}) for a in arts]

    def remove(self, art):
        from envport.engines.docker import image_tags, layers_size, untag
        from envport.targets.gc import remove_image

        cache = art.handle["cache"]
        client = cache["client"]
        before = layers_size(client)
        why = remove_image(art, lambda t: untag(client, t), lambda i: image_tags(client, i))
        cache.pop("images", None)  # what the other images hold alone has changed
        return max(before - layers_size(client), 0), why


TARGET = Docker()

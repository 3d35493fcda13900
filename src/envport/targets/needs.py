"""The needs several targets share (the docker engine, a base image, an SSH host, GPUs), each checked or said unchecked.

Probes memoises the host facts several (env, target) pairs of one matrix
share, so a judge run asks the engine once, not once per pair.
"""

from __future__ import annotations

import os
import shutil
from typing import Optional

from envport.targets.base import Need, NeedsRequest


class Probes:
    """The host facts several pairs share, each asked once per judge run."""

    def __init__(self, site, root):
        self.site, self.root = site, root
        self._memo: dict = {}

    def _once(self, key, fn):
        if key not in self._memo:
            self._memo[key] = fn()
        return self._memo[key]

    def engine(self) -> Optional[str]:
        """None when the docker engine answers, else why not."""
        from envport.engines.docker import engine_problem

        if shutil.which("docker") is None:
            return "no docker client on PATH"
        return self._once("engine", lambda: engine_problem(timeout=5))

    def has_image(self, image: str) -> bool:
        from envport.engines.docker import image_exists

        return self._once(("image", image), lambda: image_exists(image))

    def ssh(self, host: str, env: str) -> tuple[Optional[int], str]:
        from envport.engines.ssh import prefix_expr, probe_env, resolve_host

        return self._once(("ssh", host), lambda: probe_env(resolve_host(self.site, host), prefix_expr(env)))


def preflight_context(req: NeedsRequest, target):
    """builders.preflight's Context for REQ on TARGET (its runtime check is the target's own)."""
    return context_for(target, req.loaded.spec, req.root, req.host, gpu_inventory=req.gpu_inventory)


def context_for(target, spec, root, host=None, **more):
    """builders.preflight's Context for SPEC on TARGET: the target's runtime check and disk; a host target
    (one with --host) compiles on this machine unless its env lives on an SSH HOST (its setup script checks
    there); a container compiles inside its own image."""
    from envport.builders.preflight import Context

    return Context(spec, target.name, host=host, project_root=root, runtime=target.runtime_findings,
                   compiles_here=target.hosts and not host,
                   env_disk=None if host else target.env_disk(spec, root), **more)


def findings(what: str, check, ctx) -> list[Need]:
    """A preflight check's problems (builders/preflight.py) as unmet needs."""
    return [Need(what, False, f.evidence, f.reason, f.fix) for f in check(ctx) if f.is_problem]


def gpu_need(loaded, ctx) -> list[Need]:
    from envport.builders.preflight import check_gpus

    spec = loaded.spec
    if spec.resources.gpus <= 0:
        return []
    what = f"{spec.resources.gpus} GPU(s)" + (f" in {spec.sm_range[0]}..{spec.sm_range[1]}" if spec.sm_range else "")
    bad = findings(what, check_gpus, ctx)
    return bad[:1] or [Need(what, True, "nvidia-smi lists them" + (" inside sm_range" if spec.sm_range else ""))]


def base_of(loaded, site, target):
    """The resolved plan's BaseStep (image, bootstrap, bootstrap_from) as this site builds TARGET (a Target or
    its registry name): its recipe kind picks the plan."""
    from envport.plan.steps import BaseStep
    from envport.recipe.identity import resolve
    from envport.targets.registry import get

    chosen = get(target) if isinstance(target, str) else target
    return next(s for s in resolve(loaded, site, chosen).plan.steps if isinstance(s, BaseStep))


def base_need(loaded, site, target, probes: Probes, local_images: bool = False) -> Need:
    """The base image of TARGET's plan; LOCAL_IMAGES: a site's local SIF/sandbox may stand for it (apptainer)."""
    from envport.builders.apptainer.bootstrap import base_fix

    base = base_of(loaded, site, target)
    what = f"base image {base.image}"
    if local_images and base.bootstrap == "localimage":
        ok = os.path.exists(base.bootstrap_from)
        return Need(what, ok, f"local SIF/sandbox {base.bootstrap_from}" + ("" if ok else " is missing"),
                    "" if ok else "base_image_missing", "" if ok else f"fix local_images in sites/{site.name}.yaml")
    problem = probes.engine()
    if problem is not None:
        return Need(what, None, f"not checked: no docker engine answers ({problem})")
    if probes.has_image(base.image):
        return Need(what, True, "in the local docker engine")
    if site.registry and not base.image.startswith("envport/"):
        return Need(what, None, f"not local; site {site.name!r} pulls it at build time (the registry is not "
                    "checked here)")
    return Need(what, False, f"not in the local docker engine and site {site.name!r} cannot pull it",
                "base_image_missing", base_fix(base.image, site))


def engine_need(req: NeedsRequest, docker, ok_detail: str) -> list[Need]:
    """The docker client and engine, as preflight judges them for DOCKER (the docker target)."""
    from envport.builders.preflight import check_runtime

    ctx = preflight_context(NeedsRequest(req.loaded, req.site, req.root, req.probes), docker)
    return findings("docker engine", check_runtime, ctx) or [Need("docker engine", True, ok_detail)]


def ssh_need(req: NeedsRequest) -> Need:
    from envport.engines.ssh import is_unreachable

    host, site = req.host, req.site
    if shutil.which("ssh") is None:
        return Need(f"SSH host {host}", False, "no ssh client on PATH", "runtime_missing",
                    "apt-get install openssh-client")
    rc, out = req.probes.ssh(host, req.loaded.spec.name)
    if rc is None or is_unreachable(rc, out) or rc != 0:
        last = out.strip().splitlines()[-1] if out.strip() else f"ssh exited {rc}"
        return Need(f"SSH host {host}", False, f"does not answer: {last}", "ssh_unreachable",
                    f"check the host and its sshd, and hosts.{host} in sites/{site.name}.yaml")
    return Need(f"SSH host {host}", True, "answers (its python and disk are checked by the build there)")


def no_host_need(site) -> Need:
    return Need("SSH host", False, f"site {site.name!r} names no hosts", "no_ssh_host",
                f"add one under hosts: in sites/{site.name}.yaml")

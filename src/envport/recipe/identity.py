"""An env's identity: `env:<name>@<hash12>`, resolved once for (spec, site profile, target).

The hash is sha256 over everything that changes the built env: the plan
(every spec field that reaches a recipe and each shim file's sha256), the
renderer version, and the site fields that reach a recipe (CA bundle, pip
sources, wheelhouse use, base-image rewrites).  The description, comments,
witnesses and resources do not change the built env, so they do not change
its name.

Every built artefact names itself from `resolve()`: the docker image tag, the
SIF file, the hash a venv records, the ledger key, the Slurm job.  The target
chooses which plan is rendered (a host venv installs with the host's own pip
configuration, so the site's container-only steps do not reach its script),
but not the hash: one (spec, site) is one env on every backend, which is what
`envport parity` compares.  The committed images/ are the portable renderings
(`portable()`: no site) and say so in their header.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Optional

HASH_FORMAT = 1
CONTAINER_TARGETS = ("docker", "apptainer")
HOST_TARGETS = ("venv", "conda")


@dataclass(frozen=True)
class Identity:
    name: str
    hash: str
    site: Optional[str]  # None: the portable rendering (no site profile)

    @property
    def hash12(self) -> str:
        return self.hash[:12]

    @property
    def key(self) -> str:
        """The ledger key, and how every message names the env."""
        return f"env:{self.name}@{self.hash12}"

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.hash12}"

    @property
    def image_tag(self) -> str:
        return f"envport/{self.name}:{self.hash12}"

    @property
    def sif_name(self) -> str:
        return f"{self.name}-{self.hash12}.sif"


@dataclass(frozen=True)
class Resolved:
    identity: Identity
    plan: Any  # envport.plan.steps.Plan, as this target renders it
    target: str

    @property
    def hash(self) -> str:
        return self.identity.hash


def hash_inputs(loaded, site: Any = None) -> dict:
    """What the hash covers; site fields that reach a recipe enter through the plan (`apply_site`)."""
    from envport.plan.site import apply_site
    from envport.plan.steps import make_plan
    from envport.renderers import RENDERER_VERSION

    # A lock that fits the spec makes each phase its locked set, so the lock feeds the hash.
    plan = make_plan(loaded, locked=site.lock if site is not None else True)
    if site is not None:
        plan = apply_site(plan, site)
    return {"format": HASH_FORMAT, "renderer_version": RENDERER_VERSION, "plan": plan.canonical()}


def digest(inputs: dict) -> str:
    blob = json.dumps(inputs, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def content_hash(loaded, site: Any = None) -> str:
    return digest(hash_inputs(loaded, site))


def portable(loaded) -> Identity:
    """The identity of the committed rendering under images/ (no site profile)."""
    return Identity(loaded.spec.name, content_hash(loaded), None)


def resolve(loaded, site, target: str) -> Resolved:
    """The ONE place an env's identity and rendered plan are decided for a build, verify or run."""
    from envport.plan.site import apply_installer, apply_site
    from envport.plan.steps import make_plan

    identity = Identity(loaded.spec.name, content_hash(loaded, site), site.name)
    plan = make_plan(loaded, locked=site.lock)
    plan = apply_site(plan, site) if target in CONTAINER_TARGETS else apply_installer(plan, site)
    return Resolved(identity, plan, target)


def site_differences(loaded, site) -> list[str]:
    """The site fields that make the site's hash differ from the portable one, for `envport show`."""
    bare = hash_inputs(loaded)["plan"]
    sited = hash_inputs(loaded, site)["plan"]
    if bare == sited:
        return []
    out = []
    if site.ca_bundle:
        out.append(f"ca_bundle: {site.ca_bundle} (a CA step and PIP_CERT/SSL_CERT_FILE in the env)")
    if site.wheelhouse:
        out.append("wheelhouse: true (pip installs --no-index from the env's wheelhouse)")
    elif site.pip_source_args():
        out.append("pip: " + " ".join(site.pip_source_args()))
    for src, dst in sorted(site.base_images.items()):
        out.append(f"base_images: {src} -> {dst}")
    if site.installer != "pip":
        out.append(f"installer: {site.installer} (installs each pip phase; never in the env)")
    if site.bytecode_mode() != "build":
        out.append("bytecode: first-import (.py files compiled when first imported, not while installing)")
    return out or ["the site's plan differs (see `envport show --json` hash_inputs)"]

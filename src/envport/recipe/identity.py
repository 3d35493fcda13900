"""An env's identity: `env:<name>@<hash12>`, resolved once for (spec, site profile, target).

The hash is sha256 over everything that changes the built env: the plan
(every spec field that reaches a recipe and each shim file's sha256), the
renderer version, and the site fields that reach a recipe (CA bundle, pip
sources, wheelhouse use, base-image rewrites).  The description, comments,
witnesses and resources do not change the built env, so they do not change
its name.

Every built artefact names itself from `identify()` / `resolve()`: the docker
image tag, the SIF file, the hash a venv records, the ledger key, the Slurm
job.  The target's recipe kind (`Target.recipe`: docker, apptainer or shell)
chooses which plan is rendered: a container recipe gets the site's container
steps (the CA step, the site's pip sources, base-image rewrites); the shell
recipe installs with the host's own pip configuration, so those steps do not
reach its script.  This layer sits below targets/ and never names a target:
a new container target gets the container plan by declaring its recipe.  The
kind never changes the hash: one (spec, site) is one env on every backend,
which is what `envport parity` compares.  The committed images/ are the portable renderings
(`portable()`: no site) and say so in their header.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Optional

HASH_FORMAT = 1
HOST_RECIPE = "shell"  # the one recipe kind that installs on a host; every other kind is a container image


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


def recipe_kind(recipe) -> str:
    """RECIPE's kind: a Target (anything with `.recipe`) or the kind itself (docker, apptainer, shell).

    Anything else is refused with the fix: a plan is rendered for a recipe kind, and a target name that is
    not one (venv, conda, podman) would otherwise be a silent guess."""
    from envport.renderers import TARGETS as KINDS

    kind = getattr(recipe, "recipe", recipe)
    if kind not in KINDS:
        raise ValueError(f"a plan is rendered for a recipe kind ({', '.join(KINDS)}), not {kind!r}: pass the "
                         f"Target (envport.targets.registry.get(name)) or its `.recipe`")
    return kind


@dataclass(frozen=True)
class Resolved:
    identity: Identity
    loaded: Any
    site: Any
    recipe: Any  # a Target or a recipe kind; only the plan depends on it

    @property
    def hash(self) -> str:
        return self.identity.hash

    @cached_property
    def plan(self):
        """envport.plan.steps.Plan as the recipe kind renders it: the site's container steps for a container
        image, the host's installer for the shell recipe."""
        from envport.plan.site import apply_installer, apply_site
        from envport.plan.steps import make_plan

        plan = make_plan(self.loaded, locked=self.site.lock)
        return apply_installer(plan, self.site) if recipe_kind(self.recipe) == HOST_RECIPE else apply_site(plan, self.site)


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


def identify(loaded, site) -> Identity:
    """The env's identity on SITE: the same on every target (its recipe changes the plan, never the hash)."""
    return Identity(loaded.spec.name, content_hash(loaded, site), site.name)


def resolve(loaded, site, recipe) -> Resolved:
    """The ONE place an env's identity and rendered plan are decided for a build, verify or run.

    RECIPE is the target (a `Target`: its `.recipe` is read) or its recipe kind (docker, apptainer, shell);
    the plan is made when it is first asked for, so `resolve(...).identity` costs one hash."""
    return Resolved(identify(loaded, site), loaded, site, recipe)


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

"""The content hash: sha256 over everything that changes the built env.

That is the plan (which holds every spec field that reaches a recipe and each
shim file's sha256), the renderer version, and the site fields that reach a
recipe.  The description, comments, witnesses and resources do not change the
built env, so they do not change its name.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

HASH_FORMAT = 1


def hash_inputs(loaded, site: Any = None) -> dict:
    """Site fields that reach a recipe enter through the plan (`apply_site`)."""
    from envport.renderers import RENDERER_VERSION

    from .plan import make_plan

    plan = make_plan(loaded)
    if site is not None:
        from .site import apply_site
        plan = apply_site(plan, site)
    return {
        "format": HASH_FORMAT,
        "renderer_version": RENDERER_VERSION,
        "plan": plan.canonical(),
    }


def digest(inputs: dict) -> str:
    blob = json.dumps(inputs, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def content_hash(loaded, site: Any = None) -> str:
    return digest(hash_inputs(loaded, site))

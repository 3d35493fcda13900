"""The build's spec object: what envport says a build was made from, in one JSON shape.

A SIF carries it as `envport-spec.json` (builders/apptainer/builder.py writes it from the plan it built), and a
pushed image's provenance (targets/push.py `attach_provenance`) is made from the same object over the same plan, so the
two kinds of build cannot describe themselves differently (sif/provenance/slsa.py `facts_from_embedded` reads
both).
"""

from __future__ import annotations

from typing import Optional


def embedded_lock(plan) -> dict:
    """{"lock": [{"phase", "dists": [[name, version, sha256], ...]}, ...]} of PLAN's locked phases, for the
    spec object: an admin without the project judges the image against the lock it was built from (`envport
    inspect`); {} for a build without a lock."""
    from envport.plan.steps import PipStep

    phases = [{"phase": s.index, "dists": [[d.name, d.version, d.sha256] for d in s.locked]}
              for s in plan.steps if isinstance(s, PipStep) and s.locked]
    return {"lock": phases} if phases else {}


def spec_object(loaded, resolved, site_name: str, base_source: str, partition: Optional[dict] = None) -> dict:
    """The spec object of LOADED built as RESOLVED (recipe/identity.py: its hash and plan) on site SITE_NAME
    from BASE_SOURCE ("KIND IMAGE (sha256:ID)" where the base's id is known, else "KIND IMAGE"); PARTITION
    ({"sha256", "size"}) only for a SIF, whose partition it names."""
    from envport import __version__

    doc = {"envport_version": __version__, "name": loaded.spec.name, "hash": resolved.hash, "site": site_name,
           "base": base_source, "spec": loaded.spec.model_dump(mode="json"), **embedded_lock(resolved.plan)}
    if partition is not None:
        doc["partition"] = partition
    return doc

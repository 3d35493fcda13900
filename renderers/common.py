"""What every renderer shares: step titles and the envport-owned env vars and labels."""

from __future__ import annotations

import posixpath

from envport.plan import Plan, PipStep, step_marker
from envport.plan.steps import CONTAINER_UV, UV_VERSION

from .bytecode import COMPILE_SITE_PACKAGES


def title(step) -> str:
    """A one-line human title for a step, the same on every target."""
    kind = step.kind
    if kind == "base":
        return f"base {step.image}"
    if kind == "ca":
        return "site CA bundle"
    if kind == "system":
        return f"system packages ({len(step.packages)})"
    if kind == "python":
        return f"python {step.version}"
    if kind == "env":
        return f"env ({len(step.vars)} vars)"
    if isinstance(step, PipStep):
        first = ", ".join(step.packages[:3]) + (" ..." if len(step.packages) > 3 else "")
        return f"pip phase {step.index}: {first}"
    if kind == "files":
        return f"shim files ({len(step.files)})"
    if kind == "run":
        return f"run commands ({len(step.commands)})"
    if kind == "weights":
        return f"weight mount points ({len(step.mounts)})"
    if kind == "labels":
        return "labels and hash"
    raise ValueError(f"renderer does not know step kind {kind!r}")


def own_env(plan: Plan, hash_: str) -> list[tuple[str, str]]:
    return [("ENVPORT_HASH", hash_), ("ENVPORT_NAME", plan.name)]


def own_labels(plan: Plan, hash_: str) -> list[tuple[str, str]]:
    from . import RENDERER_VERSION
    return [("envport.hash", hash_), ("envport.name", plan.name), ("envport.renderer", RENDERER_VERSION)]


def context(plan: Plan, hash_: str) -> dict:
    steps = list(plan.steps)
    return {
        "plan": plan,
        "name": plan.name,
        "hash": hash_,
        "hash12": hash_[:12],
        "steps": [
            {"step": s, "kind": s.kind, "marker": step_marker(s), "title": title(s), "n": i, "total": len(steps)}
            for i, s in enumerate(steps, start=1)
        ],
        "own_env": own_env(plan, hash_),
        "own_labels": own_labels(plan, hash_),
        # uv installs the pip phases when the site says so (PipStep.installer); never part of the env.
        "uses_uv": any(isinstance(s, PipStep) and s.installer == "uv" for s in steps),
        "compile_py": COMPILE_SITE_PACKAGES,  # after a phase that compiles at build (compiles_after)
        "uv_version": UV_VERSION,
        "uv_path": CONTAINER_UV,
        "tools_dir": posixpath.dirname(CONTAINER_UV),  # the context's tools/ (uv, seedpip.py), mounted
    }

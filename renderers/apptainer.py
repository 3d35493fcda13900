"""apptainer target -> <name>.def.

The env is exported twice on purpose: in %post so the build's pip phases and
run commands see it, and in %environment so it is there at run time; Apptainer
keeps the two separate.  Shim files are copied by %files (before %post runs),
their modes set at their place in %post.

Build-only inputs (the site's CA bundle, the wheelhouse) are copied by %files
under BUILD_DIR and removed at the end of %post: apptainer mounts the host's
/tmp over the image's while %post runs, so anything %files put under /tmp is
invisible there (pip then finds no wheels), and a bind mount instead of a copy
makes that final `rm -rf` fail (RECIPES.md, measured).
"""

from __future__ import annotations

import dataclasses

from . import template
from .common import context

BUILD_DIR = "/opt/envport-build"
BUILD_CA = f"{BUILD_DIR}/ca-bundle.crt"
BUILD_WHEELHOUSE = f"{BUILD_DIR}/wheelhouse"
BUILD_UV = f"{BUILD_DIR}/uv"  # the site installer's binary (tools/uv in the context), removed with BUILD_DIR
# Where the plan's pip arguments (plan/site.py) expect the wheelhouse during a container build.
PLAN_WHEELHOUSE = "/tmp/envport-wheelhouse"


def filename(plan) -> str:
    return f"{plan.name}.def"


def bootstrap(base) -> tuple[str, str]:
    """(Bootstrap, From): the site's choice, else docker-daemon for envport/* bases (made on the
    host by `envport base`, in no registry) and docker (a registry pull) for the rest."""
    if base.bootstrap:
        return base.bootstrap, base.bootstrap_from or base.image
    return ("docker-daemon" if base.image.startswith("envport/") else "docker"), base.image


def _pip_args(step) -> list[str]:
    return [BUILD_WHEELHOUSE if a == PLAN_WHEELHOUSE else a for a in step.install_args()]


def render(plan, hash_: str) -> dict[str, str]:
    ctx = context(plan, hash_)
    steps = {s.kind: s for s in plan.steps}
    ctx["files"] = list(steps["files"].files) if "files" in steps else []
    ctx["labels"] = list(steps["labels"].labels) if "labels" in steps else []
    ca = steps.get("ca")
    ctx["ca"] = dataclasses.replace(ca, path=BUILD_CA) if ca else None
    ctx["wheelhouse"] = BUILD_WHEELHOUSE if any(s.kind == "pip" and s.uses_wheelhouse for s in plan.steps) else ""
    ctx["uv"] = BUILD_UV if ctx["uses_uv"] else ""
    ctx["build_dir"] = BUILD_DIR if ca or ctx["wheelhouse"] or ctx["uv"] else ""
    ctx["bootstrap"], ctx["bootstrap_from"] = bootstrap(plan.steps[0])
    # Each locked phase's requirements, where its `pip install -r` reads them (recipe/render.py
    # writes them into the build context as locks/<marker>.txt).
    ctx["locks"] = [(f"locks/{s.marker}.txt", s.lock_file) for s in plan.steps
                    if s.kind == "pip" and getattr(s, "locked", ())]
    ctx["pip_args"] = {s["n"]: _pip_args(s["step"]) for s in ctx["steps"] if s["kind"] == "pip"}
    ctx["venv"] = steps["python"].venv if "python" in steps else ""
    ctx["runtime_env"] = (list(steps["env"].vars) if "env" in steps else []) + ctx["own_env"]
    return {filename(plan): template("apptainer.def.j2").render(ctx)}

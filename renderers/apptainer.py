"""apptainer target -> <name>.def.

The env is exported twice on purpose: in %post so the build's pip phases and
run commands see it, and in %environment so it is there at run time; Apptainer
keeps the two separate.  Shim files are copied by %files (before %post runs),
their modes set at their place in %post.
"""

from __future__ import annotations

from . import template
from .common import context


def filename(plan) -> str:
    return f"{plan.name}.def"




def render(plan, hash_: str) -> dict[str, str]:
    ctx = context(plan, hash_)
    steps = {s.kind: s for s in plan.steps}
    ctx["files"] = list(steps["files"].files) if "files" in steps else []
    ctx["labels"] = list(steps["labels"].labels) if "labels" in steps else []
    ctx["ca"] = steps.get("ca")
    ctx["wheelhouse"] = any(s.kind == "pip" and s.uses_wheelhouse for s in plan.steps)
    ctx["venv"] = steps["python"].venv if "python" in steps else ""
    ctx["runtime_env"] = (list(steps["env"].vars) if "env" in steps else []) + ctx["own_env"]
    return {filename(plan): template("apptainer.def.j2").render(ctx)}

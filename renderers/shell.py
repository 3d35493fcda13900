"""shell target -> setup-venv.sh and setup-conda.sh (one template, two flavours).

Each pip phase is its own pip call, in order.  Every step after the
interpreter records a key that also covers every step before it, so a re-run
skips exactly the steps whose inputs and predecessors are unchanged.  Shim
files travel inside the script (base64, checked by sha256) because over SSH
the script arrives on stdin and nothing else comes with it.
"""

from __future__ import annotations

import base64
import textwrap

from . import template
from .common import context

FLAVOURS = ("venv", "conda")


def filename(flavour: str) -> str:
    return f"setup-{flavour}.sh"


def render(plan, hash_: str) -> dict[str, str]:
    ctx = context(plan, hash_)
    steps = {s.kind: s for s in plan.steps}
    ctx["keys"] = plan.step_keys()
    ctx["runtime_env"] = (list(steps["env"].vars) if "env" in steps else []) + ctx["own_env"]
    ctx["labels"] = list(steps["labels"].labels) if "labels" in steps else []
    files = steps["files"].files if "files" in steps else ()
    ctx["shim_b64"] = {f.dest: "\n".join(textwrap.wrap(base64.b64encode(f.data).decode(), 76)) for f in files}
    out = {}
    for flavour in FLAVOURS:
        ctx.update(flavour=flavour, script=filename(flavour))
        out[filename(flavour)] = template("setup.sh.j2").render(ctx)
    return out

"""shell target -> setup-venv.sh and setup-conda.sh (one template, two flavours).

Each pip phase is its own pip call, in order.  A re-run never continues a
half-made env: the env is present only when its recorded hash and its
installed distributions are what its build left (the script checks both with
`envcheck.py`, embedded), and otherwise every step is replayed into a fresh
env, so nothing an earlier version of the spec installed survives an edit.
The step keys stay in the `# envport-step` markers (the parity tests read
them).  Shim files and the env check travel inside the script (base64,
checked by sha256) because over SSH the script arrives on stdin and nothing
else comes with it.
"""

from __future__ import annotations

import base64
import json
import textwrap
from pathlib import Path

from . import template
from .common import context
from .envcheck import plan_pins

ENVCHECK_SOURCE = Path(__file__).with_name("envcheck.py")
SEEDPIP_SOURCE = Path(__file__).with_name("seedpip.py")

FLAVOURS = ("venv", "conda")


def filename(flavour: str) -> str:
    return f"setup-{flavour}.sh"


def render(plan, hash_: str) -> dict[str, str]:
    ctx = context(plan, hash_)
    steps = {s.kind: s for s in plan.steps}
    ctx["keys"] = plan.step_keys()
    ctx["runtime_env"] = (list(steps["env"].vars) if "env" in steps else []) + ctx["own_env"]
    ctx["pins_json"] = json.dumps([list(p) for p in plan_pins(plan)], separators=(",", ":"))
    ctx["envcheck_py"] = ENVCHECK_SOURCE.read_text(encoding="utf-8").rstrip("\n")
    ctx["seedpip_py"] = SEEDPIP_SOURCE.read_text(encoding="utf-8").rstrip("\n") if ctx["uses_uv"] else ""
    ctx["labels"] = list(steps["labels"].labels) if "labels" in steps else []
    files = steps["files"].files if "files" in steps else ()
    ctx["shim_b64"] = {f.dest: "\n".join(textwrap.wrap(base64.b64encode(f.data).decode(), 76)) for f in files}
    out = {}
    for flavour in FLAVOURS:
        ctx.update(flavour=flavour, script=filename(flavour))
        out[filename(flavour)] = template("setup.sh.j2").render(ctx)
    return out

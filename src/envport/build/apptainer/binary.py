"""The apptainer builder: `apptainer build <name>-<hash12>.sif <name>.def`.

The recipe is rendered from the site's plan into a temporary build context
(shim files, CA bundle, wheelhouse).  Where the binary is absent (as on
machines that cannot install it) the build is REFUSED with the fix, never
faked.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from envport.recipe.identity import resolve
from envport.spec.loader import Loaded
from envport.core.progress import Progress, tail
from envport.recipe.render import WHEELHOUSE_CONTEXT_NAME, render_plan
from envport.core.verdict import StepResult, Verdict

SIF_DIR = Path(".cache") / "sif"


def apptainer_binary() -> str | None:
    return shutil.which("apptainer") or shutil.which("singularity")



def build(loaded: Loaded, site, root: Path, *, rebuild: bool = False, progress: Progress) -> list[StepResult]:
    name = f"build {loaded.spec.name} (apptainer)"
    binary = apptainer_binary()
    if binary is None:
        return [StepResult(name, Verdict.REFUSED,
                           "no apptainer or singularity binary on this host; build on a host that has it "
                           "(or a cluster login node), or use --target docker and `apptainer pull docker-daemon:...`",
                           reason="no_apptainer")]
    resolved = resolve(loaded, site, "apptainer")
    hash_ = resolved.hash
    sif = root / SIF_DIR / resolved.identity.sif_name
    if sif.is_file() and not rebuild:
        return [StepResult(name, Verdict.PRESENT, str(sif), data={"sif": str(sif)})]
    plan = resolved.plan
    rendering = render_plan(plan, hash_, ("apptainer",), site=site.name)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="envport-apptainer-") as ctx:
        for rel, (data, mode) in rendering.files.items():
            path = Path(ctx) / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            os.chmod(path, mode)
        if any(s.kind == "pip" and s.uses_wheelhouse for s in plan.steps):
            shutil.copytree(site.wheelhouse_path(root, loaded.spec.name), Path(ctx) / WHEELHOUSE_CONTEXT_NAME)
        env = dict(os.environ)
        if site.apptainer.cachedir:
            env["APPTAINER_CACHEDIR"] = site.apptainer.cachedir
        if site.apptainer.tmpdir:
            env["APPTAINER_TMPDIR"] = site.apptainer.tmpdir
        sif.parent.mkdir(parents=True, exist_ok=True)
        partial = sif.with_suffix(".partial.sif")
        argv = [binary, "build", "--force"] + ([] if os.geteuid() == 0 else ["--fakeroot"]) + \
            [str(partial), f"{loaded.spec.name}.def"]
        progress(f"envport: [apptainer] {' '.join(argv)}")
        proc = subprocess.run(argv, cwd=ctx, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        return [StepResult(name, Verdict.FAILED, "apptainer build failed", lines=tail(proc.stdout + proc.stderr),
                           seconds=time.monotonic() - start)]
    partial.replace(sif)
    return [StepResult(name, Verdict.OK, str(sif), seconds=time.monotonic() - start, data={"sif": str(sif)})]

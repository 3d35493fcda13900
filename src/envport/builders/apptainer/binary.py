"""The apptainer route: `apptainer build <name>-<hash12>.sif <name>.def` where the binary exists.

The recipe is rendered from the site's plan into a temporary build context
(shim files, CA bundle, wheelhouse); `--from-docker` builds from
`docker-daemon://envport/<name>:<hash12>` instead.  `--fakeroot` when not
root; APPTAINER_CACHEDIR / APPTAINER_TMPDIR from the site profile.  The SIF
is written under a partial name and renamed only when apptainer succeeded
and its SBOM is in: the partial's primary partition is mounted read-only
(sif/sbom.sif_sbom, what `envport sbom FILE.sif` reads too) and the
CycloneDX SBOM of that content appended as SIF object 0x4009, as envport's
own builder does (sif/sbom.embed_sbom); `build --sign` signs after this, so
the signature covers it.  A partition that cannot be mounted here fails the
build [sbom_unreadable] and the partial is removed: no SIF without an SBOM.
No apptainer can be installed on this project's machines: tests/
test_sif_binary_route.py runs this route with a mock of apptainer's CLI
that writes a real SIF (siftool, mksquashfs).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

from envport.core.proc import run
from envport.core.progress import Progress, tail
from envport.core.verdict import StepResult, Verdict
from envport.sif.format import SifError, read_sif
from envport.sif.run import MountError
from envport.recipe.identity import resolve
from envport.recipe.render import WHEELHOUSE_CONTEXT_NAME, render_plan
from envport.sif.sbom import embed_sbom, mount_fix
from envport.builders.wheelhouse import wheelhouse_for
from envport.spec.loader import Loaded


def apptainer_binary() -> str | None:
    return shutil.which("apptainer") or shutil.which("singularity")


def build(loaded: Loaded, site, root: Path, sif: Path, *, from_docker: bool = False,
          progress: Progress) -> list[StepResult]:
    step = f"sif {sif.name}"
    binary = apptainer_binary()
    resolved = resolve(loaded, site, "apptainer")
    plan = resolved.plan
    start = time.monotonic()
    env = dict(os.environ)
    if site.apptainer.cachedir:
        env["APPTAINER_CACHEDIR"] = site.apptainer.cachedir
    if site.apptainer.tmpdir:
        env["APPTAINER_TMPDIR"] = site.apptainer.tmpdir
    made = None if from_docker else wheelhouse_for(loaded, site, root, plan, progress)
    if made is not None and not made.verdict.ok:
        return [made]
    done = [made] if made is not None else []
    sif.parent.mkdir(parents=True, exist_ok=True)
    partial = sif.parent / f".{sif.name}.partial-{os.getpid()}"
    with tempfile.TemporaryDirectory(prefix="envport-apptainer-") as ctx:
        if from_docker:
            source = f"docker-daemon://{resolved.identity.image_tag}"
        else:
            rendering = render_plan(plan, resolved.hash, ("apptainer",), site=site.name)
            for rel, (data, mode) in rendering.files.items():
                path = Path(ctx) / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
                os.chmod(path, mode)
            if any(s.kind == "pip" and s.uses_wheelhouse for s in plan.steps):
                shutil.copytree(site.wheelhouse_path(root, loaded.spec.name), Path(ctx) / WHEELHOUSE_CONTEXT_NAME)
            if any(s.kind == "pip" and s.installer == "uv" for s in plan.steps):
                from envport.builders.tools import stage_uv

                failed = stage_uv(Path(ctx), root, progress)
                if failed is not None:
                    return done + [failed]
            source = f"{loaded.spec.name}.def"
        argv = [binary, "build", "--force"] + ([] if os.geteuid() == 0 else ["--fakeroot"]) + \
            [str(partial), source]
        progress(f"envport: [apptainer] {' '.join(argv)}")
        # No timeout: a build's length is the spec's (its pip phases and run commands), not envport's.
        proc = run(argv, cwd=ctx, env=env, timeout=None)
    if not proc.ok:
        partial.unlink(missing_ok=True)
        return done + [StepResult(step, Verdict.FAILED, "apptainer build failed; no SIF was written",
                                  lines=tail(proc.text), seconds=time.monotonic() - start)]
    try:
        components = _embed_sbom(loaded, site, resolved.hash, partial, progress)
    except (SifError, MountError) as exc:
        partial.unlink(missing_ok=True)
        return done + [_unreadable(step, exc, time.monotonic() - start)]
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    partial.replace(sif)
    return done + [StepResult(step, Verdict.OK, str(sif), seconds=time.monotonic() - start,
                              data={"sif": str(sif), "route": "apptainer", "size": sif.stat().st_size,
                                    "sbom_components": components})]


def _embed_sbom(loaded: Loaded, site, hash_: str, partial: Path, progress: Progress) -> int:
    """The SBOM of what apptainer wrote, read from PARTIAL's own partition, appended to it (sif/sbom.embed_sbom,
    as envport's own builder does; the SIF header's created time as its timestamp); the number of components."""
    return embed_sbom(partial, loaded, site, hash_, read_sif(partial).created,
                      lambda line: progress(f"envport: [apptainer] {line}"))


def _unreadable(step: str, exc: Exception, seconds: float) -> StepResult:
    """FAILED [sbom_unreadable]: the SIF apptainer wrote could not be read for its SBOM (removed: none without)."""
    if isinstance(exc, MountError):
        fix = mount_fix("squashfuse and fuse3 are installed, so apptainer wrote a partition they cannot read: "
                        "check apptainer's own output, then build again")
    else:
        fix = "apptainer wrote no usable SIF: check its own output, then build again"
    return StepResult(step, Verdict.FAILED, f"the SBOM of the SIF apptainer wrote cannot be read ({exc}); every "
                      "SIF envport builds carries one, so no SIF was written", reason="sbom_unreadable",
                      lines=[f"fix: {fix}"], seconds=seconds)

"""The installer binaries a build uses but the env must not contain: uv, from its PyPI wheel.

uv is fetched the way every other distribution is (`pip download uv==<pin>`
through the host's pip configuration), never by a download script, and its
binary is taken out of the wheel once into .cache/tools/uv-<version>/uv.  A
container build mounts (docker) or copies and then deletes (.def) that file,
so `pip freeze` in the env is the lock's, with uv or without.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

from envport.core.files import write_atomic
from envport.core.proc import run
from envport.core.progress import Progress, tail
from envport.core.verdict import StepResult, Verdict
from envport.plan.steps import UV_VERSION

TOOLS_DIR = Path(".cache") / "tools"
UV_CONTEXT_NAME = "tools/uv"  # where a build context carries it (renderers expect this name)


def uv_path(root: Path) -> Path:
    return root / TOOLS_DIR / f"uv-{UV_VERSION}" / "uv"


def ensure_uv(root: Path, progress: Progress) -> tuple[Path | None, StepResult | None]:
    """(the uv binary, None), or (None, FAILED) when the wheel cannot be fetched or holds no binary."""
    path = uv_path(root)
    if path.is_file() and os.access(path, os.X_OK):
        return path, None
    progress(f"envport: [tools] uv=={UV_VERSION} from its PyPI wheel (once, into {path.parent})")
    with tempfile.TemporaryDirectory(prefix="envport-uv-") as tmp:
        proc = run([sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--no-deps",
                    "--only-binary=:all:", "-d", tmp, f"uv=={UV_VERSION}"], timeout=900)  # one wheel, ~15 MB
        wheels = sorted(Path(tmp).glob("uv-*.whl"))
        if not proc.ok or not wheels:
            return None, StepResult("tools uv", Verdict.FAILED, f"pip download uv=={UV_VERSION} failed",
                                    lines=tail(proc.text))
        with zipfile.ZipFile(wheels[0]) as zf:
            member = next((n for n in zf.namelist() if n.endswith(".data/scripts/uv")), None)
            if member is None:
                return None, StepResult("tools uv", Verdict.FAILED, f"{wheels[0].name} holds no uv binary "
                                        "(.data/scripts/uv); this platform may have no uv wheel")
            write_atomic(path, zf.read(member), mode=0o755)
    return path, None


def stage_uv(context: Path, root: Path, progress: Progress) -> StepResult | None:
    """Put the uv binary at context/tools/uv (a hard link when it can) and beside it seedpip.py, which a
    recipe runs to have uv seed its venv with ensurepip's own wheels; None when done."""
    from envport.renderers.shell import SEEDPIP_SOURCE

    path, failed = ensure_uv(root, progress)
    if failed:
        return failed
    dest = context / UV_CONTEXT_NAME
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(SEEDPIP_SOURCE, dest.parent / SEEDPIP_SOURCE.name)
    try:
        os.link(path, dest)
    except OSError:
        shutil.copy2(path, dest)
    return None

"""Verify a SIF: the spec's checks (and tests/images/) run inside it, with or without apptainer.

testinfra has no apptainer backend; `SifBackend` is one (~15 lines): each
command runs as `apptainer exec --cleanenv FILE /bin/sh -c CMD`, or, where
apptainer is absent, as `ch-run MNT -- /.singularity.d/actions/exec /bin/sh -c
CMD` on the SIF mounted with squashfuse for the whole session
(sif/run.py). Either way the image's env scripts are sourced, so env
vars are what the env's processes see after `%environment`. The labels are
the SIF's (inspect-metadata.json); the mount is gone afterwards, whatever
happened (a SIGTERM to envport becomes an interrupt, so the `finally` runs).

Before anything runs the SIF goes through the trust gate and `inspect`'s content checks
(sif_inspect.admitted): a damaged or tampered file is FAILED, not verified; what is mounted is the open
file the checks read (sif/run.py `mounted`), never the path again.
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import replace
import json
import secrets
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

from testinfra.backend import BACKENDS, base

from envport.builders import weights
from envport.builders.apptainer.builder import sif_path
from envport.core.proc import sigterm_interrupts
from envport.core.progress import Progress
from envport.core.untrusted import shown
from envport.core.verdict import StepResult, Verdict
from envport.sif import run as sif_run
from envport.sif.report import admitted
from envport.sif.format import SifError, sif_labels
from envport.sif.sbom import mount_fix
from envport.plan.site import Site
from envport.plan.steps import CONTAINER_VENV
from envport.recipe.identity import resolve
from envport.spec.loader import Loaded
from envport.verify.checks import Facts, spec_checks
from envport.verify.docker import default_junit, pytest_args
from envport.verify.plugin import VerifyPlugin
from envport.core.files import shown_path
from envport.verify.report import outcome, progress_line

TARGET = "apptainer"
CONNECTION = "envport-sif"
# token -> (runtime, the gated SIF, mountpoint, weight binds): what a `envport-sif://TOKEN` host runs in.
_TARGETS: dict[str, tuple[str, object, str, list]] = {}


class SifBackend(base.BaseBackend):
    NAME = CONNECTION

    def __init__(self, name: str, *args: Any, **kwargs: Any):
        self.name = name
        super().__init__(name, *args, **kwargs)

    def run(self, command: str, *args: str, **kwargs: Any) -> base.CommandResult:
        kind, gated, mnt, binds = _TARGETS[self.name]
        cmd = self.get_command(command, *args)
        argv = sif_run.apptainer_argv(gated, ["/bin/sh", "-c", cmd], binds=[(s, d, True) for s, d in binds]) \
            if kind == "apptainer" else sif_run.ch_run_argv(mnt, ["/bin/sh", "-c", cmd], binds=binds)
        out = self.run_local(" ".join(["%s"] * len(argv)), *argv)  # each word shell-quoted
        out.command = self.encode(cmd)
        return out


BACKENDS[CONNECTION] = f"{__name__}.SifBackend"


def _refused(step: str, reason: str, detail: str, fix: str, start: float) -> StepResult:
    return StepResult(step, Verdict.REFUSED, detail, reason=reason, lines=[f"fix: {fix}"],
                      seconds=time.monotonic() - start)


def verify(loaded: Loaded, site: Site, root: Path, *, sif: Optional[Path] = None, junit: Optional[Path] = None,
           progress: Progress, identity=None) -> StepResult:
    """Run every check of the spec (and tests/images/) inside the SIF; one StepResult.  IDENTITY: the one
    the SIF was built under, for a spec it embeds (loaded.embedded_in), which cannot be resolved here."""
    import os

    import pytest

    start = time.monotonic()
    spec = loaded.spec
    identity = identity or resolve(loaded, site, TARGET).identity
    path = Path(sif) if sif else sif_path(site, root, identity)
    step = f"verify {spec.name}@{identity.hash12} ({TARGET} {path.name})"
    kind = sif_run.runtime()
    absent = sif_run.missing_tools(kind)
    if absent:
        pkgs = " ".join(t.split("(")[1].rstrip(")") for t in absent)
        return _refused(step, "missing_tool", f"{', '.join(absent)} not found: verify runs inside the SIF "
                        "with ch-run where apptainer is absent", f"apt-get install {pkgs}", start)
    # A file that is not a usable SIF (cut short, crafted, corrupt) is broken, not a refusal: FAILED with its
    # reason, exit 1; the site's trust policy refuses (exit 3).
    checked = admitted(path, step=step, fix=("the file you named does not exist: check the path given to --sif"
                                            if sif else f"envport build {spec.name} --target apptainer"))
    if isinstance(checked, StepResult):
        return replace(checked, detail=shown(checked.detail), seconds=time.monotonic() - start)
    gated, _ = checked
    try:
        labels = sif_labels(gated.info)
    except SifError as exc:
        return StepResult(step, Verdict.FAILED, shown(exc.message), reason=exc.reason,
                          lines=[f"fix: envport inspect {path}"], seconds=time.monotonic() - start)
    os.environ.setdefault("USER", sif_run.ch_run_env()["USER"])  # ch-run refuses to start without it
    checks = spec_checks(loaded, identity.hash)
    junit = Path(junit) if junit else default_junit(root, spec.name)
    junit.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(6)
    out = io.StringIO()
    with sigterm_interrupts(), contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="envport-verify-"))
        spec_path, tests_root = loaded.path, root
        if loaded.embedded_in is not None:
            # pytest collects a file: the embedded spec written out, alone in a folder of ours, so no
            # conftest.py beside the SIF (a shared folder) and no tests/images/ of the cwd join the run.
            tests_root = Path(tmp) / "spec"
            tests_root.mkdir()
            spec_path = tests_root / f"{spec.name}.yaml"
            spec_path.write_text(json.dumps(spec.model_dump(mode="json"), indent=2, sort_keys=True) + "\n")
        plugin = VerifyPlugin(spec=spec, spec_path=spec_path, checks=checks, image=str(path),
                              make_facts=lambda: Facts(_host(token), labels=labels, venv=CONTAINER_VENV,
                                                       foreign_hash_ok=sif is not None),
                              on_result=progress_line(progress))
        try:
            mnt = "" if kind == "apptainer" else str(stack.enter_context(sif_run.mounted(gated)))
        except sif_run.MountError as exc:
            return StepResult(step, Verdict.FAILED, shown(exc.message), reason=exc.reason,
                              lines=[f"fix: {mount_fix(f'envport inspect {path}')}"], seconds=time.monotonic() - start)
        # The weights as every run sees them: this host's folders at the spec's paths (mount points
        # the image has: %post made them).
        binds = weights.existing_mounts(spec)
        _TARGETS[token] = (kind, gated, mnt, binds)
        stack.callback(_TARGETS.pop, token, None)
        progress(f"envport: [verify] {kind} on {path}" + (f" ({sif_run.reached_as(Path(mnt))})" if mnt else ""))
        args = pytest_args(tests_root, spec_path, [f"--hosts={CONNECTION}://{token}"], junit, Path(tmp))
        with contextlib.redirect_stdout(out):
            code = pytest.main(args, plugins=[plugin])
    results = plugin.results
    verdict, lines, summary = outcome(code, results, out.getvalue())
    junit_shown = shown_path(junit, root)
    data = {"sif": str(path), "runtime": kind, "sif_hash": labels.get("envport.hash"), "junit": junit_shown,
            "checks": results}
    return StepResult(step, verdict, f"{summary}; junit {junit_shown}", lines=lines,
                      seconds=time.monotonic() - start, data=data)


def _host(token: str):
    import testinfra

    return testinfra.get_host(f"{CONNECTION}://{token}")

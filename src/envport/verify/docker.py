"""Verify a docker image: start it, run the spec's checks (and tests/images/) with pytest, remove it.

The container is `docker run -d --network host IMAGE sleep infinity`, named
`envport-verify-<name>-<random>` and removed in a `finally` (a SIGTERM to
envport becomes an interrupt, so that runs too).  pytest runs in-process with
testinfra's `docker://` host; its own terminal output is kept out of
envport's, which prints one line per check and a verdict.
"""

from __future__ import annotations

import contextlib
import io
import os
import secrets
import tempfile
import time
from pathlib import Path
from typing import Optional

from envport.builders import weights
from envport.recipe.identity import resolve
from envport.spec.loader import Loaded
from envport.plan.steps import CONTAINER_VENV
from envport.plan.site import Site
from envport.core.proc import sigterm_interrupts
from envport.core.progress import Progress
from envport.core.verdict import StepResult, Verdict
from envport.verify.checks import Facts, spec_checks
from envport.verify.plugin import VerifyPlugin
from envport.core.files import shown_path
from envport.verify.report import outcome, progress_line

TARGET = "docker"
USER_TESTS = Path("tests") / "images"
REPORTS = Path("reports")
VERIFY_LABEL = "envport.verify"



def default_junit(root: Path, name: str) -> Path:
    return root / REPORTS / f"verify-{name}.xml"


def pytest_args(root: Path, spec_path: Path, hosts: list[str], junit: Path, workdir: Path) -> list[str]:
    """pytest's argv for a verify run of SPEC_PATH's checks on HOSTS (testinfra `--hosts=` arguments)."""
    ini = workdir / "pytest.ini"
    ini.write_text("[pytest]\n")  # the project's own pytest settings are not for env tests
    # No cache and no benchmark plugin: either would leave a folder (.pytest_cache, .benchmarks) in the
    # reader's directory, which for an admin running a pulled SIF is not a project of theirs.
    args = [str(spec_path), "-c", str(ini), "--rootdir", str(root), "-p", "no:cacheprovider", "-p", "no:benchmark",
            "-q", "--no-header", f"--junitxml={junit}", "-o", "junit_family=xunit2",
            "-o", "junit_suite_name=envport-verify", *hosts]
    if os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
        args += ["-p", "testinfra.plugin"]
    user_tests = root / USER_TESTS
    if user_tests.is_dir():
        args += [str(user_tests), "--confcutdir", str(user_tests)]
    else:
        args += ["--confcutdir", str(spec_path.parent)]
    return args


def verify(loaded: Loaded, site: Site, root: Path, *, image: Optional[str] = None, junit: Optional[Path] = None,
           progress: Progress) -> StepResult:
    """Run every check of the spec (and tests/images/) against the image; one StepResult."""
    import pytest

    import docker
    from envport.engines.docker import connect, get_image

    start = time.monotonic()
    spec = loaded.spec
    identity = resolve(loaded, site, TARGET).identity
    hash_ = identity.hash
    ref = image or identity.image_tag
    step = f"verify {spec.name}@{hash_[:12]} ({TARGET} {ref})"
    client, refusal = connect(step)
    if client is None:
        return refusal
    img = get_image(client, ref)
    if img is None:
        fix = f"build it: `envport build {spec.name} --target docker`" if image is None else \
            "check the tag (`docker images`) or build it"
        return StepResult(step, Verdict.REFUSED, f"image {ref} is not in the engine; {fix}", reason="image_missing")

    checks = spec_checks(loaded, hash_)
    junit = Path(junit) if junit else default_junit(root, spec.name)
    junit.parent.mkdir(parents=True, exist_ok=True)
    name = f"envport-verify-{spec.name}-{secrets.token_hex(4)}"

    say = progress_line(progress)

    def make_facts() -> Facts:
        import testinfra

        return Facts(testinfra.get_host(f"docker://{name}"), labels=dict(img.labels or {}), venv=CONTAINER_VENV,
                     foreign_hash_ok=image is not None)

    plugin = VerifyPlugin(spec=spec, spec_path=loaded.path, checks=checks, make_facts=make_facts, image=ref,
                          on_result=say)
    out = io.StringIO()
    container = None
    with sigterm_interrupts():
        try:
            progress(f"envport: [verify] starting {name} from {ref} (network {site.network})")
            # The weights as every run sees them: this host's folders, read-only at the spec's paths.
            mounts = {host: {"bind": path, "mode": "ro"}
                      for host, path in weights.existing_mounts(spec)}
            container = client.containers.run(
                img.id, entrypoint=["sleep", "infinity"], detach=True, name=name,
                network_mode=site.network, labels={VERIFY_LABEL: spec.name}, volumes=mounts)
            with tempfile.TemporaryDirectory(prefix="envport-verify-") as tmp, contextlib.redirect_stdout(out):
                args = pytest_args(root, loaded.path, [f"--hosts=docker://{name}"], junit, Path(tmp))
                code = pytest.main(args, plugins=[plugin])
        finally:
            if container is not None:
                with contextlib.suppress(docker.errors.APIError):
                    container.remove(force=True)
    seconds = time.monotonic() - start
    results = plugin.results
    verdict, lines, summary = outcome(code, results, out.getvalue())
    size = img.attrs.get("Size", 0)
    junit_shown = shown_path(junit, root)
    data = {"image": ref, "image_id": img.id, "size": size, "junit": junit_shown,
            "image_hash": (img.labels or {}).get("envport.hash"), "checks": results}
    result = StepResult(step, verdict, f"{summary}; junit {junit_shown}", lines=lines, seconds=seconds, data=data)
    return result

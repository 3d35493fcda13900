"""One env, one identity: resolve demo-cpu once and find the same `env:<name>@<hash12>` everywhere it is named.

The image tag, the SIF name, the hash the venv's setup script records, the
ledger key and the Slurm job script must all come from recipe.identity.resolve
for the same (spec, site); the committed images/ carry the portable (no-site)
hash and say so in their header.
"""

from __future__ import annotations

import json

from envport.builders import shell
from envport.plan.site import load_site
from envport.recipe.identity import portable, resolve
from envport.recipe.render import render_plan
from envport.report import ledger
from envport.spec.loader import load_spec

from .support import ENV_NAME, run_envport


def test_every_artefact_carries_the_resolved_identity(project, tmp_path):
    loaded = load_spec(ENV_NAME, project)
    site = load_site("local", project)
    ident = resolve(loaded, site, "docker").identity
    assert ident.key == f"env:{ENV_NAME}@{ident.hash[:12]}"

    # the target chooses the rendered plan, never the hash
    assert {resolve(loaded, site, t).hash for t in ("docker", "apptainer", "venv", "conda")} == {ident.hash}

    # envport show names the same build
    shown = json.loads(run_envport("show", ENV_NAME, "--json", root=project).stdout)
    assert (shown["site"]["hash"], shown["site"]["image"], shown["site"]["sif"], shown["site"]["key"]) == \
        (ident.hash, f"envport/{ENV_NAME}:{ident.hash12}", f"{ENV_NAME}-{ident.hash12}.sif", ident.key)

    # the docker build's Dockerfile labels it, the .def's %labels and %environment carry it
    built = render_plan(resolve(loaded, site, "docker").plan, ident.hash, ("docker", "apptainer"), site="local")
    dockerfile = built.files["Dockerfile"][0].decode()
    deffile = built.files[f"{ENV_NAME}.def"][0].decode()
    assert f'envport.hash="{ident.hash}"' in dockerfile
    assert f"envport.hash {ident.hash}" in deffile and f"export ENVPORT_HASH={ident.hash}" in deffile
    assert f"({ENV_NAME}@{ident.hash12}, as site 'local' builds it)" in dockerfile.splitlines()[0]

    # the venv's setup script records the same hash in the env
    script = shell.script_text(resolve(loaded, site, "shell"), "venv")
    assert f"ENVPORT_HASH={ident.hash}" in script and ident.hash12 in script.splitlines()[1]

    # the Slurm job script for the docker target runs the same image
    job = json.loads(run_envport("slurm", "submit", ENV_NAME, "--cluster", "local", "--target", "docker",
                                 "--dry-run", "--json", root=project).stdout)
    assert job["hash"] == ident.hash and ident.image_tag in job["script"]

    # the ledger key (the ledger lives in the user's state dir, keyed by this project copy)
    from envport.core.verdict import StepResult, Verdict

    rec = ledger.record(project, loaded.spec, kind="build", target="venv", hash_=ident.hash,
                        result=StepResult("build", Verdict.OK, "test"))
    assert rec["key"] == ident.key


def test_committed_images_are_the_portable_rendering_and_say_so(project):
    loaded = load_spec(ENV_NAME, project)
    bare = portable(loaded)
    header = (project / "images" / ENV_NAME / "Dockerfile").read_text().splitlines()[0]
    assert f"({ENV_NAME}@{bare.hash12}, portable: no site profile" in header
    sited = resolve(loaded, load_site("local", project), "docker").identity
    # the local site injects a CA bundle and a wheelhouse: a different env, a different name
    assert sited.hash != bare.hash
    shown = run_envport("show", ENV_NAME, root=project).stdout
    assert bare.ref in shown and sited.ref in shown and "ca_bundle" in shown


def test_a_new_container_target_gets_the_container_plan(project, tmp_path, monkeypatch):
    """A stand-in container target, registered here for this test only (no such backend exists): declaring
    `recipe = "docker"` is all it does, and it gets the container plan: the site's CA step and pip sources.

    Before, recipe.identity chose the plan from a hard-coded ("docker", "apptainer") tuple, so any other
    container target got the host plan (no CA step, no site index) under the same hash."""
    import sys
    import types

    from envport.plan.steps import CaStep
    from envport.targets import registry
    from envport.targets.base import Target

    class StandIn(Target):
        name = "standin"
        recipe = "docker"
        summary = "a test's stand-in container target"

    module = types.ModuleType("envport.targets.standin")
    module.TARGET = StandIn()
    monkeypatch.setitem(sys.modules, "envport.targets.standin", module)
    monkeypatch.setattr(registry, "NAMES", (*registry.NAMES, "standin"))
    registry.get.cache_clear()
    try:
        standin = registry.get("standin")
    finally:
        registry.get.cache_clear()
    site_file = tmp_path / "standin.yaml"
    site_file.write_text("name: standin\nnetwork: host\nregistry: true\nwheelhouse: false\n"
                         "ca_bundle: /etc/ssl/certs/ca-certificates.crt\n"
                         "pip:\n  index_url: https://pypi.example.org/simple\n")
    site, loaded = load_site(str(site_file), project), load_spec(ENV_NAME, project)

    plan = resolve(loaded, site, standin).plan
    assert any(isinstance(s, CaStep) for s in plan.steps), "the stand-in got no CA step"
    pips = [s for s in plan.steps if s.kind == "pip"]
    assert pips and all("https://pypi.example.org/simple" in s.site_args for s in pips), [s.site_args for s in pips]
    assert plan == resolve(loaded, site, "docker").plan
    # the host recipe keeps the host's own pip configuration: no CA step
    assert not any(isinstance(s, CaStep) for s in resolve(loaded, site, "shell").plan.steps)
    assert resolve(loaded, site, standin).hash == resolve(loaded, site, "shell").hash


def test_a_plan_for_a_name_that_is_not_a_recipe_kind_says_the_fix(project):
    import pytest

    resolved = resolve(load_spec(ENV_NAME, project), load_site("local", project), "venv")
    assert resolved.identity.key.startswith(f"env:{ENV_NAME}@")  # the identity is the target's to ignore
    with pytest.raises(ValueError, match=r"recipe kind \(docker, apptainer, shell\), not 'venv'.*registry.get"):
        assert resolved.plan is None  # raises first

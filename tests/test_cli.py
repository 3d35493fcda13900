"""The CLI's contract: the committed JSON Schema is current and describes every spec,
specs point editors at it, and start-up stays light."""

from __future__ import annotations

import json
import subprocess
import sys

import jsonschema
import pytest
import yaml

from envport.commands.render import TARGETS as CLI_TARGETS
from envport.spec.loader import merge
from envport.renderers import TARGETS

from .support import REPO, run_envport

SPECS = sorted((REPO / "specs").glob("*.yaml"))


def test_committed_schema_is_current():
    proc = run_envport("schema", "--check", root=REPO, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_schema_drift_is_exit_1(project):
    schema = project / "docs" / "spec.schema.json"
    schema.write_text(schema.read_text().replace('"title": "envport env spec"', '"title": "stale"'))
    proc = run_envport("schema", "--check", root=project, timeout=60)
    assert proc.returncode == 1 and "out of date" in proc.stderr
    assert run_envport("schema", root=project, timeout=60).returncode == 0
    assert run_envport("schema", "--check", root=project, timeout=60).returncode == 0


@pytest.mark.parametrize("path", SPECS, ids=[p.stem for p in SPECS])
def test_spec_points_editors_at_the_schema_and_validates_against_it(path):
    first = path.read_text().splitlines()[0]
    assert first == "# yaml-language-server: $schema=../docs/spec.schema.json"
    schema = json.loads((REPO / "docs" / "spec.schema.json").read_text())
    data = yaml.safe_load(path.read_text())
    while "extends" in data:  # a child may leave base/python to its parent: check what it merges to
        parent = yaml.safe_load((REPO / "specs" / f"{data['extends']}.yaml").read_text())
        merged = {k: v for k, v in merge(parent, data).items() if k != "extends"}
        data = {**merged, **({"extends": parent["extends"]} if "extends" in parent else {})}
    jsonschema.validate(data, schema)


def test_schema_rejects_a_typo_like_the_loader():
    schema = json.loads((REPO / "docs" / "spec.schema.json").read_text())
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"name": "x", "base": "debian:bookworm", "python": "3.11", "pip_phase": []}, schema)


def test_render_command_knows_every_renderer():
    assert CLI_TARGETS == TARGETS


def test_help_imports_nothing_heavy():
    code = ("import sys; from envport.cli import build_parser; build_parser(); "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'pydantic', 'jinja2', 'docker', 'torch', "
            "'spython', 'yaml', 'testinfra', 'http'}), "
            "sorted(m for m in sys.modules if m.startswith(('envport.engines', 'envport.build.docker', 'envport.build.apptainer', 'envport.report', 'envport.verify', 'envport.witness.run', 'envport.witness.launchers'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    # nothing heavy, and no engine, builder or report module: registering a command must stay cheap
    assert out.strip() == "[] []"

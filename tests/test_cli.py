"""The CLI's contract: the committed JSON Schema is current and describes every spec,
specs point editors at it, and start-up stays light."""

from __future__ import annotations

import json
import os
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
            "sorted(m for m in sys.modules if m.startswith(('envport.engines', 'envport.builders.docker', 'envport.builders.apptainer', 'envport.report', 'envport.verify', 'envport.witness.run', 'envport.witness.plan', 'envport.witness.census', 'envport.witness.judge', 'envport.witness.launchers'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    # nothing heavy, and no engine, builder or report module: registering a command must stay cheap
    assert out.strip() == "[] []"


# ---- one spec extension everywhere; images/ has no leftovers ------------------------------------

def test_yml_specs_are_refused_everywhere(project):
    """`.yml` is refused by every command (one name -> one file); `--all` never skips one silently."""
    yml = project / "specs" / "other.yml"
    yml.write_text((project / "specs" / "demo-cpu.yaml").read_text().replace("name: demo-cpu", "name: other"))
    for args in (("validate", "--all"), ("render", "--all", "--check"), ("render", "--all"),
                 ("validate", str(yml)), ("render", str(yml))):
        proc = run_envport(*args, root=project, timeout=120)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert f"{yml}: <top>: spec files must end in .yaml" in proc.stderr, (args, proc.stderr)
    assert not (project / "images" / "other").exists()
    # A parent that exists only as .yml: the extends error says to rename it.
    (project / "specs" / "child.yaml").write_text("name: child\nextends: other\n")
    proc = run_envport("validate", "child", root=project, timeout=120)
    assert proc.returncode == 2 and "rename other.yml to other.yaml" in proc.stderr, proc.stderr


def test_stale_images_dirs_fail_render_check_and_render_all_removes_them(project):
    assert run_envport("render", "--all", root=project, timeout=300).returncode == 0
    gone = project / "images" / "gone"
    gone.mkdir()
    (gone / "Dockerfile").write_text("FROM scratch\n")
    proc = run_envport("render", "--all", "--check", root=project, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "drift: images/gone/ (stale: run `envport render --all` or `git rm -r images/gone`)" in proc.stderr
    # Checking one spec says nothing about other dirs.
    assert run_envport("render", "demo-cpu", "--check", root=project, timeout=120).returncode == 0
    proc = run_envport("render", "--all", root=project, timeout=300)
    assert proc.returncode == 0 and "removed images/gone/ (no spec)" in proc.stdout, proc.stdout
    assert not gone.exists()
    assert run_envport("render", "--all", "--check", root=project, timeout=300).returncode == 0


def test_render_check_ignores_a_ledger_left_by_an_older_envport(project):
    assert run_envport("render", "--all", root=project, timeout=300).returncode == 0
    (project / "images" / "demo-cpu" / "ledger.json").write_text('{"env": "demo-cpu", "records": []}\n')
    assert run_envport("render", "--all", "--check", root=project, timeout=300).returncode == 0


# ---- spec strictness: allow_env, weight env, profiles through the same YAML helper ---------------

def _spec(tmp_path, text):
    from envport.spec.loader import load_spec

    (tmp_path / "specs").mkdir(exist_ok=True)
    (tmp_path / "specs" / "x.yaml").write_text("name: x\nbase: debian:bookworm-slim\npython: '3.11'\n" + text)
    return load_spec("x", tmp_path)


def test_allow_env_lets_a_spec_set_pythonpath_and_nothing_else(tmp_path):
    from envport.core.errors import SpecError

    loaded = _spec(tmp_path, "allow_env: [PYTHONPATH]\nenv: {PYTHONPATH: /opt/app}\n")
    assert loaded.spec.env == {"PYTHONPATH": "/opt/app"}
    with pytest.raises(SpecError) as exc:
        _spec(tmp_path, "allow_env: [PATH]\nenv: {PATH: /x}\n")
    assert {p.field for p in exc.value.problems} == {"allow_env[0]", "env.PATH"}


def test_a_weight_dir_cannot_point_a_build_breaking_variable(tmp_path):
    from envport.core.errors import SpecError

    with pytest.raises(SpecError) as exc:
        _spec(tmp_path, "weight_dirs:\n  w: {path: /w, env: HOME}\n")
    assert [(p.line, p.field) for p in exc.value.problems] == [(5, "weight_dirs.w.env")]


def test_site_and_cluster_profiles_read_through_the_same_hardened_helper(tmp_path):
    from envport.core.errors import SpecError
    from envport.plan.site import load_site
    from envport.plan.cluster import load_cluster

    site = tmp_path / "site.yaml"
    site.write_text("name: s\nnetwrok: host\nhosts: &h {}\n")
    with pytest.raises(SpecError) as exc:
        load_site(str(site), tmp_path)
    assert str(exc.value.problems[0]).startswith(f"{site}:3: <top>: YAML anchor &h is not supported")
    site.write_text("name: s\nnetwrok: host\n")
    with pytest.raises(SpecError) as exc:
        load_site(str(site), tmp_path)
    assert "did you mean 'network'?" in exc.value.problems[0].message
    cluster = tmp_path / "c.yaml"
    cluster.write_text("name: c\npartition: debug\ntime: *t\n")
    with pytest.raises(SpecError) as exc:
        load_cluster(str(cluster), None)
    assert str(exc.value.problems[0]).startswith(f"{cluster}:3: <top>: YAML alias *t is not supported")
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)  # opened blocking, this would hang
    for load in (lambda: load_cluster(str(fifo), None), lambda: load_site(str(fifo), tmp_path)):
        with pytest.raises(SpecError) as exc:
            load()
        assert str(exc.value.problems[0]).startswith(f"{fifo}: <top>: is not a regular file")


def test_a_reader_that_goes_away_is_exit_141_without_a_traceback():
    """`envport show demo-cpu | head -1`: the reader is gone before envport writes (its end of the pipe is
    closed before envport starts, so every write gets EPIPE); no BrokenPipeError traceback."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run([sys.executable, "-m", "envport", "-C", str(REPO), "show", "demo-cpu"],
                              stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write_end)
    assert proc.returncode == 141, proc.stderr
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr

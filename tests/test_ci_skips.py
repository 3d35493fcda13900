""".ci/check_skips.py and tests/allowed_skips.py: CI fails on a skip nobody declared, and says what it allowed.

The JUnit reports here are written by a real pytest run (a throwaway test file in
tmp_path), so the checker reads what pytest really writes.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from .allowed_skips import ALLOWED, Allowed, allowed
from .support import REPO

CHECKER = REPO / ".ci" / "check_skips.py"

SAMPLE = '''
import pytest

def test_runs():
    pass

def test_gpu():
    pytest.skip("needs a GPU: nvidia-smi finds none")

def test_undeclared():
    pytest.skip("docker engine: no answer")
'''


def _junit(tmp_path: Path, source: str) -> Path:
    """tmp_path/tests/test_sample.py run by pytest with tmp_path as its rootdir, as CI runs the checkout."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_sample.py").write_text(source)
    report = tmp_path / "junit.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", "/dev/null",
                    f"--rootdir={tmp_path}", f"--junitxml={report}", "tests/test_sample.py"], cwd=tmp_path,
                   capture_output=True, text=True, timeout=120)
    assert report.is_file()
    return report


def _check(report: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CHECKER), str(report), str(report.parent)], capture_output=True,
                          text=True, timeout=60)


def test_an_undeclared_skip_fails_and_is_named_with_its_reason(tmp_path):
    proc = _check(_junit(tmp_path, SAMPLE))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "3 tests, 2 skipped, 1 of them allowed" in proc.stdout
    assert "allowed 1: GPU tests" in proc.stdout
    assert "SKIPPED tests/test_sample.py::test_undeclared: docker engine: no answer" in proc.stderr
    assert "test_gpu" not in proc.stderr


def test_only_declared_skips_pass(tmp_path):
    proc = _check(_junit(tmp_path, SAMPLE.replace('pytest.skip("docker engine: no answer")', "pass")))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 tests, 1 skipped, 1 of them allowed" in proc.stdout


def test_a_report_without_tests_or_without_a_file_fails(tmp_path):
    empty = tmp_path / "empty.xml"
    empty.write_text('<testsuites><testsuite name="pytest" tests="0"/></testsuites>')
    assert _check(empty).returncode == 1
    assert _check(tmp_path / "missing.xml").returncode == 2


def test_an_entry_needs_both_the_test_and_the_reason():
    entry = Allowed(tests="tests/test_docker_build.py::test_without_buildkit_*", reason=r"no legacy client",
                    why="an example")
    assert entry.matches("tests/test_docker_build.py::test_without_buildkit_the_legacy_builder", "no legacy client here")
    assert not entry.matches("tests/test_other.py::test_x", "no legacy client here")  # same reason, another test
    assert not entry.matches("tests/test_docker_build.py::test_without_buildkit_x", "docker engine: no answer")
    assert allowed("tests/test_sif_build.py::test_x", "apptainer not installed (no Debian 12 package)") is not None
    assert allowed("tests/test_sif_build.py::test_x", "docker engine: no answer") is None
    assert all(a.why for a in ALLOWED)


def test_slurm_up_is_one_script_that_says_why_not(tmp_path):
    """The definition of "Slurm is up" the services script and the fixture share: a missing slurm.conf is
    not up, with the reason, and nothing else is asked."""
    proc = subprocess.run(["bash", str(REPO / ".ci" / "services" / "slurm-up.sh")], capture_output=True, text=True,
                          timeout=60, env={"PATH": "/usr/bin:/bin", "SLURM_CONF": str(tmp_path / "slurm.conf")})
    assert proc.returncode == 1 and proc.stdout == ""
    assert f"{tmp_path / 'slurm.conf'} does not exist" in proc.stderr
    services = (REPO / "tests" / "services.py").read_text()
    start = (REPO / ".ci" / "services" / "slurm.sh").read_text()
    assert "slurm-up.sh" in services and "slurm-up.sh" in start

""".ci/slowest.py, the table every .ci/run prints: the slowest tests and the time per file, from a JUnit report.

The report is the one pytest itself writes (a real `pytest --junitxml` run of three tiny tests in a
tmp dir, their times then set in the XML so the order is known without sleeping)."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from .support import REPO

SLOWEST = REPO / ".ci" / "slowest.py"


def junit(tmp_path: Path, times: dict[str, float]) -> Path:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text("def test_fast():\n    pass\n\ndef test_slow():\n    pass\n")
    (tmp_path / "tests" / "test_b.py").write_text("def test_mid():\n    assert False\n")
    report = tmp_path / "junit.xml"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}",
                           "tests"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # test_mid fails on purpose
    tree = ET.parse(report)
    for case in tree.getroot().iter("testcase"):
        case.set("time", str(times[case.get("name")]))
    tree.write(report)
    return report


def test_the_slowest_come_first_and_each_file_sums_its_tests(tmp_path):
    report = junit(tmp_path, {"test_fast": 0.5, "test_slow": 30.0, "test_mid": 12.0})
    proc = subprocess.run([sys.executable, str(SLOWEST), str(report), "2", str(tmp_path)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "3 tests, 42s in the JUnit report; the 2 slowest:", lines
    rows = [line.split() for line in lines[2:4]]
    assert [r[0] for r in rows] == ["30.0", "12.0"]
    assert rows[0][2:] == ["tests/test_a.py::test_slow"]
    assert rows[1][2:] == ["tests/test_b.py::test_mid", "[failed]"]  # a failure is named as one
    files = lines[lines.index("time per test file (2 files):") + 2:]
    assert [f.split() for f in files] == [["30.5", "71.8%", "2", "tests/test_a.py"],
                                          ["12.0", "28.2%", "1", "tests/test_b.py"]]


def test_a_missing_report_exits_2_and_names_it(tmp_path):
    proc = subprocess.run([sys.executable, str(SLOWEST), str(tmp_path / "none.xml")], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and "none.xml" in proc.stderr, (proc.returncode, proc.stderr)


def test_ci_run_prints_it_after_pytest_and_pytest_still_decides():
    run = (REPO / ".ci" / "run").read_text()
    table = run.index("python3 .ci/slowest.py reports/junit.xml")
    assert run.index("python3 -m pytest") < table < run.index('if [ "$rc" -eq 5 ]')
    assert "slowest.py reports/junit.xml 25 ||" in run  # its own exit never ends the run (set -e is off there)

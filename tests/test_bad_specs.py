"""Malformed specs are refused by the real CLI: exit 2, every problem named, nothing written.

Each case is one file in tests/bad_specs/ and carries its own expectations in
its first lines, so adding a case is adding a file:

    # expect: 10 pip_phases[2][0]              a problem at line 10 of this file, field pip_phases[2][0]
    # expect: - <top>                          a problem without a line (an empty file)
    # expect: specs/cycle-b.yaml:3 extends     a problem reported against another file (a parent),
                                               relative to the project root
    # expect-message: is not a valid requirement   text that must appear in the output

The printed form is `FILE:LINE: FIELD: message (fix: ...)`, FILE the absolute
path of the spec that has the problem.  Every `# expect:` line must match one
printed problem and the number of problems must equal the number of `# expect:`
lines, so a case that trips an unrelated check fails too.

The cases run in a throwaway copy of the project (specs/ and images/) that
also holds the parents the `extends` cases need (tests/bad_specs/files/parents/
is copied into its specs/) and `specs/files/escape.py`, a symlink out of specs/
made here because a committed symlink does not survive every checkout.
Both `envport validate PATH` and `envport render PATH` must refuse each case,
and the bytes, modes and names under images/ must be the same afterwards.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from .support import REPO

CASES_DIR = REPO / "tests" / "bad_specs"
PARENTS_DIR = CASES_DIR / "files" / "parents"
CASE_FILES = sorted(CASES_DIR.glob("*.yaml"))

EXPECT_RE = re.compile(r"^# expect: (?:(?P<file>[^\s:]+\.yaml):)?(?P<line>\d+|-) (?P<field>.+)$")
MESSAGE_RE = re.compile(r"^# expect-message: (?P<text>.+)$")
SUMMARY_RE = re.compile(r"^envport: (\d+) problem\(s\) in (\d+) spec file\(s\); nothing was written$", re.M)


@dataclass
class Expected:
    file: str | None  # relative to the project root; None: the case's own file
    line: int | None
    field: str


@dataclass
class Case:
    path: Path
    expects: list[Expected] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.path.stem


def read_case(path: Path) -> Case:
    case = Case(path)
    # latin-1 never fails: a case may hold bytes that are not UTF-8 on purpose.
    for line in path.read_bytes().decode("latin-1").splitlines():
        if not line.startswith("# expect"):
            break
        if m := EXPECT_RE.match(line):
            case.expects.append(Expected(m["file"], None if m["line"] == "-" else int(m["line"]), m["field"]))
        elif m := MESSAGE_RE.match(line):
            case.messages.append(m["text"])
        else:
            raise AssertionError(f"{path.name}: malformed expectation line {line!r}")
    return case


CASES = [read_case(p) for p in CASE_FILES]


def test_enough_cases_each_with_expectations():
    assert len(CASES) >= 30
    for case in CASES:
        assert case.expects, f"{case.path.name} declares no `# expect:` line"


def make_project(dest: Path) -> Path:
    for d in ("specs", "images"):
        shutil.copytree(REPO / d, dest / d, symlinks=True)
    for parent in PARENTS_DIR.glob("*.yaml"):
        shutil.copy2(parent, dest / "specs" / parent.name)
    for case in CASE_FILES:
        shutil.copy2(case, dest / "specs" / case.name)
    (dest / "outside.py").write_text("print('outside specs/')\n")
    os.symlink("../../outside.py", dest / "specs" / "files" / "escape.py")
    return dest.resolve()


@pytest.fixture(scope="module")
def bad_project(tmp_path_factory) -> Path:
    return make_project(tmp_path_factory.mktemp("bad-specs"))


def snapshot(tree: Path) -> dict[str, tuple]:
    """Every entry under `tree` (hidden ones too): kind, mode and bytes."""
    out: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(tree):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            st = path.lstat()
            rel = str(path.relative_to(tree))
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(path))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", stat.S_IMODE(st.st_mode))
            else:
                out[rel] = ("file", stat.S_IMODE(st.st_mode), path.read_bytes())
    return out


def run_many(cwd: Path, *commands: list[str]) -> list[subprocess.CompletedProcess]:
    """Run several `envport` commands at once (they only read), the way a user does."""
    procs = [(args, subprocess.Popen([sys.executable, "-m", "envport", *args], cwd=cwd, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)) for args in commands]
    done = []
    for args, p in procs:
        out, err = p.communicate(timeout=120)
        done.append(subprocess.CompletedProcess(args, p.returncode, out, err))
    return done


def problem_prefix(root: Path, case: Case, exp: Expected) -> str:
    path = root / exp.file if exp.file else root / "specs" / case.path.name
    where = f"{path}:{exp.line}" if exp.line is not None else f"{path}"
    return f"{where}: {exp.field}: "


def assert_reported(root: Path, case: Case, output: str) -> None:
    lines = output.splitlines()
    for exp in case.expects:
        prefix = problem_prefix(root, case, exp)
        assert any(ln.startswith(prefix) for ln in lines), \
            f"{case.path.name}: no problem reported as {prefix!r}\n--- output:\n{output}"
    for text in case.messages:
        assert text in output, f"{case.path.name}: message {text!r} missing\n--- output:\n{output}"


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_spec_is_refused_and_nothing_is_written(bad_project: Path, case: Case):
    images = bad_project / "images"
    before = snapshot(images)
    spec = str(bad_project / "specs" / case.path.name)
    results = run_many(bad_project, ["validate", spec], ["render", spec])
    for proc in results:
        cmd = " ".join(proc.args[:1])
        output = proc.stderr + proc.stdout
        assert proc.returncode == 2, f"envport {cmd} {case.path.name}: exit {proc.returncode}\n{output}"
        assert "Traceback" not in output, output
        assert_reported(bad_project, case, proc.stderr)
        summary = SUMMARY_RE.search(proc.stderr)
        assert summary, proc.stderr
        assert int(summary.group(1)) == len(case.expects), \
            f"envport {cmd} {case.path.name}: {summary.group(1)} problems, expected {len(case.expects)}\n{output}"
    assert snapshot(images) == before, f"envport render {case.path.name} changed images/"
    assert not (images / case.name).exists()


def test_several_problems_are_all_reported_at_once(bad_project: Path):
    case = next(c for c in CASES if c.name == "many-problems")
    assert len(case.expects) >= 10
    fields = {e.field.split(".")[0].split("[")[0] for e in case.expects}
    # Schema errors, unknown keys and file checks, from every part of the spec, in one run.
    assert {"python", "pip_phase", "pip_phases", "env", "shim_files", "weight_dirs", "witnesses",
            "sm_range", "labels"} <= fields
    proc = run_many(bad_project, ["validate", str(bad_project / "specs" / case.path.name)])[0]
    assert proc.returncode == 2
    assert_reported(bad_project, case, proc.stderr)
    assert SUMMARY_RE.search(proc.stderr).group(1) == str(len(case.expects))


def test_render_all_reports_every_file_and_writes_nothing(bad_project: Path):
    """`render --all` over a specs/ holding every bad case: all problems of all files, one run."""
    images = bad_project / "images"
    before = snapshot(images)
    proc = run_many(bad_project, ["render", "--all"])[0]
    assert proc.returncode == 2, proc.stdout + proc.stderr
    for case in CASES:
        assert_reported(bad_project, case, proc.stderr)
    n_problems, n_files = map(int, SUMMARY_RE.search(proc.stderr).groups())
    assert n_problems >= sum(len(c.expects) for c in CASES)
    assert n_files >= len(CASES)
    assert snapshot(images) == before


def test_a_good_spec_next_to_a_bad_one_is_not_written(tmp_path: Path):
    root = make_project(tmp_path)
    shutil.rmtree(root / "images" / "demo-cpu")
    before = snapshot(root / "images")
    bad = str(root / "specs" / "typo-top-key.yaml")
    proc = run_many(root, ["render", "demo-cpu", bad])[0]
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert snapshot(root / "images") == before
    # The control: alone, the good spec renders (so it was the bad one that stopped it).
    proc = run_many(root, ["render", "demo-cpu"])[0]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert {"Dockerfile", "demo-cpu.def", "setup-venv.sh", "setup-conda.sh"} <= set(
        snapshot(root / "images" / "demo-cpu"))


@pytest.mark.parametrize("content, where", [(b"", ""), (b"\n\n", ""), (b"a: 1\n\xff\xfe not utf-8\n", ":2")],
                         ids=["zero-bytes", "blank", "not-utf8"])
def test_files_without_a_spec(tmp_path: Path, content: bytes, where: str):
    root = make_project(tmp_path)
    spec = root / "specs" / "nothing.yaml"
    spec.write_bytes(content)
    before = snapshot(root / "images")
    for proc in run_many(root, ["validate", str(spec)], ["render", str(spec)]):
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert proc.stderr.startswith(f"{spec}{where}: <top>: "), proc.stderr
    assert snapshot(root / "images") == before

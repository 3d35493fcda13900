"""Issue 21, the import rows: a recipe handed to `envport import` can neither exhaust it, nor make it
print a file from outside the recipe's build context, nor lose an install step while it says OK.

F9   ENV references that multiply line after line stop at a bound on the substituted length.
F10  an environment.yml is read by the spec's own YAML reader (depth, size, no aliases).
F16  a UTF-8 byte order mark is read as docker and pip read it; a command substitution in %environment
     is noted; a here-document RUN is read, and one that cannot be read makes the import exit 1.
F17  `-r FILE` resolves inside the build context only: one outside (`../../x`, a link) is named, never read.
F18  brackets nested 20,000 deep (an exec-form RUN, a COPY, a requirement marker) end in a
     "too deeply nested" note, not a RecursionError.

Each case runs the real CLI in a subprocess under RLIMIT_AS (1 GiB) and RLIMIT_CPU (30 s), so a
blow-up dies with a MemoryError traceback (or SIGXCPU) here instead of swapping or holding the
machine; the assertions are on what it prints.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

MEM_LIMIT = 2**30
CPU_SECONDS = 30  # an import of a 1 MiB recipe takes about a second of CPU; a quadratic scan takes minutes
SECRET = "hunter2-not-for-printing"
LOST = "dropped (a step that may install something; the spec lacks it)"


def _limit():
    resource.setrlimit(resource.RLIMIT_AS, (MEM_LIMIT, MEM_LIMIT))
    resource.setrlimit(resource.RLIMIT_CPU, (CPU_SECONDS, CPU_SECONDS))


def envport_import(tmp: Path, recipe: Path, *args: str) -> tuple[int, str, str]:
    """`envport import RECIPE --dry-run` on a fresh project: (exit code, the spec text, the report)."""
    root = tmp / "project"
    (root / "specs").mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([sys.executable, "-m", "envport", "-C", str(root), "import", str(recipe), "--name", "x",
                           "--dry-run", *args], capture_output=True, text=True, timeout=120, preexec_fn=_limit)
    both = proc.stdout + proc.stderr
    assert "Traceback" not in both, both
    spec, _, report = proc.stdout.partition("# ---- report (dry run: nothing written) ----\n")
    return proc.returncode, spec, report + proc.stderr


def imported(tmp: Path, name: str, text: str, *args: str, exit_code: int = 0) -> tuple[str, str]:
    """Import TEXT written as TMP/NAME; asserts the exit code; (the spec text, the report)."""
    recipe = tmp / name
    recipe.write_text(text)
    rc, spec, report = envport_import(tmp, recipe, *args)
    assert rc == exit_code, report
    return spec, report


# ---- F9 -------------------------------------------------------------------------------------

def test_env_references_that_multiply_stop_at_the_bound(tmp_path: Path):
    # 864 bytes: each ENV triples the last one; expanded in full, B29 is 100 * 3**29 characters.
    lines = ["FROM python:3.11-slim", "ENV A=" + "a" * 100]
    lines += [f"ENV B{i}=${{{p}}}${{{p}}}${{{p}}}" for i, p in zip(range(1, 30), ["A"] + [f"B{i}" for i in range(1, 29)])]
    recipe = tmp_path / "Dockerfile"
    recipe.write_text("\n".join(lines) + "\n")
    assert recipe.stat().st_size < 900
    rc, spec, report = envport_import(tmp_path, recipe)
    assert rc == 0, report
    # 100 * 3**4 = 8100 fits the 8192-character bound; B5 would be 24,300: kept as written, with a note.
    assert "Dockerfile:7: ENV B5=${B4}${B4}${B4}: reported: substituting its variables would make more than 8192 " \
           "characters" in report, report
    assert 'B29: "${B28}${B28}${B28}"' in spec, spec


def test_a_pip_word_that_multiplies_is_dropped_not_built(tmp_path: Path):
    _, report = imported(tmp_path, "Dockerfile", "FROM python:3.11-slim\nARG V=" + "1" * 3000 +
                         "\nRUN pip install six==${V}${V}${V}\n")
    assert "more than 8192 characters" in report and "envport does not read it" in report, report


# ---- F10 ------------------------------------------------------------------------------------

@pytest.mark.parametrize("body", ["dependencies:\n  - " + "[" * 5000 + "\n",
                                  "dependencies:\n" + "".join(" " * (i + 1) + f"k{i}:\n" for i in range(60))],
                         ids=["flow", "block"])
def test_a_deeply_nested_environment_yml_is_refused_with_its_line(tmp_path: Path, body: str):
    recipe = tmp_path / "environment.yml"
    recipe.write_text(body)
    rc, _, report = envport_import(tmp_path, recipe, "--base", "python:3.11-slim")
    assert rc == 2, report
    assert "environment.yml:" in report and "nested deeper than 32 levels" in report, report


def test_an_environment_yml_over_the_spec_readers_size_is_refused(tmp_path: Path):
    recipe = tmp_path / "environment.yml"
    recipe.write_text("dependencies:\n" + "".join(f"  - pkg{i}=1.0\n" for i in range(6000)))
    rc, _, report = envport_import(tmp_path, recipe, "--base", "python:3.11-slim")
    assert rc == 2, report
    assert "is larger than 64 KiB" in report, report


# ---- F16 ------------------------------------------------------------------------------------

BOM = b"\xef\xbb\xbf"


@pytest.mark.parametrize("name,body,mapped", [
    ("Dockerfile", b"FROM python:3.11-slim\nRUN pip install six==1.16.0\n", '"six==1.16.0"'),
    ("x.def", b"Bootstrap: docker\nFrom: python:3.11-slim\n%post\n    pip install six==1.16.0\n", '"six==1.16.0"'),
    ("requirements.txt", b"six==1.16.0\nnumpy==1.26.4\n", '["six==1.16.0", "numpy==1.26.4"]'),
])
def test_a_byte_order_mark_is_read_as_docker_and_pip_read_it(tmp_path: Path, name: str, body: bytes, mapped: str):
    recipe = tmp_path / name
    recipe.write_bytes(BOM + body)
    rc, spec, report = envport_import(tmp_path, recipe, "--base", "python:3.11-slim")
    assert rc == 0, report
    assert mapped in spec and "\ufeff" not in spec, spec


def test_a_command_substitution_in_environment_is_noted_not_kept(tmp_path: Path):
    spec, report = imported(tmp_path, "x.def", "Bootstrap: docker\nFrom: python:3.11-slim\n%environment\n"
                            "    export HOST=`hostname`\n    export WHEN=\"$(date)\"\n    export MODE=fast\n"
                            "%post\n    pip install six==1.16.0\n")
    assert "HOST" not in spec and "WHEN" not in spec and 'MODE: "fast"' in spec, spec
    for line, text in ((4, "export HOST=`hostname`"), (5, "export WHEN=$(date)")):
        assert f"x.def:{line}: {text}: dropped: a command substitution" in report, report


def test_a_here_document_run_is_read_as_the_script_it_runs(tmp_path: Path):
    spec, report = imported(tmp_path, "Dockerfile", "FROM python:3.11-slim\nRUN <<EOF\napt-get install -y git\n"
                            "pip install numpy==1.26.4\nEOF\nRUN python3 <<PY\nprint('hi')\nPY\n")
    assert 'system_pkgs: ["git"]' in spec and '"numpy==1.26.4"' in spec, spec
    assert "Dockerfile:2: RUN <<EOF: turned into the lines of the script it runs" in report, report
    # A command fed by a here-document runs verbatim from a shim script; its body is not an instruction.
    assert "Dockerfile:6: python3 <<PY …: turned into shim_files" in report, report
    assert "not a Dockerfile instruction" not in report, report


def test_an_unreadable_here_document_makes_the_import_incomplete(tmp_path: Path):
    _, report = imported(tmp_path, "Dockerfile", "FROM python:3.11-slim\nRUN pip install six==1.16.0\nRUN <<EOF\n"
                         "pip install numpy==1.26.4\n", exit_code=1)
    assert f"Dockerfile:3: RUN <<EOF: {LOST}: a here-document with no `EOF` line to end it" in report, report
    assert "INCOMPLETE specs/x.yaml would be written: 1 step(s) that may install something were not read" in report


# ---- F17 ------------------------------------------------------------------------------------

def context_with_outside(tmp_path: Path) -> Path:
    """tmp/outside/secret.txt (lines that would be printed as bad requirements) and the context tmp/a/b."""
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.txt").write_text(f"{SECRET} line one\n{SECRET}==1 ; (\n")
    ctx = tmp_path / "a" / "b"
    ctx.mkdir(parents=True)
    return ctx


@pytest.mark.parametrize("via", ["dotdot", "link"])
def test_requirements_r_outside_the_context_is_named_never_read(tmp_path: Path, via: str):
    ctx = context_with_outside(tmp_path)
    target = "../../outside/secret.txt"
    if via == "link":
        os.symlink(target, ctx / "inside.txt")
        target = "inside.txt"
    recipe = ctx / "requirements.txt"
    recipe.write_text(f"-r {target}\nsix==1.16.0\n")
    rc, spec, report = envport_import(tmp_path, recipe, "--base", "python:3.11-slim")
    assert rc == 1, report
    assert f"requirements.txt:1: -r {target}: {LOST}: the requirements file is not a file inside the build context" \
           in report, report
    assert SECRET not in report + spec, report
    assert '"six==1.16.0"' in spec


def test_conda_pip_r_outside_the_context_is_named_never_read(tmp_path: Path):
    ctx = context_with_outside(tmp_path)
    recipe = ctx / "environment.yml"
    recipe.write_text("dependencies:\n  - python=3.11\n  - pip:\n    - -r ../../outside/secret.txt\n    - six==1.16.0\n")
    rc, spec, report = envport_import(tmp_path, recipe, "--base", "python:3.11-slim")
    assert rc == 1, report
    assert f"environment.yml:4: -r ../../outside/secret.txt: {LOST}" in report, report
    assert SECRET not in report + spec, report


def test_a_copied_requirements_file_outside_the_context_is_not_read(tmp_path: Path):
    ctx = context_with_outside(tmp_path)
    spec, report = imported(ctx, "Dockerfile", "FROM python:3.11-slim\nCOPY ../../outside/secret.txt /r.txt\n"
                            "RUN pip install -r /r.txt\n", exit_code=1)
    assert "COPY ../../outside/secret.txt /r.txt: dropped: the source is outside the build context" in report
    assert SECRET not in report + spec, report


# ---- F18 ------------------------------------------------------------------------------------

def test_an_exec_form_run_nested_20000_deep_is_noted(tmp_path: Path):
    _, report = imported(tmp_path, "Dockerfile", "FROM python:3.11-slim\nRUN " + "[" * 20000 + "\nCOPY " +
                         "[" * 20000 + "\n", exit_code=1)
    assert "Dockerfile:2: RUN [[[[" in report and \
        f"{LOST}: too deeply nested (20000 levels of brackets, at most 32)" in report, report
    assert "Dockerfile:3: COPY [[[[" in report and "dropped: too deeply nested (20000 levels" in report, report


def test_a_requirement_marker_nested_deep_is_noted(tmp_path: Path):
    spec, report = imported(tmp_path, "requirements.txt", "six==1.16.0; " + "(" * 3000 + 'python_version > "3"' +
                            ")" * 3000 + "\nnumpy==1.26.4\n", "--base", "python:3.11-slim")
    assert "dropped: too deeply nested (3000 levels of brackets, at most 32)" in report, report
    assert '"numpy==1.26.4"' in spec and "six" not in spec, spec


def test_long_lines_are_scanned_in_linear_time(tmp_path: Path):
    # 70,000 ` -i` after a sed (the in-place-patch check backtracked quadratically: 60 KB took 16 s) and an
    # ENV of 200,000 letters without `=` (the ENV key scan restarted at every letter).
    _, report = imported(tmp_path, "Dockerfile", "FROM python:3.11-slim\nRUN sed" + " -i" * 70_000 +
                         "\nENV X={" + "a" * 200_000 + "\n", exit_code=2)
    assert "more than a spec file holds (64 KiB at most)" in report, report

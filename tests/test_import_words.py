"""Issue 26, first row: an import reads shell words as bash does (porting/words.py, tree-sitter-bash).

Each case is a recipe line of the shape real ML Dockerfiles have, imported by the real CLI: a computed
package name is kept as a run command with a note (never split into fake package names), a `#` comment is
never read as requirements, and a `$(…)` no longer makes the rest of the line one unsplittable command.
The splitter itself is checked on the words it gives and on a depth that ended bashlex in RecursionError.
"""

from __future__ import annotations

import time
from pathlib import Path

from envport.porting.words import split, strip_comments

from .support import run_envport

CUDA_LINE = """FROM nvidia/cuda:12.4.1-runtime-ubuntu22.04
ARG CUDA=12.4
RUN apt-get update && apt-get install -y --no-install-recommends \\
      cuda-command-line-tools-$(cut -f1,2 -d- <<< ${CUDA//./-}) git \\
    && apt-get autoremove -y && apt-get clean && rm -rf /var/lib/apt/lists/*
RUN pip install "setuptools<82" # setuptools>82 breaks pdbfixer at relaxation; see #12
RUN pip install torch==`cat /v.txt` six==1.16.0
"""


def imported(tmp_path: Path, text: str) -> tuple[str, str]:
    root = tmp_path / "project"
    (root / "specs").mkdir(parents=True)
    recipe = tmp_path / "Dockerfile"
    recipe.write_text(text)
    proc = run_envport("import", str(recipe), "--name", "x", "--python", "3.10", "--dry-run", root=root)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    spec, _, report = proc.stdout.partition("# ---- report (dry run: nothing written) ----\n")
    return spec, report


def test_a_computed_apt_package_is_kept_whole_with_a_note(tmp_path: Path):
    spec, report = imported(tmp_path, CUDA_LINE)
    # before: rm, apt-get, autoremove, clean, '$(cut', '<<<' ...; now only what `python3.10 -m venv` needs
    assert 'system_pkgs: ["python3.10", "python3.10-venv"]' in spec, spec
    assert '- "apt-get install -y --no-install-recommends       cuda-command-line-tools-$(cut -f1,2 -d- <<< ' \
           '${CUDA//./-}) git"' in spec, spec
    assert "a package name computed when the line runs (cuda-command-line-tools-$(cut -f1,2 -d- <<< " \
           "${CUDA//./-})): its value is unknown here, so the whole install stays a run command" in report, report


def test_a_comment_is_not_read_as_requirements(tmp_path: Path):
    spec, report = imported(tmp_path, CUDA_LINE)
    assert '- ["setuptools<82"]' in spec, spec
    for word in ("breaks", "pdbfixer", "relaxation", "#12"):
        assert word not in spec, spec
    assert "`at==X.Y`" not in report, report


def test_a_computed_requirement_keeps_the_pip_call_as_a_run_command(tmp_path: Path):
    spec, report = imported(tmp_path, CUDA_LINE)
    assert '- "pip install torch==`cat /v.txt` six==1.16.0"' in spec, spec
    assert "Dockerfile:7: pip install torch==`cat /v.txt` six==1.16.0: kept as a run command: a requirement " \
           "computed when the line runs" in report, report


def test_the_words_bash_reads():
    assert split('DEBIAN_FRONTEND=noninteractive apt-get install -y "a b" c\\ d > /dev/null 2>&1') == \
        ["DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-y", "a b", "c d", ">", "/dev/null", "2>&1"]
    assert split("pip install x-$(uname -m) `date` y <<< z") == \
        ["pip", "install", "x-$(uname -m)", "`date`", "y", "<<< z"]
    assert split("curl -sSL https://x/y.sh | sh") == ["curl", "-sSL", "https://x/y.sh", "|", "sh"]
    assert strip_comments('pip install "a#b" c # d; e') == 'pip install "a#b" c'


def test_deep_command_substitution_is_linear_and_bounded():
    text = "echo " + "$(" * 5000 + ")" * 5000  # bashlex 0.18: RecursionError
    start = time.monotonic()
    assert split(text) == ["echo", "$(" * 5000 + ")" * 5000]
    assert time.monotonic() - start < 5  # a hang guard: measured 0.02 s

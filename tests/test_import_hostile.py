"""Hostile inputs end in a clear message or a spec, never a traceback or a hang.

Each import runs in its own `python -m envport` process under a timeout: the
timeout is a hang guard, not a time assertion (bench/ measures time).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HANG_GUARD_S = 120


def run_import(tmp: Path, path: Path, *args: str) -> subprocess.CompletedProcess:
    (tmp / "project" / "specs").mkdir(parents=True, exist_ok=True)
    return subprocess.run([sys.executable, "-m", "envport", "-C", str(tmp / "project"), "import", str(path),
                           "--name", "hostile", *args], capture_output=True, text=True, timeout=HANG_GUARD_S)


def assert_clean(proc: subprocess.CompletedProcess) -> str:
    both = proc.stdout + proc.stderr
    assert "Traceback" not in both, both
    return both


def test_five_megabyte_dockerfile_is_refused_by_size(tmp_path: Path):
    path = tmp_path / "Dockerfile"
    path.write_text("FROM debian:bookworm-slim\n" + "RUN echo a line that fills the file up\n" * 130_000)
    assert path.stat().st_size > 5_000_000
    proc = run_import(tmp_path, path)
    out = assert_clean(proc)
    assert proc.returncode == 2
    assert "MB is more than a recipe" in out
    assert not (tmp_path / "project" / "specs" / "hostile.yaml").exists()


def test_binary_file_is_refused(tmp_path: Path):
    path = tmp_path / "Dockerfile"
    path.write_bytes(b"FROM debian\n" + os.urandom(4096) + b"\0\0")
    proc = run_import(tmp_path, path)
    out = assert_clean(proc)
    assert proc.returncode == 2
    assert "a binary file" in out


def test_non_utf8_bytes_name_the_line(tmp_path: Path):
    path = tmp_path / "Dockerfile"
    path.write_bytes(b"FROM debian:bookworm-slim\nRUN echo caf\xe9\n")
    proc = run_import(tmp_path, path)
    out = assert_clean(proc)
    assert proc.returncode == 2
    assert "Dockerfile:2: byte 0xe9 is not UTF-8" in out


@pytest.mark.parametrize("kind", ["dockerfile", "shell"])
def test_ten_thousand_run_lines_end_in_a_message(tmp_path: Path, kind: str):
    if kind == "dockerfile":
        path = tmp_path / "Dockerfile"
        path.write_text("FROM debian:bookworm-slim\n" + "".join(f"RUN echo {i}\n" for i in range(10_000)))
    else:
        path = tmp_path / "install.sh"
        path.write_text("#!/bin/sh\nset -e\n" + "".join(f"echo {i}\n" for i in range(10_000)))
    proc = run_import(tmp_path, path)
    out = assert_clean(proc)
    assert proc.returncode == 2
    assert "10000 run commands, more than an env spec holds" in out


def test_a_spec_larger_than_the_loader_reads_is_refused_not_written(tmp_path: Path):
    # Under the run-command bound (2000) but over the spec file bound (64 KiB): a spec the loader would refuse
    # to read is never written; the import says why.
    path = tmp_path / "Dockerfile"
    path.write_text("FROM debian:bookworm-slim\n" + "".join(f"RUN echo {i}\n" for i in range(1999)))
    proc = run_import(tmp_path, path)
    out = assert_clean(proc)
    assert proc.returncode == 2, out
    assert "Dockerfile: the spec would be 68 KiB, more than a spec file holds (64 KiB at most)" in out
    assert not (tmp_path / "project" / "specs" / "hostile.yaml").exists()


def test_many_pip_lines_still_give_a_spec(tmp_path: Path):
    # Below the run-command bound the import finishes with a spec (each pip call a phase).
    path = tmp_path / "Dockerfile"
    path.write_text("FROM python:3.11-slim\n" + "".join(f"RUN pip install pkg{i}==1.0\n" for i in range(300)))
    proc = run_import(tmp_path, path)
    assert_clean(proc)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "project" / "specs" / "hostile.yaml").is_file()


def test_requirements_that_include_themselves_stop(tmp_path: Path):
    path = tmp_path / "requirements.txt"
    path.write_text("-r requirements.txt\nsix==1.16.0\n")
    proc = run_import(tmp_path, path, "--base", "python:3.11-slim")
    out = assert_clean(proc)
    assert proc.returncode == 0, out
    assert "nested more than 8 deep" in out


def test_yaml_alias_bomb_does_not_expand(tmp_path: Path):
    # An environment.yml is read by the spec's own YAML reader (spec/yamlfile.compose): anchors are
    # refused there as in a spec, naming the line, before anything could expand.
    path = tmp_path / "environment.yml"
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    path.write_text("\n".join(lines) + "\ndependencies:\n  - python=3.11\n")
    proc = run_import(tmp_path, path, "--base", "debian:bookworm-slim")
    out = assert_clean(proc)
    assert proc.returncode == 2, out
    assert "environment.yml:1: not YAML envport can read (YAML anchor &a0 is not supported" in out


@pytest.mark.parametrize("body", [b"", b"\n\n", b"FROM\n", b"Bootstrap:\n", b"%post\n", b"- - -\n", b"{{{{"])
def test_degenerate_files_never_trace(tmp_path: Path, body: bytes):
    for name in ("Dockerfile", "x.def", "environment.yml", "requirements.txt", "install.sh"):
        path = tmp_path / name
        path.write_bytes(body)
        proc = run_import(tmp_path, path, "--force")
        assert_clean(proc)
        assert proc.returncode in (0, 1, 2), proc.stdout + proc.stderr


def test_a_fifo_is_refused_not_waited_on(tmp_path: Path):
    path = tmp_path / "Dockerfile"
    os.mkfifo(path)
    proc = run_import(tmp_path, path)
    out = assert_clean(proc)
    assert proc.returncode == 2
    assert "not a regular file" in out

"""Hostile input fails cleanly: every file a user (or a bad checkout) can put where a spec goes.

Each case runs the real CLI in a subprocess under hard limits: RLIMIT_AS 100 MiB
(address space) and RLIMIT_CPU 2 s, so an alias bomb or a recursion blow-up dies
with a resource error instead of passing; a FIFO that blocked the reader would
run into the subprocess timeout.  Every case must exit 2 naming FILE[:LINE],
with no traceback.  Timing is a limit here, never an assertion on a measurement.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


MEM_LIMIT = 100 * 2**20
CPU_SECONDS = 2
GOOD = """name: good
base: debian:bookworm-slim
python: "3.11"
pip_phases: [["six==1.16.0"]]
env: {MODE: "0755"}
"""


def _limits():
    resource.setrlimit(resource.RLIMIT_AS, (MEM_LIMIT, MEM_LIMIT))
    resource.setrlimit(resource.RLIMIT_CPU, (CPU_SECONDS, CPU_SECONDS))


def envport(*args: str, cwd: Path, prefix: tuple[str, ...] = (), limits: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([*prefix, sys.executable, "-m", "envport", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=60, preexec_fn=_limits if limits else None)


def alias_bomb(levels: int) -> str:
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]")
    return "name: bomb\nbase: debian:bookworm-slim\npython: '3.11'\nlabels:\n" + \
        "\n".join("  " + ln for ln in lines) + "\n"


def spec_with(extra: str) -> str:
    # NAME is replaced by the case's own name: the spec is otherwise valid, so only `extra` is judged.
    return f"name: NAME\nbase: debian:bookworm-slim\npython: '3.11'\n{extra}"


# Valid, only large: they must pass under the same limits (the rest must be refused).
VALID = {"long-string", "many-keys"}


# name -> file content (each at most 1 KiB: the "Done when" bound)
HOSTILE = {
    "alias-bomb-7": alias_bomb(7),
    "alias-bomb-10": alias_bomb(10),
    "flow-nesting": "[" * 1000,
    "flow-mapping-nesting": "{a: " * 250,
    "block-nesting": "name: x\n" + "".join(" " * i + f"k{i}:\n" for i in range(40)),
    "huge-int": spec_with("env:\n  BIG: " + "9" * 900 + "\n"),
    "huge-float": spec_with("resources: {mem_gib: 1e99999}\n"),
    "huge-count": spec_with("resources: {cpus: " + "9" * 900 + "}\n"),
    "huge-sexagesimal": spec_with("env:\n  T: " + ":".join(["59"] * 300) + "\n"),
    "long-string": spec_with("description: " + "x" * 900 + "\n"),
    "many-keys": spec_with("env:\n" + "".join(f"  K{i}: v\n" for i in range(100))),
    "python-tag": spec_with("env: !!python/object/apply:os.system ['echo pwned']\n"),
    "binary-tag": spec_with("env: {X: !!binary aGVsbG8=}\n"),
    "merge-key": spec_with("env:\n  <<: {A: '1'}\n"),
    "complex-key": spec_with("env:\n  ? [a, b]\n  : c\n"),
    "bad-timestamp": spec_with("env: {T: 2024-13-45}\n"),
    "not-utf8": spec_with("description: caf\xe9\n").encode("latin-1"),
    "nul-bytes": spec_with("description: a\x00b\n"),
    "many-documents": "---\nname: a\n---\nname: b\n",
}


@pytest.fixture(scope="module")
def hostile_project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("hostile")
    (root / "specs" / "files").mkdir(parents=True)
    (root / "images").mkdir()
    (root / "specs" / "good.yaml").write_text(GOOD)
    for name, content in HOSTILE.items():
        data = (content if isinstance(content, bytes) else content.encode()).replace(b"NAME", name.encode())
        assert len(data) <= 1024, f"{name} is {len(data)} bytes; the bound is 1 KiB"
        (root / "specs" / f"{name}.yaml").write_bytes(data)
    return root


def test_good_spec_passes_under_the_same_limits(hostile_project):
    proc = envport("validate", "good", cwd=hostile_project)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_file_of_at_most_1k_is_exit_2_within_100mb_and_2s(hostile_project, name):
    path = hostile_project / "specs" / f"{name}.yaml"
    for cmd in ("validate", "render"):
        proc = envport(cmd, str(path), cwd=hostile_project)
        out = proc.stdout + proc.stderr
        expected = 0 if name in VALID else 2
        assert proc.returncode == expected, \
            f"{cmd} {name}: exit {proc.returncode}, not {expected} (-9/-24: a limit was hit)\n{out[-2000:]}"
        assert "Traceback" not in out and "MemoryError" not in out, out[-2000:]
        if expected:
            assert proc.stderr.startswith(f"{path}"), proc.stderr[:500]
            assert f"name {name!r} differs" not in proc.stderr  # refused for the hostile part, not the name


def test_alias_bomb_names_the_line_and_the_reason(hostile_project):
    path = hostile_project / "specs" / "alias-bomb-10.yaml"
    proc = envport("validate", str(path), cwd=hostile_project)
    assert proc.stderr.startswith(f"{path}:5: <top>: YAML anchor &a0 is not supported (aliases can expand "
                                  "exponentially) (fix: write the value out where it is used)"), proc.stderr
    alias = path.with_name("alias-only.yaml")
    alias.write_text("name: x\nenv: *nothing\n")
    proc = envport("validate", str(alias), cwd=hostile_project)
    assert proc.stderr.startswith(f"{alias}:2: <top>: YAML alias *nothing is not supported"), proc.stderr


def test_5000_open_brackets_exit_2_naming_the_line(tmp_path):
    spec = tmp_path / "specs" / "deep.yaml"
    spec.parent.mkdir()
    spec.write_text("[" * 5000)
    proc = envport("validate", str(spec), cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.startswith(f"{spec}:1: <top>: nested deeper than 32 levels"), proc.stderr[:500]


def test_validate_all_reports_every_hostile_file_and_still_checks_the_good_one(hostile_project):
    proc = envport("validate", "--all", cwd=hostile_project)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    for name in set(HOSTILE) - VALID:
        assert str(hostile_project / "specs" / f"{name}.yaml") in proc.stderr, name
    assert str(hostile_project / "specs" / "good.yaml") not in proc.stderr  # checked, and fine


# ---- file errors: permission, directory, FIFO, symlink loop, bad bytes -------------------------

def _no_dac_prefix() -> tuple[str, ...]:
    """Run as a user the file modes apply to: root without the capabilities that bypass them."""
    if os.geteuid() != 0:
        return ()
    if not shutil.which("setpriv"):
        pytest.skip("running as root and setpriv (util-linux) is absent: cannot drop CAP_DAC_OVERRIDE, "
                    "so a chmod 000 file stays readable and the permission case cannot be made")
    return ("setpriv", "--bounding-set=-dac_override,-dac_read_search")


@pytest.fixture
def broken_project(tmp_path) -> Path:
    root = tmp_path / "proj"
    specs = root / "specs"
    (specs / "files").mkdir(parents=True)
    (root / "images").mkdir()
    (specs / "good.yaml").write_text(GOOD)
    (specs / "unreadable.yaml").write_text(GOOD.replace("name: good", "name: unreadable"))
    os.chmod(specs / "unreadable.yaml", 0)
    (specs / "adir.yaml").mkdir()
    os.mkfifo(specs / "fifo.yaml")
    os.symlink("loop-b.yaml", specs / "loop-a.yaml")
    os.symlink("loop-a.yaml", specs / "loop-b.yaml")
    (specs / "latin1.yaml").write_bytes(b"name: latin1\nbase: debian:bookworm-slim\npython: '3.11'\n"
                                        b"description: caf\xe9\n")
    (specs / "files" / "secret.py").write_text("print('x')\n")
    os.chmod(specs / "files" / "secret.py", 0)
    (specs / "files" / "loop.py").symlink_to("loop.py")
    os.mkfifo(specs / "files" / "fifo.py")
    (specs / "shims.yaml").write_text(
        "name: shims\nbase: debian:bookworm-slim\npython: '3.11'\nshim_files:\n"
        "  /opt/a.py: files/secret.py\n  /opt/b.py: files/loop.py\n  /opt/c.py: files/fifo.py\n")
    return root


EXPECTED = {
    "unreadable": "<top>: permission denied",
    "adir": "<top>: is a directory, not a file",
    "fifo": "<top>: is not a regular file (a FIFO, socket or device)",
    "loop-a": "<top>: symlink loop",
    "loop-b": "<top>: symlink loop",
    "latin1": ":4: <top>: not UTF-8 text (byte 0xe9 at line 4)",
}


def test_file_errors_are_exit_2_with_file_and_line_and_validate_all_goes_on(broken_project):
    proc = envport("validate", "--all", cwd=broken_project, prefix=_no_dac_prefix())
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert "Traceback" not in out, out
    specs = broken_project / "specs"
    for name, text in EXPECTED.items():
        path = specs / f"{name}.yaml"
        assert any(ln.startswith(str(path)) and text in ln for ln in proc.stderr.splitlines()), \
            f"{name}: no line starting {path} with {text!r}\n{proc.stderr}"
    shims = specs / "shims.yaml"
    assert f"{shims}:5: shim_files./opt/a.py: source file {specs / 'files' / 'secret.py'}: permission denied" \
        in proc.stderr, proc.stderr
    assert f"{shims}:6: shim_files./opt/b.py:" in proc.stderr and "symlink loop" in proc.stderr
    assert f"{shims}:7: shim_files./opt/c.py: source file {specs / 'files' / 'fifo.py'}: is not a regular" \
        in proc.stderr
    # The good spec next to them was still checked: it is the one line on stdout.
    assert proc.stdout.startswith("OK ") and "good@" in proc.stdout and proc.stdout.count("\n") == 1, proc.stdout


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_file_error_alone_and_under_json(broken_project, name):
    import json

    path = broken_project / "specs" / f"{name}.yaml"
    proc = envport("validate", str(path), "--json", cwd=broken_project, prefix=_no_dac_prefix())
    assert proc.returncode == 2, proc.stdout + proc.stderr
    data = json.loads(proc.stdout)
    assert data["command"] == "validate" and data["exit_code"] == 2 and data["steps"] == []
    assert [p["file"] for p in data["problems"]] == [str(path)]


def test_a_file_too_large_for_a_spec_is_refused_unread(tmp_path):
    spec = tmp_path / "specs" / "big.yaml"
    spec.parent.mkdir()
    spec.write_bytes(b"# " + b"x" * (300 * 1024) + b"\n")
    proc = envport("validate", str(spec), cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"{spec}: <top>: is larger than 64 KiB"), proc.stderr[:300]


# ---- any text at all: a spec or a SpecError, never another exception ----------------------------

YAML_ALPHABET = "abcn: -[]{}&*!|>'\"#%@`,?~\n\t 0123456789.eE+_x<=\\\x00\xe9"


def _yamlish():
    from hypothesis import strategies as st

    pieces = st.sampled_from(["name: x\n", "base: debian:bookworm-slim\n", "python: '3.11'\n", "env:\n  ", "&a ",
                              "*a ", "!!binary ", "<<: ", "? ", "- ", "[", "]", "{", "}", "0755", "yes", "1e999",
                              "12:30:00", "2024-13-45", "\t", "---\n", "...\n", "  k: v\n", '"\\x"', "'", "%YAML 1.1\n"])
    return st.lists(st.one_of(pieces, st.text(YAML_ALPHABET, max_size=20)), max_size=40).map("".join)


def test_any_text_is_a_spec_or_problems_never_an_exception(tmp_path):
    from hypothesis import HealthCheck, given, settings

    from envport.core.errors import SpecError
    from envport.spec.loader import load_spec

    (tmp_path / "specs").mkdir()
    path = tmp_path / "specs" / "x.yaml"

    @settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(_yamlish())
    def check(text):
        path.write_text(text, encoding="utf-8", errors="surrogateescape")
        try:
            load_spec("x", tmp_path)
        except SpecError as exc:
            assert exc.problems and all(p.file == str(path) for p in exc.problems)

    check()

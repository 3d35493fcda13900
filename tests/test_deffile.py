"""envport.builders.apptainer.deffile: every rendered .def parses; hand-written edge cases say the line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from envport.builders.apptainer.deffile import DefError, match_step, parse_def

from .support import REPO

DEFS = sorted(list(REPO.glob("images/*/*.def")) + list(REPO.glob("tests/golden/images/*/*.def")))
IDS = [str(p.relative_to(REPO)) for p in DEFS]


def test_there_are_defs():
    assert len(DEFS) >= 5, DEFS


@pytest.mark.parametrize("path", DEFS, ids=IDS)
def test_every_rendered_def_parses(path: Path):
    text = path.read_text(encoding="utf-8")
    d = parse_def(text, str(path))
    assert d.bootstrap in ("docker", "docker-daemon", "localimage")
    assert d.base
    for name in ("labels", "environment", "post"):
        assert d.has(name), f"{path.name}: no %{name}"
    assert dict(d.labels)["envport.name"] == path.parent.name
    assert re.fullmatch(r"[0-9a-f]{64}", dict(d.labels)["envport.hash"])
    # Every `%files` source the renderer wrote sits next to the .def.
    for f in d.files:
        assert f.dst.startswith("/"), f
        assert (path.parent / f.src).exists() or f.src in ("ca-bundle.crt", "wheelhouse"), f
    # The step count is what the `step i/n` markers say, all of them.
    markers = re.findall(r"echo 'envport: step (\d+)/(\d+) ", text)
    assert markers and len(d.steps) == len(markers) == int(markers[0][1])
    assert [s.n for s in d.steps] == list(range(1, len(d.steps) + 1))
    assert all(s.total == len(d.steps) and s.marker for s in d.steps)
    assert d.steps[0].marker == "base" and d.steps[-1].marker == "labels"
    assert all(text.split("\n")[s.line - 1].strip().startswith("echo 'envport: step") for s in d.steps)


def test_demo_cpu_exactly():
    d = parse_def((REPO / "images/demo-cpu/demo-cpu.def").read_text(encoding="utf-8"), "demo-cpu.def")
    # envport/* bases live in the local engine, never in a registry: docker-daemon, not docker.
    assert d.header == {"bootstrap": "docker-daemon", "from": "envport/debian-bookworm:base"}
    assert [s.name for s in d.sections] == ["labels", "files", "environment", "post"]
    shims = [f for f in d.files if not f.src.startswith("locks/")]  # a lock adds locks/pip-N.txt
    assert [(f.src, f.dst) for f in shims] == [("files/demo_run.py", "/opt/demo/run.py")]
    assert dict(d.labels)["org.opencontainers.image.title"] == "demo-cpu"
    assert "    export DEMO_GREETING='hello from demo-cpu'\n" in d.script("environment")
    assert d.script("environment").endswith("\n\n")  # the blank line before %post belongs to it, as in apptainer
    assert [(s.n, s.marker, s.title) for s in d.steps][:4] == [
        (1, "base", "base envport/debian-bookworm:base"), (2, "python", "python 3.11"),
        (3, "env", "env (3 vars)"), (4, "pip-1", "pip phase 1: torch==2.13.0")]
    assert d.script("runscript") == "" and not d.has("runscript")


def test_match_step():
    assert match_step("envport: step 3/8 env (2 vars)\n") == (3, 8, "env (2 vars)")
    assert match_step("+ echo 'envport: step 3/8 env (2 vars)'") is None
    assert match_step("envport: step x/8 env") is None


HEAD = "Bootstrap: docker\nFrom: debian:bookworm-slim\n"


def parse(body: str):
    return parse_def(HEAD + body, "t.def")


def error(text: str) -> DefError:
    with pytest.raises(DefError) as err:
        parse_def(text, "t.def")
    return err.value


def test_sections_are_verbatim_and_concatenated():
    d = parse("\n%post\n    echo one\n\n%environment\n    export A=1\n%post\n    echo two\n")
    assert d.script("post") == "    echo one\n\n    echo two\n"
    assert d.script("environment") == "    export A=1\n"


def test_crlf_and_missing_final_newline():
    d = parse_def("Bootstrap: docker\r\nFrom: x\r\n%post\r\n    echo a\r\n    echo b", "t.def")
    assert d.base == "x" and d.script("post") == "    echo a\n    echo b\n"
    assert d.text.endswith("echo b")  # the raw text is kept as written: it goes into the SIF


def test_header_comments_case_and_continuation():
    d = parse_def("# a comment\nBOOTSTRAP: docker # trailing\nFrom: reg.example/x:1 \\\n  -more\n%post\n:\n",
                  "t.def")
    assert d.header == {"bootstrap": "docker", "from": "reg.example/x:1 -more"}


def test_labels_split_at_first_space():
    d = parse('%labels\n    a.b value with  spaces\n    # comment\n    lonely\n    q "quoted" $x\n')
    assert d.labels == (("a.b", "value with  spaces"), ("lonely", ""), ("q", '"quoted" $x'))


def test_files_quoting():
    d = parse('%files\n    "my dir/a b.txt" "/opt/x y/c.txt"\n    plain.txt\n    src.txt /dst/\n    # no\n')
    assert [(f.src, f.dst, f.line) for f in d.files] == [
        ("my dir/a b.txt", "/opt/x y/c.txt", 4), ("plain.txt", "", 5), ("src.txt", "/dst/", 6)]


@pytest.mark.parametrize("line, why", [
    ("    a b c", "expected `SRC [DST]`"),
    ("    'a b' /x", "single quotes"),
    ('    a"b /x', "expected `SRC [DST]`"),
    ("    {{ src }} /x", "templating"),
])
def test_bad_files_lines_name_the_line(line: str, why: str):
    err = error(HEAD + "\n%files\n" + line + "\n")
    assert (err.reason, err.line) == ("bad_files_line", 5)
    assert why in str(err) and str(err).startswith("t.def:5: ")


def test_setup_is_refused_with_the_fix():
    err = error(HEAD + "%setup\n    touch $APPTAINER_ROOTFS/x\n%post\n    :\n")
    assert (err.reason, err.line) == ("unsupported_section", 3)
    assert "%setup runs on the build host" in str(err) and "%post" in str(err)


@pytest.mark.parametrize("section, reason", [
    ("%pre", "unsupported_section"), ("%arguments", "unsupported_section"),
    ("%apprun foo", "unsupported_section"), ("%files from builder", "unsupported_section"),
    ("%post -c /bin/bash", "unsupported_section"), ("%bogus", "unknown_section"),
])
def test_unsupported_and_unknown_sections(section: str, reason: str):
    err = error(HEAD + section + "\n    x\n")
    assert (err.reason, err.line) == (reason, 3)


def test_runscript_args_are_kept():
    d = parse("%runscript -c /bin/bash\n    echo $@\n")
    assert d.args("runscript") == "-c /bin/bash" and d.script("runscript") == "    echo $@\n"


def test_indented_section_line_is_refused():
    err = error(HEAD + "%post\n    echo a\n    %environment\n")
    assert (err.reason, err.line) == ("indented_section", 5)


@pytest.mark.parametrize("text, reason, line", [
    ("", "empty", None),
    ("   \n\n", "empty", None),
    ("From: x\n%post\n :\n", "bad_header", None),
    ("Bootstrap docker\n%post\n :\n", "bad_header", 1),
    ("Bootstrap: docker\nColour: blue\n%post\n :\n", "bad_header", 2),
    ("Bootstrap: docker\nFrom: a\nFrom: b\n", "bad_header", 3),
    (HEAD + "%post\n:\nBootstrap: docker\nFrom: y\n%post\n:\n", "unsupported_section", None),
])
def test_bad_headers(text: str, reason: str, line):
    err = error(text)
    assert (err.reason, err.line) == (reason, line)


def test_steps_out_of_order_name_the_line():
    err = error(HEAD + "%post\n    echo 'envport: step 1/3 a'\n    echo 'envport: step 3/3 c'\n")
    assert (err.reason, err.line) == ("bad_steps", 5)


def test_step_titles_with_quotes():
    d = parse("%post\n    # step 1/1 run: it's\n    echo 'envport: step 1/1 it'\"'\"'s done'\n")
    assert [(s.title, s.marker) for s in d.steps] == [("it's done", "run")]


def test_step_count_disagreeing_with_total_names_the_line():
    err = error(HEAD + "%post\n    echo 'envport: step 1/3 a'\n    echo 'envport: step 2/3 b'\n")
    assert (err.reason, err.line) == ("bad_steps", 4)
    assert "has 2 step markers" in str(err)

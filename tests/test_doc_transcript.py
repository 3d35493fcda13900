"""The docs witness's pure parts: console transcripts parsed with their line numbers, promised output
compared (`...` wildcards, `[N]` exit status), the flags a command passes which program, and a
docs.py run judged per doc (witness/doc_transcript.py, doc_flags.py, doc_check.py)."""

from __future__ import annotations

from pathlib import Path

from envport.core.verdict import Verdict
from envport.witness import doc_check
from envport.witness.doc_flags import Use, closest, help_flags, uses
from envport.witness.doc_sources import Doc
from envport.witness.doc_transcript import Command, Promised, compare, parse

DOC = """\
# Using it

```console
$ python -c 'import six; print(six.__version__)'
1.16.0
$ pip show --files six
Name: six
Version: 1.16...
...
```

```python
print("not a transcript")
```

<!-- envport: norun -->

```console
$ torchrun --standalone \\
    --nproc-per-node 4 run.py
...
$ false
[1]
```
"""


def test_commands_keep_their_doc_lines_and_promised_output():
    t = parse(DOC)
    assert t.problems == []
    assert [(c.line, c.shown, c.norun) for c in t.commands] == [
        (4, "python -c 'import six; print(six.__version__)'", False),
        (6, "pip show --files six", False),
        (19, "torchrun --standalone --nproc-per-node 4 run.py", True),
        (22, "false", True),
    ]
    assert t.commands[0].output == (Promised(5, "1.16.0"),)
    assert [p.line for p in t.commands[1].output] == [7, 8, 9]
    # The continuation is kept as the shell reads it: backslash-newline.
    assert t.commands[2].text == "torchrun --standalone \\\n    --nproc-per-node 4 run.py"
    assert t.commands[3].exit_status == 1 and t.commands[3].output == ()


def test_norun_marker_only_counts_right_before_the_fence():
    text = "<!-- envport: norun -->\n\nsome prose\n\n```console\n$ echo hi\nhi\n```\n"
    assert [c.norun for c in parse(text).commands] == [False]


def test_a_fence_indented_in_a_list_item_and_a_spaced_marker():
    text = "1. Install:\n\n   <!--envport:norun-->\n   ```console\n   $ pip install --no-dep six\n   ...\n   ```\n"
    [cmd] = parse(text).commands
    assert (cmd.line, cmd.text, cmd.norun, [p.text for p in cmd.output]) == (5, "pip install --no-dep six", True,
                                                                              ["..."])


def test_text_before_the_first_command_is_a_doc_problem_with_its_line():
    t = parse("intro\n\n```console\nHello\n$ echo hi\nhi\n```\n")
    assert t.problems and t.problems[0][0] == 4 and "before the first `$ ` command" in t.problems[0][1]


def test_other_fences_and_longer_fences_are_not_transcripts():
    text = "````markdown\n```console\n$ rm -rf /\n```\n````\n~~~console\n$ echo ok\nok\n~~~\n"
    assert [c.shown for c in parse(text).commands] == ["echo ok"]


def _cmd(*promised: str, line: int = 10) -> Command:
    return Command(line, "cmd", tuple(Promised(line + 1 + i, p) for i, p in enumerate(promised)))


def test_exact_output_matches_and_a_changed_line_names_its_doc_line():
    assert compare(_cmd("1.16.0"), "1.16.0\n\n") is None
    miss = compare(_cmd("Name: six", "1.17.0"), "Name: six\n1.16.0\n")
    assert (miss.line, miss.message) == (12, "expected 1.17.0, got 1.16.0")


def test_wildcard_lines_and_rest_of_line():
    assert compare(_cmd("...", "2.13.0+cpu 1"), "UserWarning: no numpy\n  warn()\n2.13.0+cpu 1\n") is None
    assert compare(_cmd("...", "2.13.0+cpu 1"), "2.13.0+cpu 1\n") is None  # `...` matches no line too
    assert compare(_cmd("Python 3.11..."), "Python 3.11.2\n") is None
    miss = compare(_cmd("Python 3.11..."), "Python 3.12.1\n")
    assert miss.message == "expected Python 3.11..., got Python 3.12.1"
    # Backtracking: the second `a` is the one the literal after `...` needs.
    assert compare(_cmd("...", "a", "b"), "a\na\nb\n") is None


def test_missing_and_extra_output_are_named():
    assert compare(_cmd("one", "two"), "one\n").message == "expected two, got no more output"
    extra = compare(_cmd("one"), "one\ntwo\n")
    assert extra.line == 10 and "printed more than the doc shows, from two" in extra.message
    assert compare(_cmd(), "").__class__ is type(None)
    assert "from hi" in compare(_cmd(), "hi\n").message


def test_long_output_does_not_recurse():
    assert compare(_cmd("...", "end"), "x\n" * 50000 + "end\n") is None


def test_flag_uses_per_program_and_subcommand():
    assert uses("pip show --files-only six") == [Use(("pip",), "show", ("--files-only",))]
    assert uses("python -m pip install --no-deps x 2>&1 | grep --count y") == [
        Use(("python", "-m", "pip"), "install", ("--no-deps",)), Use(("grep",), None, ("--count",))]
    # Quotes and variables are kept so the help runs on the same path inside the env.
    assert uses('OMP_NUM_THREADS=1 python -u "$ENVPORT_ROOT/opt/run.py" --steps=3 >out.txt') == [
        Use(("python", '"$ENVPORT_ROOT/opt/run.py"'), None, ("--steps",))]
    assert Use(("pip",), "show", ("--x",)).help_lines() == ["pip --help", "pip show --help"]


def test_what_is_not_a_documented_option():
    assert uses("python -c 'import sys' --not-mine") == []  # the code's own arguments
    assert uses("echo --verbose && cd --x") == []  # builtins
    assert uses("pip install -- --literal") == []  # operands after --
    assert uses("pip show --help") == []  # --help is how flags are checked
    assert uses("ls --all &>/dev/null") == [Use(("ls",), None, ("--all",))]


def test_help_flags_and_closest():
    text = "Options:\n  -f, --files   Show the full list\n  --verbose\n  --no-color, --no_color\n"
    assert help_flags(text) == {"--files", "--verbose", "--no-color", "--no_color"}
    assert closest("--files-only", help_flags(text)) == "--files"
    assert closest("--zzz", help_flags(text)) is None


BAD = """\
```console
$ python -c 'import six; print(six.__version__)'
1.17.0
$ pip show --files-only six
...
$ python -c 'import sys; sys.exit(3)'
```

<!-- envport: norun -->
```console
$ pip install --no-dep six
```
"""

PIP_HELP = "Usage: pip <command>\n  --verbose\n  --quiet\n"
SHOW_HELP = "Usage: pip show [options]\n  -f, --files  Show the full list of installed files\n"
INSTALL_HELP = "Usage: pip install\n  --no-deps  Don't install package dependencies.\n"


def _records(jobs: doc_check.DocJobs, ran: dict[str, tuple[int, str]]) -> list[dict]:
    """docs.py's records for the jobs: commands as RAN says (by text), help lines from the texts above."""
    helps = {"pip --help": PIP_HELP, "pip show --help": SHOW_HELP, "pip install --help": INSTALL_HELP}
    out = []
    for job in jobs.jobs:
        rc, text = (0, helps[job["cmd"]]) if job["cmd"] in helps else ran[job["cmd"]]
        out.append({"check": "doc", "name": job["id"], "returncode": rc, "output": text, "seconds": 0.1})
    return out


def test_a_doc_is_judged_naming_each_line_and_what_differs():
    doc = Doc("USAGE.md", Path("USAGE.md"), text=BAD, sha256="ab" * 32)
    jobs = doc_check.plan_jobs([doc])
    # The norun command is not run; its program's help is.
    assert "pip install --no-dep six" not in [j["cmd"] for j in jobs.jobs]
    assert "pip install --help" in [j["cmd"] for j in jobs.jobs]
    records = _records(jobs, {"python -c 'import six; print(six.__version__)'": (0, "1.16.0\n"),
                              "pip show --files-only six": (2, "no such option: --files-only\n"),
                              "python -c 'import sys; sys.exit(3)'": (3, "")})
    [row] = doc_check.judge(jobs, records, "never ran")
    assert row.verdict is Verdict.FAILED and row.step == "docs USAGE.md"
    said = [row.detail] + row.lines
    assert row.detail.startswith("USAGE.md:3: expected 1.17.0, got 1.16.0")
    assert "USAGE.md:4: $ pip show --files-only six: pip show has no --files-only (closest: --files)" in said
    assert "USAGE.md:4: $ pip show --files-only six: exited 2" in said
    assert "USAGE.md:6: $ python -c 'import sys; sys.exit(3)': exited 3" in said
    assert "USAGE.md:11: $ pip install --no-dep six: pip install has no --no-dep (closest: --no-deps)" in said
    assert row.data["doc_sha256"] == "ab" * 32 and row.data["norun"] == 1


def test_a_matching_doc_passes_and_a_missing_record_fails():
    good = "```console\n$ pip show --files six\nName: six\n...\n```\n"
    doc = Doc("USAGE.md", Path("USAGE.md"), text=good, sha256="cd" * 32)
    jobs = doc_check.plan_jobs([doc])
    records = _records(jobs, {"pip show --files six": (0, "Name: six\nVersion: 1.16.0\n")})
    [row] = doc_check.judge(jobs, records, "never ran")
    assert row.verdict is Verdict.OK, row
    assert "1 command(s) ran as the doc shows" in row.detail and "1 flag(s)" in row.detail
    [lost] = doc_check.judge(jobs, [], "no result: the witness exited 1 before reporting")
    assert lost.verdict is Verdict.FAILED and "USAGE.md:2: $ pip show --files six: no result for `pip --help`" \
        in lost.detail


def test_a_doc_without_transcripts_fails_rather_than_promising_nothing():
    doc = Doc("U.md", Path("U.md"), text="# Usage\n\n```bash\npip show six\n```\n", sha256="0")
    jobs = doc_check.plan_jobs([doc])
    assert jobs.jobs == []
    [row] = doc_check.judge(jobs, [], "")
    assert row.verdict is Verdict.FAILED and row.detail.startswith("U.md: no ```console block"), row


def test_a_help_that_lists_nothing_cannot_vouch_for_a_flag():
    doc = Doc("U.md", Path("U.md"), text="<!-- envport: norun -->\n```console\n$ nosuch --fast\n```\n", sha256="0")
    jobs = doc_check.plan_jobs([doc])
    records = [{"check": "doc", "name": j["id"], "returncode": 127, "output": "bash: nosuch: command not found"}
               for j in jobs.jobs]
    [row] = doc_check.judge(jobs, records, "")
    assert row.verdict is Verdict.FAILED
    assert row.detail == ("U.md:3: $ nosuch --fast: `nosuch --help` lists no options (exit 127: bash: nosuch: "
                          "command not found), so --fast cannot be checked")


def test_docs_not_run_say_why_in_one_row():
    gone = Doc("files/x/USAGE.md", Path("/p/specs/files/x/USAGE.md"), problem="/p/specs/files/x/USAGE.md does not exist")
    assert doc_check.not_run(gone).verdict is Verdict.FAILED
    passed = Doc("U.md", Path("U.md"), text="x", sha256="ef" * 32, passed_on="2026-12-05T04:00:00+00:00 on env abc")
    row = doc_check.not_run(passed)
    assert row.verdict is Verdict.PRESENT and "unchanged since it passed on 2026-12-05" in row.detail
    assert "--rerun-docs" in row.detail
    assert doc_check.not_run(Doc("U.md", Path("U.md"), text="x", sha256="1")) is None


def test_the_example_in_docs_spec_md_is_a_valid_transcript():
    text = (Path(__file__).resolve().parent.parent / "docs" / "spec.md").read_text()
    example = text.split("````markdown\n", 1)[1].split("\n````\n", 1)[0]
    t = parse(example)
    assert t.problems == [] and [(c.shown.split()[0], c.exit_status, c.norun) for c in t.commands] == [
        ("python", 0, False), ("pip", 0, False), ("python", 2, False), ("torchrun", 0, True)]
    assert [u.flags for u in uses(t.commands[3].text)] == [("--standalone", "--nproc-per-node")]

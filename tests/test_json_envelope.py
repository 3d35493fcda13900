"""Every command that takes `--json` answers with the envelope of core/verdict.py (docs/cli.md): command,
exit_code, steps, problems first, then the command's own keys. The commands are read from the argparse tree,
so a new command with `--json` is checked without anyone adding it here."""

from __future__ import annotations

import argparse
import json
import os

import pytest

from envport.cli import build_parser

from .support import run_envport

ENVELOPE = ["command", "exit_code", "steps", "problems"]
# A name no project has: each command refuses it (exit 2, a problem) or, where it takes none, runs for real.
MISSING = "no-such-env"
# Owned by another change: the lead removes an entry when that change is merged (strict: its fix XPASSes).
NOT_YET: dict[str, str] = {}


def json_commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(words, parser) for every leaf command of PARSER that has a --json option."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from json_commands(sub, path + (name,))
            return
    if any("--json" in a.option_strings for a in parser._actions):
        yield path, parser


def argv_for(words: tuple[str, ...], parser: argparse.ArgumentParser) -> list[str]:
    """WORDS, then a value for every positional and required option: its first choice, else MISSING."""
    argv = list(words)
    for a in parser._actions:
        if a.dest == "help" or (a.option_strings and not a.required):
            continue
        value = str(a.choices[0]) if a.choices else MISSING
        argv += [a.option_strings[0], value] if a.option_strings else [value]
    return argv + ["--json"]


COMMANDS = sorted(json_commands(build_parser()), key=lambda c: c[0])


def test_the_tree_has_the_commands_we_know():
    # A walk that found nothing would pass every case below by having none.
    names = {" ".join(words) for words, _ in COMMANDS}
    assert {"build", "up", "verify", "doctor", "slurm submit", "inspect"} <= names, names


@pytest.mark.parametrize("words, parser", [
    pytest.param(w, p, marks=[pytest.mark.xfail(reason=NOT_YET[" ".join(w)], strict=True)]
                 if " ".join(w) in NOT_YET else [], id=" ".join(w))
    for w, p in COMMANDS])
def test_every_json_command_answers_with_the_envelope(project, tmp_path, words, parser):
    env = {**os.environ, "ENVPORT_ENVS_DIR": str(tmp_path / "envs"), "ENVPORT_STATE_DIR": str(tmp_path / "state")}
    argv = argv_for(words, parser)
    proc = run_envport(*argv, root=project, env=env, timeout=300)
    try:
        data = json.loads(proc.stdout)
    except ValueError:
        raise AssertionError(f"envport {' '.join(argv)}: not JSON (exit {proc.returncode}):\n"
                             f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}") from None
    assert list(data)[:4] == ENVELOPE, f"envport {' '.join(argv)}: top-level keys {list(data)}"
    assert data["command"] == " ".join(words) and data["exit_code"] == proc.returncode, (data, proc.returncode)
    assert isinstance(data["steps"], list) and isinstance(data["problems"], list)
    if proc.returncode == 2:  # usage or an invalid spec: the JSON says which
        assert data["problems"], data

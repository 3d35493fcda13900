"""docs/cli.md's generated blocks: the command table from the argparse parser, the target table from the registry.

Each block sits between `<!-- NAME:begin -->` and `<!-- NAME:end -->`; everything outside the markers is
prose. `--target` choices come from the parser, which takes them from the target registry when it is built
(`registry.names(op)`), so a target that gains or loses an operation changes the table on regeneration.
Regenerate: `just docs` (or `write(path, build_parser())`); tests/test_cli_docs.py fails on drift.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

BLOCKS = ("commands", "targets")


def _subcommands(parser: argparse.ArgumentParser):
    """(name, help, subparser) of PARSER's subcommands, in the order they were added."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sp in action.choices.items():
                yield name, helps.get(name, ""), sp


def _choices(choices) -> str:
    return "|".join(str(c) for c in choices)


def _word(action: argparse.Action) -> str:
    """One argument as the synopsis shows it: `NAME`, `{a|b}`, `[--opt VALUE]`, `[--flag]`."""
    if not action.option_strings:
        if action.choices and not action.metavar:
            word = _choices(action.choices)
        else:
            word = action.metavar or action.dest.upper()
        word = f"{word}..." if action.nargs in ("*", "+") else word
        return f"[{word}]" if action.nargs in ("*", "?") else word
    opt = max(action.option_strings, key=len)
    if action.nargs == 0:
        word = opt
    elif action.choices is not None:
        word = f"{opt} {_choices(action.choices)}"
    else:
        word = f"{opt} {action.metavar or action.dest.upper()}"
    if isinstance(action, argparse._AppendAction):
        word += "..."
    return word if action.required else f"[{word}]"


def _rows(parser: argparse.ArgumentParser, prefix: str):
    for name, help_, sp in _subcommands(parser):
        cmd = f"{prefix} {name}"
        if any(isinstance(a, argparse._SubParsersAction) for a in sp._actions):
            yield from _rows(sp, cmd)
            continue
        words = [_word(a) for a in sp._actions if not isinstance(a, argparse._HelpAction)
                 and a.help != argparse.SUPPRESS]
        yield cmd, " ".join([cmd, *words]), help_


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def commands_table(parser: argparse.ArgumentParser) -> str:
    """Every command (two-word ones too) with its synopsis and its one-line help, as argparse has them."""
    rows = ["| command | what it does |", "|---|---|"]
    for _cmd, synopsis, help_ in _rows(parser, parser.prog):
        rows.append(f"| `{_cell(synopsis)}` | {_cell(help_)} |")
    return "\n".join(rows) + "\n"


def blocks(parser: argparse.ArgumentParser) -> dict[str, str]:
    from envport.targets.registry import docs_table

    return {"commands": commands_table(parser), "targets": docs_table()}


def render(text: str, parser: argparse.ArgumentParser) -> str:
    """TEXT with each generated block replaced by what the parser and registry say now."""
    for name, body in blocks(parser).items():
        pattern = re.compile(rf"(<!-- {name}:begin -->\n).*?(<!-- {name}:end -->)", re.S)
        if not pattern.search(text):
            raise ValueError(f"no <!-- {name}:begin --> ... <!-- {name}:end --> markers")
        text = pattern.sub(lambda m, body=body: m.group(1) + body + m.group(2), text)
    return text


def write(path: Path, parser: argparse.ArgumentParser, check: bool = False) -> bool:
    """Regenerate PATH's blocks; with CHECK, write nothing. True when the file was already current."""
    old = path.read_text(encoding="utf-8")
    new = render(old, parser)
    if new != old and not check:
        from envport.core.files import write_atomic

        write_atomic(path, new)
    return new == old

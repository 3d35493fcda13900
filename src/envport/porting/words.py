"""Shell words as bash reads them, with tree-sitter-bash (a C parser: no recursion limit, linear time).

`shlex` knows quotes only: `pkg-$(cut -f1,2 -d- <<< ${CUDA//./-})` became five words (`'$(cut'`,
`'<<<'`, ...) that an import took for package names, and a `# comment` became requirements.  Measured
before choosing (tests/test_import_words.py keeps the cases): on `pip install` + 20,000 words
tree-sitter-bash took 0.33 s and bashlex 2.4 s, and bashlex ended `echo $($(…))` nested 5,000 deep in
a RecursionError where tree-sitter-bash parsed it in 0.02 s.

A word that runs something when the line runs (`$(…)`, a backtick, a here-string) is kept as written,
one word: its value is unknown to an import.  Every other word is unquoted as the shell would (shlex on
that one word).  Text tree-sitter cannot parse falls back to shlex, as before.
"""

from __future__ import annotations

import functools
import re
import shlex

# Nodes whose children are the words (a command, its redirects, a pipeline's commands).
_CONTAINERS = frozenset({"program", "redirected_statement", "command", "pipeline", "list"})
COMPUTED = re.compile(r"\$\(|`|<<<")


@functools.lru_cache(maxsize=1)
def _parser():
    import tree_sitter
    import tree_sitter_bash

    return tree_sitter.Parser(tree_sitter.Language(tree_sitter_bash.language()))


def _tree(text: str):
    data = text.encode("utf-8")
    return data, _parser().parse(data).root_node


# `pip install a `# why a is pinned` b`: the Dockerfile idiom for a comment inside a continued line.  Bash
# runs the backticks' body, a comment, so they expand to nothing; tree-sitter-bash reads the `#` as a
# comment to the end of the line, which swallowed every package after it (and the closing backtick).
_BACKTICK_COMMENT = re.compile(r"`[ \t]*#[^`\n]*`")


def _drop_backtick_comments(text: str) -> str:
    """TEXT without backtick substitutions that hold only a comment, outside single quotes."""
    out, last, quoted = [], 0, False
    for i, c in enumerate(text):
        if i < last:
            continue
        if c == "'" and (i == 0 or text[i - 1] != "\\"):
            quoted = not quoted
        elif c == "`" and not quoted and (m := _BACKTICK_COMMENT.match(text, i)):
            out.append(text[last:i])
            last = m.end()
    return "".join(out) + text[last:] if out else text


def strip_comments(text: str) -> str:
    """TEXT without its shell comments (`# …` where bash starts one, not inside quotes or words)."""
    if "#" not in text:
        return text
    text = _drop_backtick_comments(text)
    data, root = _tree(text)
    cuts, stack = [], [root]
    while stack:
        node = stack.pop()
        if node.type == "comment":
            cuts.append((node.start_byte, node.end_byte))
        else:
            stack.extend(node.children)
    for start, end in sorted(cuts, reverse=True):
        data = data[:start] + data[end:]
    return data.decode("utf-8").rstrip()


def split(text: str) -> list[str]:
    """The words of one simple command (or pipeline); ValueError where shlex cannot split it either."""
    data, root = _tree(text)
    if root.has_error:
        return shlex.split(text, comments=True)
    out: list[str] = []
    stack = [root]
    while stack:
        node = stack.pop()
        if node.type == "comment":
            continue
        if node.type in _CONTAINERS:
            stack.extend(reversed(node.children))
            continue
        raw = data[node.start_byte:node.end_byte].decode("utf-8")
        if not node.is_named or COMPUTED.search(raw):
            out.append(raw)  # an operator (`|`), or a word whose value is computed when it runs
        else:
            out.extend(shlex.split(raw))
    return out

"""docs/cli.md's reason table lists every reason token the code can print (issue 27 row 1).

The tokens are found in src/ by reading its syntax: a constant passed as `reason` (by keyword, or at the
place a class or function takes its `reason` parameter), assigned to a `reason` or `*_REASON` name, or
the value of a `"reason"` key. A new token with no row fails here, naming the file and line it is in.
"""

from __future__ import annotations

import ast
import re

from .support import REPO

SRC = REPO / "src" / "envport"
TOKEN = re.compile(r"^[a-z]+(_[a-z0-9]+)*$")
# Constants the finder reads that are no envport token, each with why.
NOT_TOKENS = {
    "unknown": "witness/slurm_job.py: the Slurm pending Reason when Slurm gives none; printed as Slurm's "
               "Reason=..., the step's token is pending_timeout",
}


def _reason_positions(trees) -> dict[str, int]:
    """Each class or function that takes a `reason`, and its positional index."""
    pos: dict[str, int] = {}
    for tree in trees:
        for n in ast.walk(tree):
            if isinstance(n, ast.ClassDef):
                fields = [s.target.id for s in n.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]
                if "reason" in fields:
                    pos[n.name] = fields.index("reason")
                for s in n.body:
                    if isinstance(s, ast.FunctionDef) and s.name == "__init__":
                        names = [a.arg for a in s.args.args][1:]
                        if "reason" in names:
                            pos[n.name] = names.index("reason")
            elif isinstance(n, ast.FunctionDef) and n.name != "__init__":
                names = [a.arg for a in n.args.args]
                names = names[1:] if names[:1] == ["self"] else names
                if "reason" in names:
                    pos.setdefault(n.name, names.index("reason"))
    return pos


def _constants(node):
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node
    elif isinstance(node, ast.IfExp):
        yield from _constants(node.body)
        yield from _constants(node.orelse)
    elif isinstance(node, ast.BoolOp):
        for value in node.values:
            yield from _constants(value)


def _name(node) -> str:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""


def code_tokens() -> dict[str, str]:
    """token -> the first `path:line` that names it."""
    trees = {f: ast.parse(f.read_text(), str(f)) for f in sorted(SRC.rglob("*.py"))}
    pos = _reason_positions(trees.values())
    found: dict[str, str] = {}
    for path, tree in trees.items():
        for n in ast.walk(tree):
            values = []
            if isinstance(n, ast.Call):
                at = pos.get(_name(n.func))
                if at is not None and len(n.args) > at and not any(isinstance(a, ast.Starred) for a in n.args[:at + 1]):
                    values.append(n.args[at])
                values += [k.value for k in n.keywords if k.arg == "reason"]
            elif isinstance(n, (ast.Assign, ast.AnnAssign)):
                targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                if any(_name(t) == "reason" or _name(t).endswith("_REASON") for t in targets) and n.value is not None:
                    values.append(n.value)
            elif isinstance(n, ast.Dict):
                values += [v for k, v in zip(n.keys, n.values) if isinstance(k, ast.Constant) and k.value == "reason"]
            for c in (c for v in values for c in _constants(v)):
                if TOKEN.match(c.value):
                    found.setdefault(c.value, f"{path.relative_to(REPO)}:{c.lineno}")
    return found


def documented_tokens() -> set[str]:
    doc = (REPO / "docs" / "cli.md").read_text()
    section = doc[doc.index("## Reasons (REFUSED)"):]
    section = section[:section.index("\n## ", 1)]
    failed = section[section.index("FAILED reasons"):]
    return set(re.findall(r"^\| `([a-z0-9_]+)` \|", section, re.M)) | set(re.findall(r"`([a-z0-9_]+)`", failed))


def test_the_finder_sees_tokens_of_every_form():
    found = code_tokens()
    # keyword, a class's positional reason, an IfExp's branches, and a *_REASON constant
    for token in ("docker_unreachable", "lock_env", "base_image_unreadable", "lock_source"):
        assert token in found, token


def test_docs_cli_md_lists_every_reason_token_the_code_can_print():
    found = {t: w for t, w in code_tokens().items() if t not in NOT_TOKENS}
    missing = sorted(f"{t} ({w})" for t, w in found.items() if t not in documented_tokens())
    assert not missing, "docs/cli.md's reason table has no row for: " + ", ".join(missing)

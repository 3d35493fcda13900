"""Renderers: pure functions `plan -> {filename: text}`, one module + one template per target.

Importable as `envport.renderers` (pyproject maps this top-level folder into
the package).  Bump RENDERER_VERSION whenever a template change would change
what gets built: it feeds the content hash, so every env is rebuilt.
"""

from __future__ import annotations

import hashlib
import importlib
import shlex
from pathlib import Path

import jinja2

TARGETS = ("docker", "apptainer", "shell")
TEMPLATES = Path(__file__).parent


def _renderer_version() -> str:
    """The renderer generation plus a digest of every template and renderer module.

    It feeds the content hash, so a template change that alters what gets built
    can never keep an old env's name by someone forgetting to bump a number.
    """
    digest = hashlib.sha256()
    for path in sorted(TEMPLATES.iterdir()):
        if path.suffix in (".j2", ".py"):
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return f"1+{digest.hexdigest()[:12]}"


RENDERER_VERSION = _renderer_version()


def docker_quote(value: str) -> str:
    """A Dockerfile ENV/LABEL value that reaches the container byte-for-byte.

    Docker substitutes $VAR inside ENV and unescapes backslashes inside double
    quotes (RECIPES.md, measured), so JSON quoting alone is not literal.
    """
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$")
    return f'"{escaped}"'


def def_quote(value: str) -> str:
    """A double-quoted path for a `.def` %files line (spaces allowed, nothing else special)."""
    return f'"{value}"'


# shlex.quote leaves a reserved word bare: `for pkg in jzndt do; do` is still bash, but shellcheck (and a
# reader) takes the package `do` for the keyword, so reserved words are quoted as well.
SHELL_RESERVED = frozenset("if then else elif fi case esac for select while until do done in function time coproc"
                           .split())


def shell_word(value) -> str:
    """VALUE as one POSIX shell word: shlex.quote, and a bare reserved word quoted too."""
    text = str(value)
    return f"'{text}'" if text in SHELL_RESERVED else shlex.quote(text)


def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        # Shell's ${#array[@]} would open a Jinja comment with the default `{#`.
        comment_start_string="{##",
        comment_end_string="##}",
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["q"] = shell_word
    env.filters["dq"] = docker_quote
    env.filters["defq"] = def_quote
    # `K="v" \<newline>    K2="v2"`: Dockerfile ENV/LABEL pairs, one per line.
    env.filters["docker_pairs"] = lambda pairs, indent: (" \\\n" + " " * indent).join(
        f"{k}={docker_quote(v)}" for k, v in pairs
    )
    return env


ENV = _env()


def template(name: str) -> jinja2.Template:
    return ENV.get_template(name)


def render_target(target: str, plan, hash_: str) -> dict[str, str]:
    """Render one target: {relative file name: text}."""
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; expected one of {', '.join(TARGETS)}")
    module = importlib.import_module(f"{__name__}.{target}")
    return module.render(plan, hash_)

"""One `pip install …` call -> one pip phase, read with pip's own option names.

Seed 004: each phase is one pip invocation and their order is load-bearing,
so a call's options apply to the whole phase wherever they were written:
`pip install torch -f URL` puts URL on the phase, and `-r FILE` brings the
file's requirements AND its option lines (`--index-url`, `-f`, `--pre`) into
the same call, as pip does.  An option the spec has no field for is dropped
and reported with what it did.
"""

from __future__ import annotations

import re
import shlex
from typing import Optional

from envport.porting.report import DROPPED, REPORTED, Phase
from envport.porting.requirements import (
    MAX_DEPTH,
    PipContext,
    add_requirement,
    expand,
    LINE_OPTION,
    requirement,
)

# pip's option names, by what envport does with them.  Value-taking options
# must be known so their value is not read as a requirement.
FIELD_VALUE = {"-i": "index_url", "--index-url": "index_url", "--extra-index-url": "extra_index_urls",
               "-f": "find_links", "--find-links": "find_links"}
FIELD_FLAG = {"--no-deps": "no_deps", "--force-reinstall": "force_reinstall", "--pre": "pre"}
QUIET_FLAG = {"--no-cache-dir", "--disable-pip-version-check", "-q", "--quiet", "-v", "--verbose",
              "--no-warn-script-location", "--break-system-packages", "--no-input", "--no-color", "--isolated",
              "--no-compile", "--compile", "--no-clean", "-y", "--yes"}
QUIET_VALUE = {"--progress-bar", "--root-user-action", "--timeout", "--default-timeout", "--retries",
               "--cache-dir", "--log", "--exists-action"}
REPORT_FLAG = {
    "-U": "upgrades what is already installed; envport's phases install without it, which is the same for "
          "pinned requirements and may keep an older version of an unpinned one",
    "--upgrade": "upgrades what is already installed; envport's phases install without it, which is the same "
                 "for pinned requirements and may keep an older version of an unpinned one",
    "--no-index": "sources are a site's business: a site profile's wheelhouse gives --no-index per place",
    "--user": "envport installs into the env's own venv",
    "-I": "reinstalling over what is there has no spec field (force_reinstall is the nearest)",
    "--ignore-installed": "reinstalling over what is there has no spec field (force_reinstall is the nearest)",
    "--no-build-isolation": "no spec field; builds use pip's default isolation",
    "--require-hashes": "the lock (specs/NAME.lock) carries hashes and replays phases with --require-hashes",
    "--prefer-binary": "no spec field",
    "--ignore-requires-python": "no spec field",
    "--no-warn-conflicts": "no spec field",
    "--use-pep517": "no spec field", "--no-use-pep517": "no spec field",
    "--dry-run": "a dry run installs nothing",
    "--check-build-dependencies": "no spec field",
}
REPORT_VALUE = {
    "-t": "envport installs into the env's own venv", "--target": "envport installs into the env's own venv",
    "--prefix": "envport installs into the env's own venv", "--root": "envport installs into the env's own venv",
    "--src": "no spec field", "--platform": "no spec field", "--python-version": "no spec field",
    "--implementation": "no spec field", "--abi": "no spec field", "--upgrade-strategy": "no spec field",
    "-C": "no spec field", "--config-settings": "no spec field", "--global-option": "no spec field",
    "--no-binary": "no spec field", "--only-binary": "no spec field",
    "--cert": "a site profile's CA bundle", "--client-cert": "no spec field", "--proxy": "a site's business",
    "--use-feature": "no spec field", "--use-deprecated": "no spec field", "--keyring-provider": "no spec field",
    "--report": "no spec field", "--python": "envport runs the env's own pip", "--hash": "the lock carries hashes",
}


def _split(word: str) -> tuple[str, Optional[str]]:
    if word.startswith("--") and "=" in word:
        opt, _, value = word.partition("=")
        return opt, value
    if len(word) > 2 and word[0] == "-" and word[1] != "-" and word[:2] in ("-i", "-f", "-r", "-c", "-e", "-t", "-C"):
        return word[:2], word[2:]
    return word, None


def _short_flags(word: str) -> Optional[list[str]]:
    """`-qU` is `-q -U` (optparse); None when WORD is not a cluster of known short flags."""
    if len(word) > 2 and word[0] == "-" and word[1] != "-":
        flags = [f"-{c}" for c in word[1:]]
        if all(f in QUIET_FLAG or f in REPORT_FLAG for f in flags):
            return flags
    return None


def apply_options(words: list[str], ctx: PipContext, phase: Phase, in_file: bool = False) -> list[str]:
    """Apply pip options in WORDS to PHASE; return the words that are requirements."""
    reqs: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if not word.startswith("-") or word == "-":
            reqs.append(word)
            continue
        cluster = _short_flags(word)
        if cluster:
            for flag in cluster:
                _flag(flag, ctx, phase, word)
            continue
        opt, value = _split(word)
        takes_value = opt in FIELD_VALUE or opt in QUIET_VALUE or opt in REPORT_VALUE or \
            opt in ("-r", "--requirement", "-c", "--constraint", "-e", "--editable", "--trusted-host")
        if takes_value and value is None:
            if i >= len(words):
                ctx.note(word, DROPPED, "the option's value is missing")
                break
            value = words[i]
            i += 1
        if takes_value:
            _value_option(opt, value or "", ctx, phase)
        else:
            _flag(opt, ctx, phase, word)
    return reqs


def _flag(opt: str, ctx: PipContext, phase: Phase, written: str) -> None:
    if opt in FIELD_FLAG:
        setattr(phase, FIELD_FLAG[opt], True)
    elif opt in QUIET_FLAG:
        pass  # envport's renderers pass their own (--no-cache-dir, --disable-pip-version-check)
    elif opt in REPORT_FLAG:
        ctx.note(f"pip install {written}", DROPPED, REPORT_FLAG[opt])
    else:
        ctx.note(f"pip install {written}", DROPPED, "not an option envport knows for `pip install`")


def _value_option(opt: str, value: str, ctx: PipContext, phase: Phase) -> None:
    shown = f"{opt} {value}"
    if opt in QUIET_VALUE:
        return
    if opt == "--trusted-host":
        from envport.porting.security import note_insecure

        note_insecure(ctx.draft, "pip", [opt, value], ctx.line, ctx.file)
        return
    if opt in REPORT_VALUE:
        ctx.note(shown, DROPPED, REPORT_VALUE[opt])
        return
    if opt in ("-r", "--requirement"):
        _include(value, ctx, phase)
        return
    if opt in ("-c", "--constraint"):
        ctx.note(shown, DROPPED, "constraints files have no spec field",
                 "pin the constrained packages in the phase that needs them")
        return
    if opt in ("-e", "--editable"):
        req = requirement(value, ctx)
        if req:
            ctx.note(shown, REPORTED, "installed as a regular (not editable) requirement")
            add_requirement(phase, req, ctx)
        return
    value = expand(value, ctx)
    if value is None:
        return
    field = FIELD_VALUE[opt]
    from envport.spec.model import URL_RE

    if not URL_RE.match(value) and not value.startswith("/"):
        ctx.note(shown, DROPPED, f"{value!r} is neither an http(s)/file URL nor an absolute path",
                 "give the index or find-links as a URL, or an absolute container path")
        return
    if field == "index_url":
        if phase.index_url and phase.index_url != value:
            ctx.note(shown, REPORTED, f"a second --index-url; pip uses the last one, the phase keeps {value!r}")
        phase.index_url = value
    else:
        target = getattr(phase, field)
        if value not in target:
            target.append(value)


def _include(path: str, ctx: PipContext, phase: Phase) -> None:
    expanded = expand(path, ctx)
    if expanded is None:
        return
    if ctx.depth >= MAX_DEPTH:
        ctx.note(f"-r {path}", DROPPED, f"requirements files nested more than {MAX_DEPTH} deep (a cycle?)")
        return
    found = ctx.open_file(expanded)
    if found is None:
        # Named, never read: a file outside the context (`../../x`, a link) could be anyone's.
        ctx.draft.lose(ctx.line, f"-r {path}", "the requirements file is not a file inside the build context "
                       "(missing, or outside it through `..` or a link; envport reads -r files only inside it), so "
                       "its requirements are unknown", "put it next to the recipe (or pass --context DIR) and "
                       "import again", file=ctx.file)
        return
    text, label = found
    sub = PipContext(ctx.draft, label, None, ctx.open_file, ctx.variables, ctx.depth + 1, ctx.python)
    requirements_file(text, label, sub, phase)


def install_phase(words: list[str], ctx: PipContext) -> Optional[Phase]:
    """WORDS: what follows `pip install`.  None (and notes) when nothing installable is left."""
    phase = Phase(packages=[], file=ctx.file, line=ctx.line)
    for word in apply_options(words, ctx, phase):
        word = expand(word, ctx)
        if word is None:
            continue
        req = requirement(word, ctx)
        if req:
            add_requirement(phase, req, ctx)
    if not phase.packages:
        ctx.note("pip install " + " ".join(words), DROPPED, "no requirement in this pip call maps onto the spec "
                 "(see the lines above)")
        return None
    return phase


def requirements_file(text: str, label: str, ctx: PipContext, phase: Phase, first_line: int = 1) -> None:
    """Add a requirements file's requirements and options to PHASE (one pip call reads the whole file)."""
    logical, start = "", 0
    for no, raw in enumerate(text.splitlines(), start=first_line):
        if not logical:
            start = no
        if raw.endswith("\\"):
            logical += raw[:-1] + " "
            continue
        line, logical = (logical + raw), ""
        line = re.sub(r"(^|\s)#.*$", "", line).strip()
        if not line:
            continue
        sub = PipContext(ctx.draft, label, start, ctx.open_file, ctx.variables, ctx.depth, ctx.python)
        if line.startswith("-"):
            try:
                words = shlex.split(line)
            except ValueError:
                sub.note(line, DROPPED, "unbalanced quotes")
                continue
            apply_options(words, sub, phase, in_file=True)
            continue
        cut = LINE_OPTION.search(line)
        if cut:
            sub.note(line[cut.start():].strip(), DROPPED, "per-requirement options (--hash, --config-settings) have "
                     "no spec field; the lock records hashes")
            line = line[: cut.start()].strip()
        req = requirement(line, sub)
        if req:
            add_requirement(phase, req, sub)

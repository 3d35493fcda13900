"""Requirement strings and requirements files, read with `packaging` the way pip reads them.

A requirement maps onto a spec requirement when `packaging` accepts it and
the spec can carry it: a name with a version specifier, or a PEP 508 direct
reference (`name @ git+https://…@<commit>`, `name @ https://…/x.whl#sha256=…`).
What the spec cannot carry is reported, never guessed: a local path (it
exists on the machine that built the recipe, not on every target), an
environment marker (evaluated for a Linux x86_64 env and dropped), a hash
(`--hash`: the lock carries hashes).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Optional

from packaging.markers import InvalidMarker
from packaging.requirements import InvalidRequirement, Requirement

from envport.core.nesting import too_deep
from envport.porting.envvars import substitute, too_long
from envport.porting.report import DROPPED, REPORTED, Draft, Phase, turned_into

SHA40 = re.compile(r"^[0-9a-f]{40}$")
ARCHIVE_EXT = (".whl", ".tar.gz", ".zip", ".tar.bz2", ".tgz")
MAX_DEPTH = 8  # -r inside -r inside ...: pip has no bound, a cycle would loop
LINE_OPTION = re.compile(r"\s-{1,2}[a-zA-Z]")


@dataclass
class PipContext:
    """Where a pip call or a requirements line is read, and how `-r FILE` finds its file."""

    draft: Draft
    file: str
    line: Optional[int]
    # path as written (relative to the build's cwd) -> (text, label for notes) or None when absent
    open_file: Callable[[str], Optional[tuple[str, str]]] = lambda p: None
    variables: Optional[dict[str, str]] = None  # ARG defaults / ENV values known at this point
    depth: int = 0
    python: str = "3.11"

    def note(self, construct: str, action: str, why: str, fix: str = "") -> None:
        self.draft.note(self.line, construct, action, why, fix, file=self.file)


def expand(word: str, ctx: PipContext) -> Optional[str]:
    """$VAR / ${VAR} from the values known where the line runs; None (reported) when one is unknown."""
    out, unknown = substitute(word, ctx.variables or {})
    if unknown:
        ctx.note(word, DROPPED, f"${unknown[0]} is not set by the recipe where this line runs, so its value is "
                 "unknown here", "write the value into the spec's pip_phases")
        return None
    if out is None:
        ctx.note(word, DROPPED, *too_long("envport does not read it"))
    return out


def _marker_env(python: str) -> dict[str, str]:
    return {"python_version": python, "python_full_version": python + ".0", "sys_platform": "linux",
            "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
            "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}


def is_local_path(text: str) -> bool:
    return text in (".", "..") or text.startswith(("./", "../", "/", "~", "file:")) or \
        (text.endswith(ARCHIVE_EXT) and "://" not in text) or (("/" in text) and "://" not in text
                                                                 and " @ " not in text and "@" not in text)


def _name_from_url(url: str) -> Optional[str]:
    egg = re.search(r"#egg=([A-Za-z0-9._-]+)", url)
    if egg:
        return egg.group(1)
    path = url.split("#", 1)[0].split("?", 1)[0].rstrip("/")
    last = path.rsplit("/", 1)[-1]
    if last.endswith(".whl"):
        return last.split("-", 1)[0]
    last = re.sub(r"(\.git)?(@.*)?$", "", last)
    for ext in ARCHIVE_EXT:
        if last.endswith(ext):
            last = re.sub(r"-\d[^-]*$", "", last[: -len(ext)])
    return last or None


# `pip install .`, `./`, `.[extra]`: the project whose checkout the recipe is built in.
PROJECT_ITSELF = re.compile(r"^\.(/)?(\[[A-Za-z0-9_,.\s-]+\])?$")


def project_name(ctx: PipContext) -> Optional[str]:
    """The project's distribution name, from pyproject.toml's [project] or setup.cfg's [metadata] in the
    build context; None when neither names it."""
    import configparser
    import tomllib

    found = ctx.open_file("pyproject.toml")
    if found:
        try:
            name = tomllib.loads(found[0]).get("project", {}).get("name")
        except tomllib.TOMLDecodeError:
            name = None
        if isinstance(name, str) and name:
            return name
    found = ctx.open_file("setup.cfg")
    if found:
        cfg = configparser.ConfigParser(interpolation=None)
        try:
            cfg.read_string(found[0])
            return cfg.get("metadata", "name", fallback=None) or None
        except configparser.Error:
            return None
    return None


def _project_itself(text: str, ctx: PipContext) -> Optional[str]:
    """`pip install .` -> `name @ git+URL@SHA` from `import --repo URL --commit SHA`; without them the
    install is lost (exit 1) with exactly that fix."""
    extras = PROJECT_ITSELF.match(text).group(2) or ""
    if ctx.draft.project_repo is None:
        ctx.draft.lose(ctx.line, text, "installs the project the recipe is built in, from its checkout: a spec "
                       "installs from a place every target can reach", "import again with --repo URL --commit "
                       "SHA (the project's git URL and the full commit): it becomes `name @ git+URL@SHA`",
                       file=ctx.file)
        return None
    url, sha = ctx.draft.project_repo
    name = project_name(ctx) or re.sub(r"\.git$", "", url.rstrip("/").rsplit("/", 1)[-1])
    req = f"{name}{extras.replace(' ', '')} @ git+{url}@{sha}"
    ctx.note(text, turned_into("a direct reference"), f"the project itself, from --repo at --commit: {req}"
             + ("" if project_name(ctx) else " (the name from the URL: no pyproject.toml/setup.cfg names it)"),
             "check the name is the distribution's")
    return req


def requirement(text: str, ctx: PipContext) -> Optional[str]:
    """The spec requirement for one requirement as written in a recipe, or None (and a note)."""
    text = text.strip()
    if not text:
        return None
    if PROJECT_ITSELF.match(text):
        return _project_itself(text, ctx)
    if is_local_path(text) or re.match(r"^[A-Za-z0-9._-]+\s*@\s*file:", text):
        # It installs software the spec would lack: lost, so the import does not exit 0 without it.
        ctx.draft.lose(ctx.line, text, "a local path exists on the machine that built this recipe, not on every "
                       "target; envport does not guess where it lives",
                       "build a wheel and pin it as `name @ https://…/name-1.0-py3-none-any.whl#sha256=…`, put "
                       "it in a find_links directory, or (the project itself) import with --repo URL --commit SHA",
                       file=ctx.file)
        return None
    if re.match(r"^(git|hg|svn|bzr)\+", text) or (re.match(r"^https?://", text) and " @ " not in text):
        name = _name_from_url(text)
        url = re.sub(r"#egg=[^&]*&?", "#", text).rstrip("#")
        if not name:
            ctx.note(text, DROPPED, "a URL without a package name", "write it as `name @ URL`")
            return None
        ctx.note(text, turned_into("a direct reference"), f"written as `{name} @ …`; the name comes from "
                 f"{'#egg=' if '#egg=' in text else 'the URL'}", "check the name is the distribution's")
        text = f"{name} @ {url}"
    if deep := too_deep(text):
        ctx.note(text, DROPPED, f"{deep}: envport does not read it", "fix it in the source and import again")
        return None
    try:
        req = Requirement(text)
    except (InvalidRequirement, InvalidMarker) as exc:
        ctx.note(text, DROPPED, f"not a requirement pip would accept ({str(exc).splitlines()[0]})",
                 "fix it in the source and import again, or add it to pip_phases by hand")
        return None
    out = text
    if req.marker is not None:
        head = text.split(";", 1)[0].strip()
        if req.marker.evaluate(_marker_env(ctx.python)):
            ctx.note(text, turned_into("a requirement without its marker"),
                     f"the spec has no markers; `{req.marker}` holds for a Linux x86_64 python {ctx.python} env")
            out = head
        else:
            ctx.note(text, DROPPED, f"its marker `{req.marker}` is false for a Linux x86_64 python {ctx.python} env")
            return None
    if req.url:
        _direct_reference(out, req, ctx)
    elif not any(s.operator in ("==", "===") for s in req.specifier):
        ctx.note(out, REPORTED, "unpinned: the build installs whatever is newest that day",
                 f"pin it (`{req.name}==X.Y`) once a build works")
    return out


def _direct_reference(text: str, req: Requirement, ctx: PipContext) -> None:
    url = req.url or ""
    if url.startswith("git+"):
        path = url.split("://", 1)[-1].split("#", 1)[0]
        ref = path.rsplit("@", 1)[1] if "@" in path.split("/", 1)[-1] else ""
        if not SHA40.match(ref):
            what = f"ref {ref!r} is a branch or tag" if ref else "no ref: the default branch"
            ctx.note(text, REPORTED, f"{what}; the env changes when it moves and the spec's hash does not",
                     "pin the full 40-hex commit: `@<sha>`")
    elif "#sha256=" not in url:
        ctx.note(text, REPORTED, "an archive URL without #sha256=: the spec refuses it (the file could change)",
                 "append #sha256=<sha256sum of the file>")


def add_requirement(phase: Phase, req: str, ctx: PipContext) -> None:
    from envport.spec.model import canonical_name

    name = canonical_name(Requirement(req).name)
    for have in phase.packages:
        if canonical_name(Requirement(have).name) == name:
            ctx.note(req, DROPPED, f"{name} is already in this pip call as {have!r}; pip refuses one name twice",
                     "keep the one the env needs")
            return
    phase.packages.append(req)

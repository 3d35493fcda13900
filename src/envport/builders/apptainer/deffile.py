"""Read an Apptainer definition file the way `apptainer build` splits it.

Apptainer's parser (pkg/build/types/parser/deffile.go) is the reference:

- a section starts on any line whose first word begins with `%`; its name is
  that word, lowercased, and the rest of the line is its arguments; the body is
  every following line up to the next section line, kept byte for byte (a
  section given twice is concatenated);
- the header is the `Key: value` lines before the first section, keys
  lowercased, `#` comments dropped, a trailing `\\` continuing the value;
- `%labels` lines are `KEY VALUE` (split at the first space);
- `%files` lines are `SRC [DST]`, each a bare word or a "double-quoted" string.

Where apptainer would silently do something surprising (a third word on a
`%files` line is dropped; a single-quoted path keeps its quote), this reader
refuses and says why.  Sections that run on the build host (`%setup`, `%pre`),
build-time templating (`%arguments`), SCIF apps and multi-stage builds are
refused as unsupported: envport's own builder does not run them.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

SCRIPT_SECTIONS = ("environment", "post", "runscript", "test", "help", "startscript")
DATA_SECTIONS = ("labels", "files")
SUPPORTED = frozenset(SCRIPT_SECTIONS + DATA_SECTIONS)
UNSUPPORTED = {
    "setup": "%setup runs on the build host as root, outside the image; envport's builder never runs "
             "host scripts: move the work into %post (or %files for copies)",
    "pre": "%pre runs on the build host before bootstrap; move the work into %post",
    "arguments": "%arguments (build-time {{ templating }}) is not supported; render the values into the .def",
}
APP_SECTIONS = frozenset({"appinstall", "applabels", "appfiles", "appenv", "apptest", "apphelp", "apprun",
                          "appstart"})
# Sections whose arguments apptainer uses as interpreter options (`%runscript -c /bin/bash`).
ARGS_ALLOWED = frozenset({"runscript", "test", "startscript"})
HEADER_KEYS = frozenset({
    "bootstrap", "from", "includecmd", "mirrorurl", "updateurl", "osversion", "include", "library",
    "registry", "namespace", "stage", "product", "user", "regcode", "productpgp", "registerurl",
    "modules", "fingerprints", "confurl", "setopt",
})
STEP_LINE = re.compile(r"envport: step (\d+)/(\d+) (.*)")
STEP_COMMENT = re.compile(r"\s*# step (\d+)/(\d+) ([^:\s]+):")
FILES_TOKEN = re.compile(r'"([^"]*)"|(\S+)')


class DefError(ValueError):
    """A definition file envport cannot build; names the file and line."""

    def __init__(self, reason: str, source: str, line: int | None, message: str):
        where = f"{source}:{line}" if line else source
        super().__init__(f"{where}: {message}")
        self.reason = reason
        self.source = source
        self.line = line


@dataclass(frozen=True)
class FileCopy:
    src: str
    dst: str  # "" means: the same path as src, inside the image
    line: int


@dataclass(frozen=True)
class Section:
    name: str
    args: str
    body: str
    line: int  # the `%name` line


@dataclass(frozen=True)
class PostStep:
    n: int
    total: int
    title: str
    marker: str  # the plan step's marker from the `# step i/n MARKER:` comment, or ""
    line: int


@dataclass(frozen=True)
class DefFile:
    text: str
    source: str
    header: dict[str, str]
    sections: tuple[Section, ...]
    labels: tuple[tuple[str, str], ...]
    files: tuple[FileCopy, ...]
    steps: tuple[PostStep, ...] = field(default=())

    @property
    def bootstrap(self) -> str:
        return self.header.get("bootstrap", "")

    @property
    def base(self) -> str:
        return self.header.get("from", "")

    def script(self, name: str) -> str:
        """The body of %NAME, "" when the def has none (repeated sections joined, as apptainer does)."""
        return "".join(s.body for s in self.sections if s.name == name)

    def args(self, name: str) -> str:
        found = [s.args for s in self.sections if s.name == name and s.args]
        return found[-1] if found else ""

    def has(self, name: str) -> bool:
        return any(s.name == name for s in self.sections)


def match_step(line: str) -> tuple[int, int, str] | None:
    """(i, n, title) when LINE is a `envport: step i/n title` progress line of %post's output."""
    m = STEP_LINE.fullmatch(line.rstrip("\r\n"))
    return (int(m.group(1)), int(m.group(2)), m.group(3)) if m else None


def _split(text: str, source: str) -> tuple[list[tuple[int, str]], list[tuple[int, str, list[str]]]]:
    """Header lines and raw sections [(line no, `%` line, body lines)]."""
    header, sections = [], []
    # Lines as Go's bufio.ScanLines cuts them (only \n, a trailing \r dropped), each given back its
    # \n: what apptainer writes into the image's scripts.
    for no, bare in enumerate(text.removesuffix("\n").split("\n"), start=1):
        line = bare.removesuffix("\r") + "\n"
        words = line.split()
        if words and words[0].startswith("%"):
            if line[0] != "%":
                raise DefError("indented_section", source, no,
                               f"section line {line.strip()!r} is indented; apptainer only reads section "
                               "names at the start of a line: remove the leading whitespace")
            sections.append((no, line.rstrip("\r\n"), []))
        elif sections:
            sections[-1][2].append(line)
        else:
            header.append((no, line))
    return header, sections


def _parse_header(lines: list[tuple[int, str]], source: str) -> dict[str, str]:
    header: dict[str, str] = {}
    cont_key, cont_val = "", ""
    for no, raw in lines:
        line = raw.strip()
        if not line or line.startswith("#"):
            if cont_key:
                header[cont_key], cont_key, cont_val = cont_val, "", ""
            continue
        line = line.split("#", 1)[0]
        if cont_key:
            key, val, cont_key, cont_val = cont_key, cont_val + line.strip(), "", ""
        else:
            key, sep, val = line.partition(":")
            if not sep:
                raise DefError("bad_header", source, no, f"header line {line.strip()!r} has no ':'; "
                                                         "write `Key: value` (e.g. `Bootstrap: docker`)")
            key, val = key.strip().lower(), val.strip()
        if val.endswith("\\"):
            cont_key, cont_val = key, val[:-1]
            continue
        if key not in HEADER_KEYS and re.sub(r"\d+$", "", key) != "otherurl":
            raise DefError("bad_header", source, no, f"unknown header keyword {key!r}; apptainer accepts "
                                                     f"{', '.join(sorted(HEADER_KEYS))}")
        if key in header:
            raise DefError("bad_header", source, no, f"header keyword {key!r} given twice")
        header[key] = val
    if cont_key:
        header[cont_key] = cont_val
    return header


def _section(no: int, line: str, body: list[str], source: str) -> Section:
    name, _, args = line[1:].partition(" ")
    name, args = name.strip().lower(), args.strip()
    if name in UNSUPPORTED:
        raise DefError("unsupported_section", source, no, f"%{name}: {UNSUPPORTED[name]}")
    if name in APP_SECTIONS:
        raise DefError("unsupported_section", source, no,
                       f"%{name}: SCIF app sections are not supported by envport's builder")
    if name not in SUPPORTED:
        raise DefError("unknown_section", source, no, f"unknown section %{name}; apptainer refuses it too "
                                                      f"(known: {', '.join(sorted(SUPPORTED))})")
    if args and name not in ARGS_ALLOWED:
        what = "multi-stage `%files from STAGE`" if name == "files" else f"arguments to %{name}"
        raise DefError("unsupported_section", source, no, f"{what} ({args!r}) not supported by envport's "
                                                          "builder; drop them")
    return Section(name=name, args=args, body="".join(body), line=no)


def _lines(section: Section) -> list[str]:
    """A section's body lines, cut at \n only as apptainer's scanner cuts them: str.splitlines() would also
    cut at U+2028, U+2029 and U+0085, so one label line holding one would read here as two labels."""
    return section.body.removesuffix("\n").split("\n") if section.body else []


def _labels(section: Section) -> list[tuple[str, str]]:
    out = []
    for line in _lines(section):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, _, val = line.partition(" ")
        out.append((key.strip(), val.strip()))
    return out


def _files(section: Section, source: str) -> list[FileCopy]:
    out = []
    for offset, raw in enumerate(_lines(section), start=1):
        no, line = section.line + offset, raw.strip()
        if not line or line.startswith("#"):
            continue
        if "'" in line:
            raise DefError("bad_files_line", source, no, f"%files line {line!r} uses single quotes, which "
                                                         "apptainer keeps as part of the path: use double quotes")
        if "{{" in line:
            raise DefError("bad_files_line", source, no, f"%files line {line!r} uses {{{{ templating }}}}, "
                                                         "which envport's builder does not expand")
        words = [m.group(1) if m.group(1) is not None else m.group(2) for m in FILES_TOKEN.finditer(line)]
        stray = any(m.group(2) is not None and '"' in m.group(2) for m in FILES_TOKEN.finditer(line))
        if len(words) > 2 or stray:
            raise DefError("bad_files_line", source, no, f"%files line {line!r}: expected `SRC [DST]` (quote "
                                                         "paths that contain spaces with double quotes)")
        out.append(FileCopy(src=words[0], dst=words[1] if len(words) > 1 else "", line=no))
    return out


def _steps(section: Section) -> list[PostStep]:
    """The `echo 'envport: step i/n title'` lines of a %post body, with the marker of the comment above."""
    steps, marker = [], ""
    for offset, raw in enumerate(_lines(section), start=1):
        comment = STEP_COMMENT.match(raw)
        if comment:
            marker = comment.group(3)
            continue
        words = _shell_words(raw)
        if len(words) == 2 and words[0] == "echo" and (found := match_step(words[1])):
            n, total, title = found
            steps.append(PostStep(n=n, total=total, title=title, marker=marker, line=section.line + offset))
            marker = ""
    return steps


def _check_steps(steps: list[PostStep], source: str) -> None:
    for i, step in enumerate(steps, start=1):
        if step.n != i:
            raise DefError("bad_steps", source, step.line, f"step marker {step.n}/{step.total} where step {i} "
                                                           "was expected; re-render the .def")
    for step in steps:
        if step.total != len(steps):
            raise DefError("bad_steps", source, step.line, f"step marker {step.n}/{step.total}, but %post has "
                                                           f"{len(steps)} step markers; re-render the .def")


def _shell_words(line: str) -> list[str]:
    try:
        return shlex.split(line)
    except ValueError:
        return []


def parse_def(text: str, source: str = "<def>") -> DefFile:
    """Parse TEXT (the whole .def) into a DefFile; SOURCE names it in errors."""
    if not text.strip():
        raise DefError("empty", source, None, "empty definition file")
    header_lines, raw_sections = _split(text, source)
    header = _parse_header(header_lines, source)
    if "bootstrap" not in header:
        raise DefError("bad_header", source, None, "no `Bootstrap:` header; envport's builder needs one "
                                                   "(docker, docker-daemon or localimage)")
    if len(re.findall(r"(?mi)^bootstrap:", text)) > 1:
        raise DefError("unsupported_section", source, None, "multi-stage definition (more than one "
                                                            "`Bootstrap:`) is not supported by envport's builder")
    sections = tuple(_section(no, line, body, source) for no, line, body in raw_sections)
    labels = [kv for s in sections if s.name == "labels" for kv in _labels(s)]
    files = [f for s in sections if s.name == "files" for f in _files(s, source)]
    steps = [st for s in sections if s.name == "post" for st in _steps(s)]
    _check_steps(steps, source)
    return DefFile(text=text, source=source, header=header, sections=sections, labels=tuple(labels),
                   files=tuple(files), steps=tuple(steps))

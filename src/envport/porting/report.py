"""What an import found: the draft spec it is building, and a note for every construct that did not map exactly.

Every reader (Dockerfile, `.def`, environment.yml, requirements, install
script) fills one `Draft`; nothing it meets is silently lost: a construct
either maps exactly onto a spec field, or gets a `Note` saying where it was
(`FILE:LINE`), what envport did with it and why.  A user porting an env reads
the notes to finish the job, so each one names the fix where there is one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

# What envport did with a construct that did not map exactly.
KEPT = "kept as a run command"
DROPPED = "dropped"
REPORTED = "reported"
# A step that ran (and may have installed something) but could not be read at all: the env the
# spec describes may lack what it made, so the import is incomplete (exit 1) however valid the spec.
LOST = "dropped (a step that may install something; the spec lacks it)"
# A flag that turns off a check (signatures, TLS): never carried into the spec, always named.
SECURITY = "kept out of the spec (security)"

# What a note is, for a reader of --json: one of four kinds, whatever the wording of its action.
KINDS = ("dropped", "mapped", "needs_decision", "security")


def note_kind(action: str) -> str:
    if action == SECURITY:
        return "security"
    if action.startswith("turned into"):
        return "mapped"
    if action.startswith(DROPPED):
        return "dropped"
    return "needs_decision"  # KEPT, REPORTED: kept as written, and a person must look at it


def turned_into(field_name: str) -> str:
    return f"turned into {field_name}"


@dataclass(frozen=True)
class Note:
    file: str
    line: Optional[int]
    construct: str  # the source text, shortened
    action: str  # KEPT, DROPPED, REPORTED or turned_into(...)
    why: str
    fix: str = ""

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        text = f"{where}: {self.construct}: {self.action}: {self.why}"
        return text + (f" (fix: {self.fix})" if self.fix else "")

    @property
    def kind(self) -> str:
        return note_kind(self.action)

    def as_dict(self) -> dict:
        return {"file": self.file, "line": self.line, "kind": self.kind, "construct": self.construct,
                "action": self.action, "why": self.why, "fix": self.fix}


@dataclass
class Phase:
    """One pip call as read from the source, before it becomes a spec phase."""

    packages: list[str]
    file: str
    line: Optional[int]
    seq: int = 0  # position among the source's pip calls and run commands
    index_url: Optional[str] = None
    extra_index_urls: list[str] = field(default_factory=list)
    find_links: list[str] = field(default_factory=list)
    no_deps: bool = False
    force_reinstall: bool = False
    pre: bool = False
    package_lines: dict[str, int] = field(default_factory=dict)  # a requirement -> its own line, where known

    def as_spec(self):
        opts = {}
        if self.index_url:
            opts["index_url"] = self.index_url
        if self.extra_index_urls:
            opts["extra_index_urls"] = list(self.extra_index_urls)
        if self.find_links:
            opts["find_links"] = list(self.find_links)
        for flag in ("no_deps", "force_reinstall", "pre"):
            if getattr(self, flag):
                opts[flag] = True
        return {"packages": list(self.packages), **opts} if opts else list(self.packages)


@dataclass
class Draft:
    """The spec an import is building, field by field, with where each part came from."""

    file: str  # how notes name the source file
    base: Optional[str] = None
    base_line: Optional[int] = None
    python: Optional[str] = None
    python_how: str = ""  # "the base image name", "apt package python3.11", ...
    python_guessed: bool = False
    python_where: str = ""  # FILE:LINE the version came from, written next to `python:`
    system_pkgs: list[str] = field(default_factory=list)
    phases: list[Phase] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    # (command, file, line, seq): run_commands in order, each with its source line.
    run_commands: list[tuple[str, str, Optional[int], int]] = field(default_factory=list)
    # container path -> (host file to copy, file, line)
    shims: dict[str, tuple[Path, str, Optional[int]]] = field(default_factory=dict)
    # generated shim files (multi-line blocks): container path -> (bytes, file, line)
    blocks: dict[str, tuple[bytes, str, Optional[int]]] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    weight_dirs: dict[str, dict] = field(default_factory=dict)
    # weight_dirs entries suggested from downloads: written commented out, never baked.
    suggested_weights: list[tuple[str, dict]] = field(default_factory=list)
    witness_imports: list[str] = field(default_factory=list)  # witnesses.imports, from the pip phases
    witness_kernel: list[str] = field(default_factory=list)  # witnesses.kernel: the frameworks installed
    notes: list[Note] = field(default_factory=list)
    lost: list[Note] = field(default_factory=list)  # the LOST notes: steps whose effect the spec lacks
    name_hint: Optional[str] = None  # e.g. environment.yml's `name:`
    # `import --repo URL --commit SHA`: where the recipe's own project (`pip install .`) is published.
    project_repo: Optional[tuple[str, str]] = None
    seq: int = 0

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def add_phase(self, phase: Phase) -> None:
        phase.seq = self.next_seq()
        self.phases.append(phase)

    def note(self, line: Optional[int], construct: str, action: str, why: str, fix: str = "",
             file: Optional[str] = None) -> None:
        self.notes.append(Note(file or self.file, line, shorten(construct), action, why, fix))

    def lose(self, line: Optional[int], construct: str, why: str, fix: str, file: Optional[str] = None) -> None:
        """A step that was not read (a here-document, a line too deeply nested): noted, and the import is
        incomplete until a person adds it."""
        self.note(line, construct, LOST, why, fix, file=file)
        self.lost.append(self.notes[-1])

    def set_python(self, version: str, how: str, line: Optional[int], file: Optional[str] = None,
                   guessed: bool = False) -> None:
        """The first explicit source wins; a later one that disagrees is reported."""
        if self.python is None or (self.python_guessed and not guessed):
            self.python, self.python_how, self.python_guessed = version, how, guessed
            self.python_where = f"{file or self.file}:{line}" if line else ""
            return
        if version != self.python and not guessed:
            self.note(line, how, REPORTED, f"names python {version}, but the spec already has {self.python} "
                      f"from {self.python_how}", "keep one interpreter per env; edit `python:` if this one "
                      "is the one the env runs", file=file)

    def add_system(self, packages: list[str]) -> None:
        for p in packages:
            if p not in self.system_pkgs:
                self.system_pkgs.append(p)

    def add_run(self, command: str, line: Optional[int], file: Optional[str] = None) -> None:
        self.run_commands.append((command, file or self.file, line, self.next_seq()))


def shorten(text: str, limit: int = 100) -> str:
    one = " ".join(text.split())
    return one if len(one) <= limit else one[: limit - 3] + "..."

"""What reading a recipe's shell lines carries from one line to the next, and what one simple command became."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Callable, Optional

from envport.porting.report import Draft
from envport.porting.requirements import PipContext


@dataclass
class ShellContext:
    draft: Draft
    file: str
    mode: str  # "docker" (each RUN is its own /bin/sh), "def" (%post: one sh), "script" (one bash)
    open_file: Callable[[str], Optional[tuple[str, str]]] = lambda p: None
    variables: dict[str, str] = field(default_factory=dict)
    shell_is_bash: bool = False  # a Dockerfile SHELL or a script's shebang: bash-only syntax ran fine there
    runtime_env: dict[str, str] = field(default_factory=dict)  # a .def's %environment
    rendered_step: Optional[str] = None  # the plan step of an envport-rendered recipe being read
    rendered_title: str = ""  # that step's title (a pip phase's: its first three requirements)
    rendered: bool = False
    cwd: str = "/"
    # A Dockerfile's other stages the final one copies from: stage name (or index) -> what reading it found.
    stages: dict = field(default_factory=dict)

    def note(self, line, construct, action, why, fix=""):
        self.draft.note(line, construct, action, why, fix, file=self.file)

    def pip(self, line) -> PipContext:
        return PipContext(self.draft, self.file, line, self.open_file, self.variables,
                          python=self.draft.python or "3.11")


class Outcome(enum.Enum):
    """What one simple command became."""

    KEEP = "keep"  # a run command, kept in order
    EXPORT = "export"  # a RUN's export: kept unless nothing follows it in the line
    DONE = "done"  # mapped onto a field, or dropped with a note

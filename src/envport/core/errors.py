"""Errors meant for people: each names the file, the field, what was expected, the fix."""

from __future__ import annotations

from dataclasses import dataclass

from envport.core.verdict import EXIT_USAGE


@dataclass(frozen=True)
class Problem:
    file: str
    line: int | None
    field: str
    message: str  # what was wrong and what was expected
    fix: str = ""

    def __str__(self) -> str:
        where = self.file if self.line is None else f"{self.file}:{self.line}"
        text = f"{where}: {self.field or '<top>'}: {self.message}"
        if self.fix:
            text += f" (fix: {self.fix})"
        return text

    def to_dict(self) -> dict:
        return {"file": self.file, "line": self.line, "field": self.field, "message": self.message, "fix": self.fix}


class EnvportError(Exception):
    """An error the CLI prints without a traceback and exits with `exit_code`."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class SpecError(EnvportError):
    """Every problem found in one spec file, or in every selected one (all of them, not just the first).

    The CLI prints each problem on its own line, then `envport: <summary>`; under
    --json it prints them as the `problems` of the one JSON shape (core/verdict).
    """

    def __init__(self, problems: list[Problem], summary: str | None = None):
        self.problems = problems
        n_files = len({p.file for p in problems})
        self.summary = summary or f"{len(problems)} problem(s) in {n_files} file(s)"
        super().__init__("\n".join(str(p) for p in problems))


def problems_of(exc: EnvportError) -> list[Problem]:
    """An error as Problems: a SpecError's own, or one Problem holding the message."""
    return list(exc.problems) if isinstance(exc, SpecError) else [Problem("", None, "", str(exc))]


class ReasonError(Exception):
    """A failure with a stable one-word `reason` token for verdicts, and a message for people."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason
        self.message = message

    def __str__(self) -> str:
        return self.message

"""Verdicts and exit codes shared by every command.

A step is OK, present (already done, skipped by checking), skipped (not asked
for or not applicable), REFUSED (does not match what was declared, or the host
cannot do it: a one-token reason and the fix) or FAILED (something broke: the
tail of its log).  Exit codes are stable and documented in docs/cli.md.
"""

from __future__ import annotations

import enum
import json
import sys
from dataclasses import asdict, dataclass, field
from typing import Iterable


class Verdict(str, enum.Enum):
    OK = "OK"
    PRESENT = "present"
    SKIPPED = "skipped"
    REFUSED = "REFUSED"
    FAILED = "FAILED"

    @property
    def ok(self) -> bool:
        return self in (Verdict.OK, Verdict.PRESENT, Verdict.SKIPPED)


EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2  # bad arguments or an invalid spec
EXIT_REFUSED = 3
EXIT_NO_ACCELERATOR = 5  # the spec requires a GPU and none is present
EXIT_INTERRUPTED = 130  # a signal to envport stopped the run (Ctrl-C, SIGTERM, SIGHUP), on every target
INTERRUPTED_REASON = "interrupted"

# A REFUSED step carrying this reason exits 5 rather than 3, so schedulers can
# route the job to a GPU node instead of treating it as a broken env.
NO_ACCELERATOR_REASON = "no_accelerator"


@dataclass
class StepResult:
    step: str
    verdict: Verdict
    detail: str = ""
    reason: str = ""  # one token, set for REFUSED
    lines: list[str] = field(default_factory=list)  # log tail, set for FAILED
    seconds: float = 0.0
    data: dict = field(default_factory=dict)  # facts for the ledger (image id, env prefix, ...)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["verdict"] = self.verdict.value
        d["seconds"] = round(self.seconds, 3)
        return d

    def line(self) -> str:
        text = f"{self.verdict.value:<8} {self.step}"
        if self.reason:
            text += f" [{self.reason}]"
        if self.detail:
            text += f": {self.detail}"
        if self.seconds:
            text += f" ({self.seconds:.1f}s)"
        return text


def exit_code(results: Iterable[StepResult]) -> int:
    """The exit code for a run: the first step that is not ok decides it."""
    for r in results:
        if r.reason == INTERRUPTED_REASON:
            return EXIT_INTERRUPTED
        if r.verdict is Verdict.FAILED:
            return EXIT_FAILED
        if r.verdict is Verdict.REFUSED:
            return EXIT_NO_ACCELERATOR if r.reason == NO_ACCELERATOR_REASON else EXIT_REFUSED
    return EXIT_OK


def envelope(command: str, code: int, steps: Iterable = (), problems: Iterable = (), **extra) -> dict:
    """Every `--json` output's top level (docs/cli.md): command, exit_code, steps, problems, then the
    command's own keys. Steps and problems may be StepResults/Problems or their dicts."""
    def as_dict(x):
        return x if isinstance(x, dict) else x.to_dict()

    return {"command": command, "exit_code": code, "steps": [as_dict(s) for s in steps],
            "problems": [as_dict(p) for p in problems], **extra}


def print_json(data: dict, stream=None) -> None:
    stream = stream or sys.stdout
    json.dump(data, stream, indent=2, ensure_ascii=False)
    stream.write("\n")


def report(results: list[StepResult], as_json: bool, stream=None, command: str = "") -> int:
    """Print results (one line each, log tails indented) or JSON; return the exit code."""
    stream = stream or sys.stdout
    code = exit_code(results)
    if as_json:
        print_json(envelope(command, code, results), stream)
        return code
    for r in results:
        print(r.line(), file=stream)
        for ln in r.lines:
            print(f"    | {ln}", file=stream)
    return code

"""What every verify backend reports the same way: progress lines, the verdict
from pytest's exit and the items' outcomes, and the verdict."""

from __future__ import annotations

from typing import Callable

import pytest

from envport.core.progress import Progress
from envport.core.verdict import Verdict


def progress_line(progress: Progress) -> Callable[[dict], None]:
    def say(rec: dict) -> None:
        mark = {"passed": "PASS", "skipped": "SKIP"}.get(rec["outcome"], "FAIL")
        extra = f": {rec['message']}" if rec["message"] and mark != "PASS" else ""
        progress(f"envport: [verify] {mark} {rec['id']}{extra}")
    return say


def summary(results: list[dict]) -> str:
    counts: dict[str, int] = {}
    for r in results:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    order = ("failed", "error", "passed", "skipped")
    return ", ".join(f"{counts[k]} {k}" for k in order if counts.get(k)) or "no checks ran"


def outcome(code: int, results: list[dict], output: str) -> tuple[Verdict, list[str], str]:
    """(verdict, lines, summary) for one pytest run over the checks.

    A run that collected nothing yet failed is pytest failing, not the env:
    its own output is the evidence then.
    """
    if code == pytest.ExitCode.INTERRUPTED:
        raise KeyboardInterrupt()
    tail = output.rstrip().splitlines()[-30:]
    if code in (pytest.ExitCode.INTERNAL_ERROR, pytest.ExitCode.USAGE_ERROR) or (not results and code != 0):
        return Verdict.FAILED, tail, f"pytest could not run the checks (exit {int(code)})"
    bad = [r for r in results if r["outcome"] not in ("passed", "skipped")]
    if bad or code != 0:
        return Verdict.FAILED, [f"{r['id']}: {r['message']}" for r in bad] or tail, summary(results)
    return Verdict.OK, [], summary(results)

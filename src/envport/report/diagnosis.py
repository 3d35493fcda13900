"""The diagnosis table (seed 004): a failed log's symptom -> the layer that is wrong, and the fix.

The rows are data (diagnosis.yaml beside this module), so adding one is an
edit to a table that docs/cli.md lists, not new code. A log is matched line by
line; the first row of the table that matches any line is the verdict (specific
rows come first), and every other row that matched is kept as a note.
"""

from __future__ import annotations

import functools
import re
import string
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

from envport.core.finding import Finding
from envport.core.verdict import Verdict

LAYERS = ("spec", "build", "weights", "exec", "host")
TABLE = Path(__file__).with_name("diagnosis.yaml")


@dataclass(frozen=True)
class Row:
    id: str
    symptom: re.Pattern
    layer: str
    wrong: str
    fix: str
    host: bool = False
    context: Optional[re.Pattern] = None  # facts from the log's other lines, for $name in wrong and fix


class _Facts(dict):
    def __missing__(self, key: str) -> str:
        return "(not in the log)"


@dataclass(frozen=True)
class Diagnosis:
    row: Row  # its wrong and fix already say the log's facts ($name filled in)
    line: str  # the log line that matched

    @property
    def finding(self) -> Finding:
        """The match as a Finding: the log FAILED for the reason the row names."""
        return Finding(self.row.id, self.line, self.row.fix, check=self.row.layer, verdict=Verdict.FAILED)

    def to_dict(self) -> dict:
        f = self.finding
        return {"id": f.reason, "layer": f.check, "wrong": self.row.wrong, "fix": f.fix, "host": self.row.host,
                "line": f.evidence}

    def lines(self) -> list[str]:
        f = self.finding
        return [f"diagnosis [{f.reason}] layer {f.check}: {self.row.wrong}",
                f"  symptom: {f.evidence.strip()[:200]}", f"  fix: {f.fix}"]


def _row(i: int, raw: dict) -> Row:
    where = f"{TABLE.name} row {i + 1} ({raw.get('id', '?')})"
    missing = [k for k in ("id", "symptom", "layer", "wrong", "fix") if not raw.get(k)]
    if missing:
        raise ValueError(f"{where}: missing {', '.join(missing)}")
    if raw["layer"] not in LAYERS:
        raise ValueError(f"{where}: layer {raw['layer']!r} is not one of {', '.join(LAYERS)}")
    unknown = set(raw) - {"id", "symptom", "layer", "wrong", "fix", "host", "context"}
    if unknown:
        raise ValueError(f"{where}: unknown keys {', '.join(sorted(unknown))}")
    return Row(raw["id"], re.compile(raw["symptom"]), raw["layer"], " ".join(raw["wrong"].split()),
               " ".join(raw["fix"].split()), bool(raw.get("host", False)),
               re.compile(raw["context"]) if raw.get("context") else None)


@functools.lru_cache(maxsize=2)
def table(path: Path = TABLE) -> tuple[Row, ...]:
    import yaml

    rows = tuple(_row(i, r) for i, r in enumerate(yaml.safe_load(path.read_text(encoding="utf-8"))["rows"]))
    ids = [r.id for r in rows]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise ValueError(f"{path.name}: row ids used twice: {', '.join(dupes)}")
    return rows


def diagnose(lines: Iterable[str], rows: Optional[tuple[Row, ...]] = None) -> list[Diagnosis]:
    """Every row that matches some line, in table order (the first is the verdict)."""
    lines = list(lines)
    found = []
    for row in rows or table():
        hit = next(((ln, m) for ln in lines if (m := row.symptom.search(ln))), None)
        if hit is not None:
            found.append(Diagnosis(_said(row, _facts(row, hit[1], lines)), hit[0]))
    return found


def _facts(row: Row, match: re.Match, lines: list[str]) -> dict:
    """The symptom's named groups, and the context's from the first line it matches."""
    facts = _Facts({k: v for k, v in match.groupdict().items() if v is not None})
    context = next((m for ln in lines if row.context and (m := row.context.search(ln))), None)
    if context:
        facts.update({k: v.strip() for k, v in context.groupdict().items() if v is not None})
    return facts


def _said(row: Row, facts: dict) -> Row:
    """ROW with the log's facts in its wrong and fix ($name; a rule's text without $ is left as it is)."""
    if "$" not in row.wrong + row.fix:
        return row
    return dataclasses.replace(row, wrong=string.Template(row.wrong).safe_substitute(facts),
                               fix=string.Template(row.fix).safe_substitute(facts))


def first(lines: Iterable[str]) -> Optional[Diagnosis]:
    found = diagnose(lines)
    return found[0] if found else None

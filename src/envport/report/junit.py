"""JUnit XML pieces the matrix's and the witness's reports share: one verdict as a <testcase>'s body, and a
<testsuite> closed with its counts (what CI systems read: tests, failures, skipped, errors, time)."""

from __future__ import annotations

from xml.etree import ElementTree as ET


def failure(case, kind: str, message: str, lines: list[str]) -> None:
    ET.SubElement(case, "failure", type=kind, message=message[:2000]).text = "\n".join(lines)


def step_case(case, s: dict) -> str:
    """One reported step (a StepResult's dict) as CASE's time and body; returns the count it adds to beside
    "tests" ("" when it passed): FAILED and REFUSED are <failure type=VERDICT> with their lines, skipped
    <skipped>, the rest <system-out>."""
    case.set("time", f"{float(s.get('seconds') or 0):.3f}")
    verdict = s.get("verdict")
    message = s.get("detail", "") + (f" [{s['reason']}]" if s.get("reason") else "")
    if verdict in ("FAILED", "REFUSED"):
        failure(case, verdict, message, s.get("lines") or [])
        return "failures"
    if verdict == "skipped":
        ET.SubElement(case, "skipped", message=message[:2000] or "skipped")
        return "skipped"
    ET.SubElement(case, "system-out").text = f"{verdict}: {message}"
    return ""


def finished(suite, counts: dict[str, int], seconds: float) -> bytes:
    """SUITE with its COUNTS (tests, failures, skipped), no errors and its time, as indented UTF-8 XML."""
    for k, v in counts.items():
        suite.set(k, str(v))
    suite.set("errors", "0")
    suite.set("time", f"{seconds:.3f}")
    ET.indent(suite)
    return ET.tostring(suite, encoding="utf-8", xml_declaration=True) + b"\n"

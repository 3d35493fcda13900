"""A witness run as JUnit XML: one <testcase> per verdict row (each import, CLI check, kernel, collective,
and each doc of the docs level), so CI shows the doc that drifted as its own failed test."""

from __future__ import annotations

from typing import Sequence
from xml.etree import ElementTree as ET

from envport.core.verdict import StepResult, Verdict


def junit_xml(env: str, target: str, results: Sequence[StepResult]) -> bytes:
    """FAILED and REFUSED rows are <failure type=VERDICT> with their lines; skipped ones <skipped>."""
    suite = ET.Element("testsuite", name=f"envport-witness.{env}.{target}")
    counts = {"tests": 0, "failures": 0, "skipped": 0}
    for r in results:
        case = ET.SubElement(suite, "testcase", classname=f"witness.{env}.{target}", name=r.step,
                             time=f"{r.seconds:.3f}")
        counts["tests"] += 1
        message = r.detail + (f" [{r.reason}]" if r.reason else "")
        if r.verdict in (Verdict.FAILED, Verdict.REFUSED):
            ET.SubElement(case, "failure", type=r.verdict.value, message=message[:2000]).text = "\n".join(r.lines)
            counts["failures"] += 1
        elif r.verdict is Verdict.SKIPPED:
            ET.SubElement(case, "skipped", message=message[:2000] or "skipped")
            counts["skipped"] += 1
        else:
            ET.SubElement(case, "system-out").text = f"{r.verdict.value}: {message}"
    for k, v in counts.items():
        suite.set(k, str(v))
    suite.set("errors", "0")
    suite.set("time", f"{sum(r.seconds for r in results):.3f}")
    ET.indent(suite)
    return ET.tostring(suite, encoding="utf-8", xml_declaration=True) + b"\n"

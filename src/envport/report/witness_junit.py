"""A witness run as JUnit XML: one <testcase> per verdict row (each import, CLI check, kernel, collective,
and each doc of the docs level), so CI shows the doc that drifted as its own failed test."""

from __future__ import annotations

from typing import Sequence
from xml.etree import ElementTree as ET

from envport.core.verdict import StepResult
from envport.report.junit import finished, step_case


def junit_xml(env: str, target: str, results: Sequence[StepResult]) -> bytes:
    """FAILED and REFUSED rows are <failure type=VERDICT> with their lines; skipped ones <skipped>."""
    suite = ET.Element("testsuite", name=f"envport-witness.{env}.{target}")
    counts = {"tests": 0, "failures": 0, "skipped": 0}
    for r in results:
        case = ET.SubElement(suite, "testcase", classname=f"witness.{env}.{target}", name=r.step)
        counts["tests"] += 1
        kind = step_case(case, r.to_dict())
        if kind:
            counts[kind] += 1
    return finished(suite, counts, sum(r.seconds for r in results))

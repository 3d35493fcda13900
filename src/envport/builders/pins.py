"""The pin check every builder ends with before it says OK.

Each package the spec pins with `==` in the last pip phase that names it must
be what the env has: pip keeps no pin of an earlier phase when a later phase's
resolve wants another version (seed 004, "Wrong torch/numpy after install"),
so without this check a build said OK and only `verify` noticed.

`check(plan, installed)` is pure: {distribution: version} from the built env
(`PROBE` prints it, run with the env's own python) against the plan's pins.
The setup scripts run the same code (`renderers/envcheck.py`, embedded) before
they swap a new env in; the docker builder calls `check_image`; the apptainer
builder runs `PROBE` in its rootfs and calls `result`.
"""

from __future__ import annotations

import json
from typing import Optional

from envport.core.verdict import StepResult, Verdict
from envport.renderers import envcheck
from envport.renderers.shell import ENVCHECK_SOURCE

Pin = tuple[str, str, int]  # (name as the spec writes it, version, pip phase)


def pins(plan) -> list[Pin]:
    return envcheck.plan_pins(plan)


def check(plan, installed: dict[str, str], snapshots: Optional[dict[int, dict[str, str]]] = None) -> list[str]:
    """One message per pin that does not hold (empty: every pin holds)."""
    return envcheck.failures(pins(plan), {envcheck.canonical(k): v for k, v in installed.items()}, snapshots)


def probe_argv(python: str) -> list[str]:
    """Run inside the env: prints {canonical name: version} as JSON, stdlib only, no pip."""
    return [python, "-I", "-c", ENVCHECK_SOURCE.read_text(encoding="utf-8"), "scan"]


def parse_probe(output: str) -> dict[str, str]:
    """The probe's JSON line (the last line that parses; a base image may print a banner first)."""
    for line in reversed(output.strip().splitlines()):
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict):
            return data
    raise ValueError(f"no JSON object in the probe's output: {output[-500:]!r}")


def result(step: str, plan, installed: dict[str, str], seconds: float = 0.0) -> Optional[StepResult]:
    """FAILED [pin_mismatch] naming each pin that does not hold, or None when all hold."""
    bad = check(plan, installed)
    if not bad:
        return None
    return StepResult(step, Verdict.FAILED, bad[0], reason="pin_mismatch", lines=bad, seconds=seconds)


def check_image(client, image: str, plan, python: str, step: str) -> Optional[StepResult]:
    """Run the probe in IMAGE (through envport.engines.docker) and check the plan's pins."""
    from envport.engines.docker import run_in_image

    if not pins(plan):
        return None
    rc, output = run_in_image(client, image, probe_argv(python))
    if rc != 0:
        return StepResult(step, Verdict.FAILED, f"the pin check could not run in {image[:19]} (exit {rc})",
                          reason="pin_check_failed", lines=output.splitlines()[-20:])
    try:
        installed = parse_probe(output)
    except ValueError as exc:
        return StepResult(step, Verdict.FAILED, str(exc), reason="pin_check_failed")
    return result(step, plan, installed)

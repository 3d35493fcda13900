"""One check shape: what was checked, the verdict, the evidence that decided it, and the fix.

preflight's checks, doctor's checks and the diagnosis table answer in it, as
cog's doctor does (`Finding{Severity, Message, Remediation}`): a reader learns
one shape, and a verdict always travels with the evidence behind it and what to
do about it.  The facts both preflight and doctor judge (the GPUs nvidia-smi
lists, the driver against torch's CUDA build, the docker engine) are judged by
one function each (engines/gpu.judge_gpus, core/arch.driver_finding,
engines/docker.judge_engine), so the two commands cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from envport.core.verdict import Verdict


@dataclass(frozen=True)
class Finding:
    reason: str  # stable token a caller branches on; empty for a note (reported, not judged)
    evidence: str  # what was seen
    fix: str = ""
    check: str = ""  # what was checked: "disk", "runtime", a diagnosis row's layer
    # None: REFUSED where there is a reason, else SKIPPED (a note judges nothing).
    verdict: Optional[Verdict] = None

    def __post_init__(self) -> None:
        if self.verdict is None:
            object.__setattr__(self, "verdict", Verdict.REFUSED if self.reason else Verdict.SKIPPED)

    @property
    def is_problem(self) -> bool:
        return not self.verdict.ok

    def to_dict(self) -> dict:
        return {"check": self.check, "verdict": self.verdict.value, "reason": self.reason,
                "evidence": self.evidence, "fix": self.fix}

    def line(self) -> str:
        if not self.is_problem:
            return f"note: {self.evidence}"
        return f"{self.reason}: {self.evidence}" + (f" (fix: {self.fix})" if self.fix else "")

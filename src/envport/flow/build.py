"""The one build step: `envport build` and `envport up`'s build step both run it (issue 36 item 3).

It runs the target's build (or keeps the lock gate's refusal), names what the build changed since the
env it replaces (flow/build_changes.py) and collects the facts the ledger keeps for it: the seconds,
the lock, the distributions where known, and `verdict: interrupted` when a signal stopped it. It
records nothing itself: the command hands its ledger writer to `Built.record` (commands/ stays the
layer that writes the ledger), so both commands record one set of facts for the same build.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from envport.core.verdict import INTERRUPTED_REASON, StepResult, Verdict
from envport.targets.base import BuildRequest, Target


@dataclass
class Built:
    """What one build step did: its results (the last is the build's) and the facts the ledger keeps."""

    target: Target
    request: BuildRequest
    results: list[StepResult]
    facts: dict = field(default_factory=dict)
    # The signal that stopped it (KeyboardInterrupt, or core/proc's Terminated): the caller records, then re-raises.
    interrupted: Optional[KeyboardInterrupt] = None

    @property
    def last(self) -> StepResult:
        return self.results[-1]

    def record(self, write: Callable[..., Any]) -> None:
        """Hand this build to WRITE (report.ledger.record's signature): one record, kind `build`."""
        req = self.request
        write(req.root, req.loaded.spec, kind="build", target=self.target.name, hash_=req.identity.hash,
              result=self.last, site=req.site, **self.facts)


def run_build(target: Target, request: BuildRequest, *, lock_refused: Optional[StepResult] = None,
              lock_fact: str = "none") -> Built:
    """Build REQUEST with TARGET (or keep LOCK_REFUSED, the lock gate's answer) and collect its facts.

    A KeyboardInterrupt (SIGINT, or SIGTERM/SIGHUP through core/proc) during the build is returned as an
    interrupted Built, so the caller can record it before it re-raises: the ledger says the build was
    stopped, not that it broke (issue 27 row 10)."""
    spec_name = request.loaded.spec.name
    try:
        results = [lock_refused] if lock_refused else target.build(request)
    except KeyboardInterrupt as exc:
        stopped = StepResult(f"build {spec_name}", Verdict.FAILED, "interrupted", reason=INTERRUPTED_REASON)
        return Built(target, request, [stopped], {"lock": lock_fact, "verdict": "interrupted"}, interrupted=exc)
    facts: dict = {"seconds": sum(r.seconds for r in results), "lock": lock_fact}
    if results[-1].reason == INTERRUPTED_REASON:
        facts["verdict"] = "interrupted"
    if not lock_refused:
        from envport.flow.build_changes import what_changed

        # The {name: version} the ledger keeps for this build, where known; the changed lines go on the result.
        dists = what_changed(target, request.root, request.loaded, request.site, request.identity, lock_fact,
                             results[-1])
        if dists is not None:
            facts["dists"] = dists
    return Built(target, request, results, facts)

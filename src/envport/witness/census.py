"""How many GPUs a witness run has: nvidia-smi's count, and the env's own torch through the launcher."""

from __future__ import annotations

from typing import Optional

from envport.core.verdict import StepResult, Verdict
from envport.engines.gpu import GpuCensus
from envport.spec.model import Spec
from envport.witness.judge import parse_sentinels, why_missing
from envport.witness.plan import LAUNCH_MARGIN_S, WitnessOptions, requires_gpu


def host_gpu_count() -> int:
    """GPUs nvidia-smi lists here (0 where it is absent or answers oddly)."""
    from envport.engines.gpu import gpu_count

    return gpu_count() or 0


def _torch_gpus(launcher, env: dict, opts: WitnessOptions) -> tuple[Optional[int], list[str]]:
    """(GPUs the env's torch sees, torch's own words when it sees none); (None, why) where it did not answer."""
    launched = launcher.run("gpus.py", [], env, opts.check_timeout_s + LAUNCH_MARGIN_S, None)
    rec = next((r for r in parse_sentinels(launched.output) if r["check"] == "gpus"), None)
    if rec is None:
        return None, [f"the env's torch did not answer: {why_missing(launched, opts.check_timeout_s)}"]
    if not rec.get("ok"):
        return None, [f"the env's torch: {rec.get('error')}"]
    return int(rec.get("count") or 0), [str(x) for x in rec.get("warnings") or []]


def gpu_census(spec: Spec, opts: WitnessOptions, launcher, env: dict) -> tuple[Optional[GpuCensus], list[str]]:
    """Count the GPUs (nvidia-smi, then the env's torch where GPUs may be there); None for --device cpu."""
    if opts.device == "cpu":
        return None, []
    from envport.engines.gpu import gpu_count

    smi = opts.host_gpus if opts.host_gpus is not None else gpu_count()
    torch_n, words = opts.torch_gpus, []
    if torch_n is None and (requires_gpu(spec, opts) or (smi or 0) > 0):
        torch_n, words = _torch_gpus(launcher, env, opts)
    return GpuCensus(smi, torch_n), words


def census_result(census: GpuCensus, words: list[str]) -> StepResult:
    smi = "absent" if census.smi is None else str(census.smi)
    torch_n = "did not answer" if census.torch is None else str(census.torch)
    lines = [f"note: {census.note}"] if census.note else []
    lines += [f"torch: {w}" for w in words]
    return StepResult("gpus", Verdict.OK, f"{census.count} GPU(s) on {census.where} (nvidia-smi: {smi}; "
                      f"the env's torch: {torch_n})", lines=lines, data={"census": census.to_dict()})

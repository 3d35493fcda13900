"""How many GPUs a witness run has: nvidia-smi's count, and the env's own torch and JAX through the launcher."""

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


def _env_gpus(launcher, env: dict, opts: WitnessOptions) -> tuple[Optional[int], Optional[int], list[str]]:
    """(GPUs the env's torch sees, GPUs its JAX sees, the words behind them, each line saying which framework
    it is from); None where one did not answer (or JAX is not installed)."""
    launched = launcher.run("gpus.py", [], env, opts.check_timeout_s + LAUNCH_MARGIN_S, None)
    rec = next((r for r in parse_sentinels(launched.output) if r["check"] == "gpus"), None)
    if rec is None:
        return None, None, [f"torch: the env's torch did not answer: {why_missing(launched, opts.check_timeout_s)}"]
    jax_n, words = _jax_gpus(rec.get("jax"))
    if not rec.get("ok"):
        return None, jax_n, [f"torch: the env's torch: {rec.get('error')}"] + words
    return int(rec.get("count") or 0), jax_n, [f"torch: {x}" for x in rec.get("warnings") or []] + words


def _jax_gpus(jax: Optional[dict]) -> tuple[Optional[int], list[str]]:
    """The GPUs the env's JAX lists, and a line saying so (None, [] where JAX is not installed)."""
    if jax is None:
        return None, []
    if jax.get("error"):
        return None, [f"jax: {jax['error']}"]
    devices = jax.get("devices") or []
    cards = ", ".join(f"{d.get('name')} cc {d.get('capability') or '?'}" for d in devices)
    return len(devices), [f"jax {jax.get('version')}: backend {jax.get('backend')}, {len(devices)} GPU(s)"
                          + (f" ({cards})" if cards else "")]


def gpu_census(spec: Spec, opts: WitnessOptions, launcher, env: dict) -> tuple[Optional[GpuCensus], list[str]]:
    """Count the GPUs (nvidia-smi, then the env's torch and JAX where GPUs may be there); None for --device cpu."""
    if opts.device == "cpu":
        return None, []
    from envport.engines.gpu import gpu_count

    smi = opts.host_gpus if opts.host_gpus is not None else gpu_count()
    torch_n, jax_n, words = opts.torch_gpus, None, []
    if torch_n is None and (requires_gpu(spec, opts) or (smi or 0) > 0):
        torch_n, jax_n, words = _env_gpus(launcher, env, opts)
    return GpuCensus(smi, torch_n, jax=jax_n), words


def census_result(census: GpuCensus, words: list[str]) -> StepResult:
    smi = "absent" if census.smi is None else str(census.smi)
    torch_n = "did not answer" if census.torch is None else str(census.torch)
    # JAX named only where the env holds it: a torch-only env's line reads as it always did.
    jax_n = "" if census.jax is None else f"; the env's JAX: {census.jax}; judged by {census.judged_by}"
    lines = [f"note: {census.note}"] if census.note else []
    lines += words
    return StepResult("gpus", Verdict.OK, f"{census.count} GPU(s) on {census.where} (nvidia-smi: {smi}; "
                      f"the env's torch: {torch_n}{jax_n})", lines=lines,
                      data={"census": census.to_dict()})

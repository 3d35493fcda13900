"""How many GPUs a witness run has: nvidia-smi's count, and the env's own torch and JAX through the launcher."""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple, Optional

from envport.core.verdict import StepResult, Verdict
from envport.engines.gpu import GpuCensus
from envport.spec.model import Spec
from envport.witness.judge import parse_sentinels, why_missing
from envport.witness.plan import LAUNCH_MARGIN_S, WitnessOptions, requires_gpu


def host_gpu_count() -> int:
    """GPUs nvidia-smi lists here (0 where it is absent or answers oddly)."""
    from envport.engines.gpu import gpu_count

    return gpu_count() or 0


class EnvGpus(NamedTuple):
    """What the env's own frameworks said: torch's count and JAX's (None: did not answer / not installed), the
    cards each listed (index, name, capability, seen_by), and the words behind them, each line saying which
    framework it is from."""

    torch: Optional[int]
    jax: Optional[int]
    words: list
    torch_cards: tuple = ()
    jax_cards: tuple = ()


def _env_gpus(launcher, env: dict, opts: WitnessOptions) -> EnvGpus:
    launched = launcher.run("gpus.py", [], env, opts.check_timeout_s + LAUNCH_MARGIN_S, None)
    rec = next((r for r in parse_sentinels(launched.output) if r["check"] == "gpus"), None)
    if rec is None:
        return EnvGpus(None, None, [f"torch: the env's torch did not answer: "
                                    f"{why_missing(launched, opts.check_timeout_s)}"])
    jax_n, words = _jax_gpus(rec.get("jax"))
    jax_cards = _cards((rec.get("jax") or {}).get("devices"), "jax") if jax_n else ()
    if not rec.get("ok"):
        return EnvGpus(None, jax_n, [f"torch: the env's torch: {rec.get('error')}"] + words, jax_cards=jax_cards)
    return EnvGpus(int(rec.get("count") or 0), jax_n, [f"torch: {x}" for x in rec.get("warnings") or []] + words,
                   _cards(rec.get("devices"), "torch"), jax_cards)


def _cards(devices, seen_by: str) -> tuple:
    return tuple({"index": d.get("index"), "name": d.get("name"), "capability": d.get("capability"),
                  "seen_by": seen_by} for d in devices or [] if isinstance(d, dict))


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
    """Count the GPUs (nvidia-smi, then the env's torch and JAX where GPUs may be there); None for --device cpu.
    nvidia-smi's driver version rides along where nvidia-smi was asked here (not for a count the caller gave)."""
    if opts.device == "cpu":
        return None, []
    from envport.engines.gpu import gpu_inventory, smi_count

    smi, driver = opts.host_gpus, None
    if smi is None:
        inv = gpu_inventory()
        smi, driver = smi_count(inv), inv.get("driver")
    seen = EnvGpus(opts.torch_gpus, None, [])
    if seen.torch is None and (requires_gpu(spec, opts) or (smi or 0) > 0):
        seen = _env_gpus(launcher, env, opts)
    census = GpuCensus(smi, seen.torch, jax=seen.jax, driver=driver)
    # The cards of the framework the census judges by: torch's, else JAX's where only it sees them.
    cards = seen.jax_cards if census.judged_by == "jax" else seen.torch_cards
    return replace(census, devices=cards), seen.words


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

"""`envport parity` as typed steps: build (or find present) and probe every target row, in order.

One TargetFacts per row (report/parity.py compares them): each target is
built through its Target, then probed where the env lives with the target's
own probe. SSH rows build a host target on each site host.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Optional

from envport.core.progress import Progress, quiet
from envport.core.verdict import StepResult, Verdict
from envport.engines.ssh import resolve_host
from envport.report.parity import (PROBE, SAME_MACHINE_SSH_ENVS_DIR, TargetFacts, env_names, parse_probe, run_probe,
                                   same_machine)
from envport.spec.loader import Loaded
from envport.targets.base import BuildRequest, Target
from envport.targets.registry import parity_rows, row_target, ssh_rows


@contextmanager
def envs_dir(path: Optional[str]):
    """ENVPORT_ENVS_DIR for the duration (the shell builder forwards it, over SSH too)."""
    old = os.environ.get("ENVPORT_ENVS_DIR")
    if path:
        os.environ["ENVPORT_ENVS_DIR"] = path
    else:
        os.environ.pop("ENVPORT_ENVS_DIR", None)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("ENVPORT_ENVS_DIR", None)
        else:
            os.environ["ENVPORT_ENVS_DIR"] = old


@dataclass
class ParityOptions:
    targets: tuple[str, ...] = field(default_factory=parity_rows)
    hosts: Optional[list[str]] = None  # SSH site hosts; None: every host of the site profile
    local_envs_dir: Optional[str] = None  # None: $ENVPORT_ENVS_DIR or ~/.envport/envs
    ssh_envs_dir: Optional[str] = None  # None: $ENVPORT_SSH_ENVS_DIR, else a separate dir when the host is here
    rebuild: bool = False
    on_target: Optional[Callable[[TargetFacts], None]] = None



def _skip_or_fail(facts: TargetFacts, results: list[StepResult]) -> bool:
    """True when the build went through; else mark the target skipped (REFUSED) or failed."""
    last = results[-1]
    facts.build = last
    if last.verdict.ok:
        return True
    if last.verdict is Verdict.REFUSED:
        facts.skipped = f"{last.reason or 'refused'}: {last.detail}"
    return False


def run_parity(loaded: Loaded, site, opts: ParityOptions, progress: Progress = quiet) -> list[TargetFacts]:
    """Build (or find present) and probe every target; one TargetFacts each, in order."""
    out: list[TargetFacts] = []
    for target in opts.targets:
        runner = _ssh_targets if target in ssh_rows() else _local_target
        for f in runner(row_target(target), loaded, site, opts, progress):
            out.append(f)
            if opts.on_target:
                opts.on_target(f)
    return out


def _probed(f: TargetFacts, label: str, results: list[StepResult], probe) -> TargetFacts:
    """Record the build; when it went through, probe the env where it lives (`probe(where)` -> (rc, text))."""
    if _skip_or_fail(f, results):
        data = results[-1].data
        f.where = data.get("image") or data.get("sif") or data.get("prefix") or ""
        rc, text = probe(f.where)
        problem = parse_probe(label, rc, text, f)
        if problem:
            f.build = StepResult(f"probe {label}", Verdict.FAILED, problem)
    return f


def _run_probe(argv: list[str], env: Optional[dict] = None) -> tuple[Optional[int], str]:
    return run_probe(argv, stdin=PROBE, env=env)


def _built(target: Target, loaded: Loaded, site, opts: ParityOptions, progress: Progress, label: str,
           host: Optional[str], dir_: Optional[str]) -> TargetFacts:
    """TARGET built (or found present) here or on HOST, then probed where the env lives."""
    f, t0 = TargetFacts(label), time.monotonic()
    progress(f"parity: {label}: building (or finding present)" + (f" in {dir_}" if dir_ else ""))
    with envs_dir(dir_):
        results = target.build(BuildRequest(loaded, site, loaded.root, host=host, rebuild=opts.rebuild,
                                             progress=progress))
    names = env_names(loaded)
    _probed(f, label, results, lambda where: target.probe(_run_probe, where, names, site=site, host=host))
    f.seconds = time.monotonic() - t0
    return f


def _local_target(target: Target, loaded: Loaded, site, opts: ParityOptions, progress: Progress) -> list[TargetFacts]:
    skipped = target.parity_unavailable()
    if skipped:
        return [TargetFacts(target.name, skipped=skipped)]
    dir_ = (opts.local_envs_dir or os.environ.get("ENVPORT_ENVS_DIR")) if target.hosts else None
    return [_built(target, loaded, site, opts, progress, target.name, None, dir_)]


def _ssh_targets(target: Target, loaded: Loaded, site, opts: ParityOptions, progress: Progress) -> list[TargetFacts]:
    hosts = opts.hosts if opts.hosts is not None else sorted(site.hosts)
    if not hosts:
        return [TargetFacts(f"{target.name}@ssh", skipped="no_ssh_host: the site profile names no hosts; pass --host")]
    out = []
    for h in hosts:
        dir_ = opts.ssh_envs_dir or os.environ.get("ENVPORT_SSH_ENVS_DIR")
        if not dir_ and same_machine(resolve_host(site, h)):
            # Same machine: a separate folder, or the "remote" build would find the local one present.
            dir_ = SAME_MACHINE_SSH_ENVS_DIR
        out.append(_built(target, loaded, site, opts, progress, f"{target.name}@{h}", h, dir_))
    return out

"""Whether a site's pip sources can serve what a spec's lock pins, decided offline from the lock alone.

A locked build replays each phase `--no-deps --require-hashes` from the site's sources (plus the
phase's own): a pinned file no source serves fails the build, on a runner, after minutes of setup.
The one case the lock itself proves: a version with a local label (`2.13.0+cpu`) is never on PyPI
(PyPI refuses uploads of local versions), so such a pin needs a source beside PyPI; for PyTorch's
own builds (`+cpu`, `+cu124`, `+rocm6.2`) that source is known by name. Everything else a lock pins
is a public version an index may serve; this module claims nothing about those.

The sources are read from the arguments the pair's build writes after `pip install` (`step_sources`
over PipStep.pip_args of the plan `resolve` gives the target), so the check and the build agree by
construction: a host build, which the site's sources do not reach, is judged by PyPI and the phase's
own sources alone (issue 38, U4).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

PYPI = "https://pypi.org/simple"
PYTORCH_INDEX = "https://download.pytorch.org/whl"
# Projects PyTorch's index serves under a build label (the label names the index's folder).
PYTORCH_PROJECTS = ("torch", "torchvision", "torchaudio")
PYTORCH_LABEL = re.compile(r"^(cpu|cu\d+|rocm\d+(\.\d+)*)$")


@dataclass(frozen=True)
class Unserved:
    phase: int
    dist: str  # name==version
    source: str  # the missing source: a URL, or what kind of source
    known: bool  # True: `source` is the one URL that serves it; False: any source beside PyPI might

    def message(self, site_name: str, site_sources: bool = True) -> str:
        """SITE_SOURCES False: the build is given none of the site's sources (a host build)."""
        lacks = f"site {site_name} has no such source" if site_sources else \
            "this build is given no such source (a host build uses the runner's own pip configuration, not " \
            f"site {site_name}'s pip sources)"
        if self.known:
            return f"phase {self.phase} pins {self.dist}, which only {self.source} serves; {lacks} " \
                   "(PyPI serves no local versions)"
        return (f"phase {self.phase} pins {self.dist}, a local version PyPI never serves; {lacks} "
                f"({self.source})")


def _norm(url: str) -> str:
    return url.rstrip("/")


_SOURCE_FLAGS = ("--index-url", "--extra-index-url", "--find-links")


def step_sources(step) -> list[str] | None:
    """Every index and find-links pip sees for one planned phase, read from the very arguments the build
    writes after `pip install` (PipStep.pip_args: the site's sources where the target's plan carries them,
    a host build's none, and the phase's own), with PyPI where none names an index (pip's default: a
    hosted runner's pip has no configuration of its own). None for a wheelhouse phase (`--no-index`):
    `envport wheelhouse` fetched its files where they are."""
    args = step.pip_args("")
    if "--no-index" in args:
        return None
    given = [(flag, value) for flag, value in zip(args, args[1:]) if flag in _SOURCE_FLAGS]
    index = [] if any(flag == "--index-url" for flag, _ in given) else [PYPI]
    return [_norm(u) for u in (*index, *(value for _, value in given))]


def takes_site_sources(step, site) -> bool:
    """Whether the build of this phase is given the site's pip sources (a container's is; a host build
    uses the host's own pip configuration), so the fix for a missing source names the right file."""
    return not site.pip_source_args() or bool(step.site_args)


def needed_source(name: str, version: str) -> tuple[str, bool] | None:
    """The source a pin needs beyond PyPI, as (source, known), or None when PyPI may serve it."""
    try:
        local = Version(version).local
    except InvalidVersion:
        return None
    if not local:
        return None
    if name in PYTORCH_PROJECTS and PYTORCH_LABEL.match(local):
        return f"{PYTORCH_INDEX}/{local}", True
    return "an index or find-links that serves local versions", False


def unserved(lock, plan) -> list[Unserved]:
    """Each pin of LOCK that its phase's sources in PLAN (the pair's plan: `resolve(loaded, site,
    target).plan`, the one its build renders) cannot serve."""
    steps = {s.index: s for s in plan.steps if getattr(s, "kind", "") == "pip"}
    out = []
    for phase in lock.phases:
        step = steps.get(phase.index)
        sources = step_sources(step) if step is not None else None
        if sources is None:
            continue  # a stale lock (`envport build` refuses it first), or a wheelhouse phase
        for d in phase.dists:
            if d.url:
                continue  # a direct reference names its own file
            need = needed_source(d.name, d.version)
            if need is None:
                continue
            source, known = need
            served = source in sources if known else any(s != PYPI for s in sources)
            if not served:
                out.append(Unserved(phase.index, f"{d.name}=={d.version}", source, known))
    return out

"""Whether a site's pip sources can serve what a spec's lock pins, decided offline from the lock alone.

A locked build replays each phase `--no-deps --require-hashes` from the site's sources (plus the
phase's own): a pinned file no source serves fails the build, on a runner, after minutes of setup.
The one case the lock itself proves: a version with a local label (`2.13.0+cpu`) is never on PyPI
(PyPI refuses uploads of local versions), so such a pin needs a source beside PyPI; for PyTorch's
own builds (`+cpu`, `+cu124`, `+rocm6.2`) that source is known by name. Everything else a lock pins
is a public version an index may serve; this module claims nothing about those.
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

    def message(self, site_name: str) -> str:
        if self.known:
            return (f"phase {self.phase} pins {self.dist}, which only {self.source} serves; "
                    f"site {site_name} has no such source (PyPI serves no local versions)")
        return (f"phase {self.phase} pins {self.dist}, a local version PyPI never serves; "
                f"site {site_name} has no source beside PyPI ({self.source})")


def _norm(url: str) -> str:
    return url.rstrip("/")


def phase_sources(site, phase) -> list[str]:
    """Every index and find-links pip sees for one spec phase: the site's (PyPI when it names no index)
    and the phase's own."""
    index = phase.index_url or site.pip.index_url or PYPI
    return [_norm(u) for u in (index, *site.pip.extra_index_urls, *site.pip.find_links,
                                *phase.extra_index_urls, *phase.find_links)]


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


def unserved(lock, spec, site) -> list[Unserved]:
    """Each pin of LOCK that the site's and its spec phase's sources cannot serve; [] for a site that
    installs from its wheelhouse (`envport wheelhouse` fetches the files where they are)."""
    if site.wheelhouse:
        return []
    out = []
    for phase in lock.phases:
        if not 1 <= phase.index <= len(spec.pip_phases):
            continue  # a stale lock: `envport build` refuses it before any source is asked
        sources = phase_sources(site, spec.pip_phases[phase.index - 1])
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

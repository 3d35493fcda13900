"""docker target -> Dockerfile: one RUN (one layer) per pip phase, so editing the
last phase reuses every earlier layer; no `# syntax=` line (it would fetch a
frontend image, and this must build offline)."""

from __future__ import annotations

from . import template
from .common import context

FILENAME = "Dockerfile"


def render(plan, hash_: str) -> dict[str, str]:
    return {FILENAME: template("Dockerfile.j2").render(context(plan, hash_))}

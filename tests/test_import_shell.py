"""porting/shell/: one handler per command family, each answering an Outcome (or None: not its family).

Exact, one case per family (STYLE.md example 4), so a change in one family shows the one line it moved.
"""

from __future__ import annotations

import pytest

from envport.porting.report import Draft
from envport.porting.shell.commands import HANDLERS, _classify
from envport.porting.shell.context import Outcome, ShellContext


def ctx() -> ShellContext:
    return ShellContext(Draft(file="Dockerfile"), "Dockerfile", "docker")


@pytest.mark.parametrize("seg, outcome, family", [
    ("apt-get install -y git", Outcome.DONE, "packages_family"),
    ("apt-get upgrade -y", Outcome.KEEP, "packages_family"),
    ("rm -rf /var/lib/apt/lists/*", Outcome.DONE, "housekeeping_family"),
    ("set -eux", Outcome.DONE, "housekeeping_family"),
    ("python3 -m pip install six==1.16.0", Outcome.DONE, "python_family"),
    ("uv sync --frozen", Outcome.KEEP, "python_family"),
    ("export FOO=1", Outcome.EXPORT, "export_family"),
    ("wget -q https://example.org/models/model.pt -O /w/model.pt", Outcome.DONE, "weights_family"),
    ("make -j4", Outcome.KEEP, None),
])
def test_each_family_answers_its_own_commands(seg, outcome, family):
    c = ctx()
    assert _classify(seg, 3, c) is outcome
    words = seg.split()
    owners = [h.__name__ for h in HANDLERS if h(words, seg, 3, ctx()) is not None]
    assert owners[:1] == ([family] if family else []), owners


def test_a_pip_phase_and_a_package_land_in_the_draft():
    c = ctx()
    _classify("apt-get install -y --no-install-recommends git curl", 2, c)
    _classify("pip install numpy==1.26.4", 3, c)
    assert c.draft.system_pkgs == ["git", "curl"]
    assert [p.packages for p in c.draft.phases] == [["numpy==1.26.4"]]

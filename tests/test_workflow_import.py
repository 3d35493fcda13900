"""After `envport import`, the next step it prints keeps the generated workflow in step (issue 38, U19).

`envport import` used to say `next: envport render NAME`; in a project that keeps
.github/workflows/envs.yml, that leaves the workflow without the new spec's jobs and CI's
`envport render --all --check` failing. The test follows the printed hint word for word.
"""

from __future__ import annotations

import re
import shlex
import shutil

from .support import REPO, fail_with, run_envport, unique


def _hint(stdout: str) -> list[str]:
    m = re.search(r"it validates \(next: (envport [^()]+?)(?: \(.*\))?\)$", stdout, re.M)
    assert m, stdout
    return shlex.split(m.group(1))


def _imported(project, tmp_path) -> tuple[str, list[str]]:
    """A requirements file imported as a new spec: (its name, the hint the import printed, as argv)."""
    name = unique("imp")
    req = tmp_path / "requirements.txt"
    req.write_text("six==1.16.0\n")
    proc = run_envport("import", str(req), "--name", name, "--base", "envport/debian-bookworm:base",
                       "--python", "3.11", root=project, timeout=120)
    assert proc.returncode == 0, fail_with(proc, "envport import")
    return name, _hint(proc.stdout)


def test_following_the_import_hint_leaves_no_workflow_drift(project, tmp_path):
    shutil.copytree(REPO / ".github", project / ".github")
    baseline = run_envport("render", "--all", root=project, timeout=300)  # whatever the checkout holds, in step
    assert baseline.returncode == 0, fail_with(baseline, "envport render --all")
    name, hint = _imported(project, tmp_path)
    assert hint[:2] == ["envport", "render"], hint
    followed = run_envport(*hint[1:], root=project, timeout=300)
    assert followed.returncode == 0, fail_with(followed, " ".join(hint))
    check = run_envport("render", "--all", "--check", root=project, timeout=300)
    assert check.returncode == 0, fail_with(check, "render --all --check after following the import's hint")
    assert f"{name}-venv" in (project / ".github" / "workflows" / "envs.yml").read_text()


def test_without_a_workflow_the_hint_renders_the_one_spec(project, tmp_path):
    name, hint = _imported(project, tmp_path)
    assert hint == ["envport", "render", name]

"""report/workflow.py and report/lock_sources.py (issue 27 row 3): the generated workflow runs its steps as
the runner's user, root only for what needs it, and never emits a pair whose lock the site cannot serve."""

from __future__ import annotations

from pathlib import Path

import yaml

from envport.plan.lock import LockedDist, LockedPhase, current
from envport.plan.lock import Lock as LockFile
from envport.plan.site import load_site
from envport.report.lock_sources import needed_source, unserved
from envport.spec.loader import all_spec_names, load_spec

from .support import REPO, run_envport

WORKFLOW = Path(".github/workflows/envs.yml")
# The commands of the workflow that need root on a runner, and only these: apt installs, sshd's setup, and
# debootstrap (under `envport base`, given the user's PATH: sudo's secure_path would drop setup-python's).
ROOT_COMMANDS = ("sudo apt-get ", "sudo add-apt-repository ", "sudo bash .ci/services/sshd.sh",
                 'sudo env "PATH=$PATH" envport base ')


def _run_lines(text: str) -> list[str]:
    steps = yaml.safe_load(text)["jobs"]["up"]["steps"]
    return [ln.strip() for s in steps for ln in s.get("run", "").splitlines()]


def test_workflow_steps_run_as_the_user_and_root_only_where_needed():
    lines = _run_lines((REPO / WORKFLOW).read_text())
    sudo = [ln for ln in lines if "sudo" in ln.split("#")[0]]
    assert sudo and all(ln.startswith(ROOT_COMMANDS) for ln in sudo), sudo
    up = [ln for ln in lines if "envport \"$@\"" in ln]
    assert up == ['envport "$@" | tee "reports/up-$PAIR.json"'], lines


def _lock(*dists: tuple[str, str], url: str = "") -> LockFile:
    phase = LockedPhase(1, ("torch==2.13.0",), False,
                        tuple(LockedDist(n, v, f"{n}-{v}.whl", "0" * 64, url) for n, v in dists))
    return LockFile("x", "3.11", "linux-x86_64", "0" * 64, (phase,))


def test_a_local_torch_version_needs_pytorchs_index_by_name():
    assert needed_source("torch", "2.13.0+cpu") == ("https://download.pytorch.org/whl/cpu", True)
    assert needed_source("torchvision", "0.19.1+cu124") == ("https://download.pytorch.org/whl/cu124", True)
    assert needed_source("torch", "2.13.0") is None and needed_source("six", "1.16.0") is None
    assert needed_source("mylib", "1.0+local")[1] is False


def test_unserved_names_the_missing_source_and_accepts_the_phases_own(project):
    spec = load_spec("demo-cpu", REPO).spec
    pypi_only = load_site("local", REPO).model_copy(update={"wheelhouse": False})
    (miss,) = unserved(_lock(("torch", "2.13.0+cpu"), ("six", "1.16.0")), spec, pypi_only)
    assert (miss.phase, miss.dist, miss.source) == (1, "torch==2.13.0+cpu", "https://download.pytorch.org/whl/cpu")
    assert "https://download.pytorch.org/whl/cpu" in miss.message("local")
    with_phase_index = spec.model_copy(update={"pip_phases": [spec.pip_phases[0].model_copy(
        update={"index_url": "https://download.pytorch.org/whl/cpu/"})]})
    assert unserved(_lock(("torch", "2.13.0+cpu")), with_phase_index, pypi_only) == []
    # A direct reference names its own file; a site that installs from its wheelhouse is not asked.
    assert unserved(_lock(("torch", "2.13.0+cpu"), url="https://x.example/t.whl"), spec, pypi_only) == []
    assert unserved(_lock(("torch", "2.13.0+cpu")), spec, pypi_only.model_copy(update={"wheelhouse": True})) == []


def test_the_github_site_serves_every_committed_lock():
    site = load_site("github", REPO)
    for name in all_spec_names(REPO):
        loaded = load_spec(name, REPO)
        lock = current(loaded)
        if lock is not None:
            assert unserved(lock, loaded.spec, site) == [], name


def test_matrix_refuses_the_pairs_whose_lock_the_site_cannot_serve(project):
    site_file = project / "sites" / "github.yaml"
    data = yaml.safe_load(site_file.read_text())
    data.pop("pip", None)  # PyPI alone, as the site was before issue 27
    site_file.write_text(yaml.safe_dump(data, sort_keys=False))
    proc = run_envport("matrix", "--format", "github", root=project, timeout=120)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    # The exit code the user sees is the one --help documents (issue 27: it said only 0 and 1).
    help_text = " ".join(run_envport("matrix", "--help", root=project).stdout.split())
    assert "--format github 3 when a pair was left out" in help_text, help_text
    refused = [ln for ln in proc.stdout.splitlines() if ln.startswith("REFUSED")]
    assert [ln.split()[1] for ln in refused] == [f"demo-cpu-{t}" for t in
                                                  ("docker", "apptainer", "venv", "conda", "podman", "ssh-test")], proc.stdout
    assert all("[lock_source]" in ln and "torch==2.13.0+cpu" in ln and "https://download.pytorch.org/whl/cpu" in ln
               for ln in refused), refused
    text = (project / WORKFLOW).read_text()
    assert '{pair: "demo-cpu-' not in text and '{pair: "scanpy-cpu-venv"' in text
    assert "# not emitted, REFUSED [lock_source]: demo-cpu-venv: phase 1 pins torch==2.13.0+cpu" in text
    # The committed site has the CPU index: every pair is emitted, and the file is the committed one.
    (project / "sites" / "github.yaml").write_text((REPO / "sites" / "github.yaml").read_text())
    proc = run_envport("matrix", "--format", "github", root=project, timeout=120)
    assert proc.returncode == 0 and "REFUSED" not in proc.stdout, proc.stdout + proc.stderr
    assert (project / WORKFLOW).read_text() == (REPO / WORKFLOW).read_text()

"""report/workflow.py and report/lock_sources.py (issue 27 row 3): the generated workflow runs its steps as
the runner's user, root only for what needs it, and never emits a pair whose lock the site cannot serve."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from envport.plan.lock import LockedDist, LockedPhase, current
from envport.plan.lock import Lock as LockFile
from envport.plan.site import load_site
from envport.report.lock_sources import needed_source, unserved
from envport.spec.loader import all_spec_names, load_spec

from .support import REPO, run_envport

WORKFLOW = Path(".github/workflows/envs.yml")
# The commands of the workflow that need root on a runner, and only these: apt installs, debootstrap (under
# `envport base`, given the user's PATH: sudo's secure_path would drop setup-python's) and envport's own SIF
# build (its %post runs as root), which `envport up` gets for an apptainer row on a hosted runner.
ROOT_COMMANDS = ("sudo apt-get ", "sudo add-apt-repository ", 'sudo env "PATH=$PATH" envport base ',
                 'set -- sudo env "PATH=$PATH" ENVPORT_STATE_DIR=/var/lib/envport-runner/state ',
                 "if sudo test -d /var/lib/envport-runner/state", "sudo cp -r /var/lib/envport-runner/state/. ",
                 'sudo chown -R "$(id -u):$(id -g)" "$ENVPORT_STATE_DIR"')
UP_LINE = '"$@" | tee "reports/up-$PAIR.json"'


def _run_lines(text: str) -> list[str]:
    steps = yaml.safe_load(text)["jobs"]["up"]["steps"]
    return [ln.strip() for s in steps for ln in s.get("run", "").splitlines()]


def test_workflow_steps_run_as_the_user_and_root_only_where_needed():
    lines = _run_lines((REPO / WORKFLOW).read_text())
    sudo = [ln for ln in lines if "sudo" in ln.split("#")[0]]
    assert sudo and all(ln.startswith(ROOT_COMMANDS) for ln in sudo), sudo
    up = [ln for ln in lines if '"$@" |' in ln]
    assert up == [UP_LINE], lines


def _lock(*dists: tuple[str, str], url: str = "") -> LockFile:
    phase = LockedPhase(1, ("torch==2.13.0",), False,
                        tuple(LockedDist(n, v, f"{n}-{v}.whl", "0" * 64, url) for n, v in dists))
    return LockFile("x", "3.11", "linux-x86_64", "0" * 64, (phase,))


def test_a_local_torch_version_needs_pytorchs_index_by_name():
    assert needed_source("torch", "2.13.0+cpu") == ("https://download.pytorch.org/whl/cpu", True)
    assert needed_source("torchvision", "0.19.1+cu124") == ("https://download.pytorch.org/whl/cu124", True)
    assert needed_source("torch", "2.13.0") is None and needed_source("six", "1.16.0") is None
    assert needed_source("mylib", "1.0+local")[1] is False


def _plan(loaded, site, target: str):
    from envport.recipe.identity import resolve
    from envport.targets.registry import get

    return resolve(loaded, site, get(target)).plan


def test_unserved_names_the_missing_source_and_accepts_the_phases_own(project):
    loaded = load_spec("demo-cpu", REPO)
    pypi_only = load_site("local", REPO).model_copy(update={"wheelhouse": False})
    (miss,) = unserved(_lock(("torch", "2.13.0+cpu"), ("six", "1.16.0")), _plan(loaded, pypi_only, "docker"))
    assert (miss.phase, miss.dist, miss.source) == (1, "torch==2.13.0+cpu", "https://download.pytorch.org/whl/cpu")
    assert "https://download.pytorch.org/whl/cpu" in miss.message("local")
    spec = loaded.spec
    with_phase_index = loaded.__class__(**{**vars(loaded), "spec": spec.model_copy(update={"pip_phases": [
        spec.pip_phases[0].model_copy(update={"index_url": "https://download.pytorch.org/whl/cpu/"})]})})
    assert unserved(_lock(("torch", "2.13.0+cpu")), _plan(with_phase_index, pypi_only, "venv")) == []
    # A direct reference names its own file; a site that installs from its wheelhouse is not asked.
    assert unserved(_lock(("torch", "2.13.0+cpu"), url="https://x.example/t.whl"),
                    _plan(loaded, pypi_only, "docker")) == []
    wheelhouse = pypi_only.model_copy(update={"wheelhouse": True})
    assert unserved(_lock(("torch", "2.13.0+cpu")), _plan(loaded, wheelhouse, "docker")) == []


def test_the_lock_check_reads_the_sources_the_build_writes(project):
    """U4: the site's CPU index reaches a container's `pip install` line, never a host build's (venv, conda,
    SSH: the host's pip configuration), so the check serves the container pairs and not the host ones,
    from the very arguments each build writes (PipStep.pip_args)."""
    from envport.report.lock_sources import step_sources

    site = load_site("github", REPO)
    loaded = load_spec("demo-cpu", REPO)
    lock = current(loaded)
    assert lock is not None
    for target, served in (("docker", True), ("podman", True), ("apptainer", True), ("venv", False),
                           ("conda", False)):
        plan = _plan(loaded, site, target)
        step = next(s for s in plan.steps if getattr(s, "kind", "") == "pip")
        line = " ".join(step.pip_args(""))
        sources = step_sources(step)
        # The check's sources are exactly the ones on the build's pip line (plus pip's default index).
        assert all(u in line for u in sources if u != "https://pypi.org/simple"), (target, sources, line)
        assert ("https://download.pytorch.org/whl/cpu" in line) == served, (target, line)
        assert (unserved(lock, plan) == []) == served, target


def test_the_github_site_serves_every_committed_lock_on_the_targets_it_reaches():
    from envport.report.workflow import refused

    site = load_site("github", REPO)
    loaded = [load_spec(n, REPO) for n in all_spec_names(REPO)]
    lock_refused = {r.pair for r in refused(loaded, site) if r.reason == "lock_source"}
    for ld in loaded:
        lock = current(ld)
        for target in ("docker", "podman", "apptainer"):
            assert lock is None or unserved(lock, _plan(ld, site, target)) == [], (ld.spec.name, target)
            assert f"{ld.spec.name}-{target}" not in lock_refused
    assert {"demo-cpu-venv", "demo-cpu-conda"} <= lock_refused


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
    refused = [ln for ln in proc.stdout.splitlines() if ln.startswith("REFUSED") and "[lock_source]" in ln]
    assert [ln.split()[1] for ln in refused] == [f"demo-cpu-{t}" for t in
                                                  ("docker", "apptainer", "venv", "conda", "podman", "ssh-test")], proc.stdout
    assert all("[lock_source]" in ln and "torch==2.13.0+cpu" in ln and "https://download.pytorch.org/whl/cpu" in ln
               for ln in refused), refused
    text = (project / WORKFLOW).read_text()
    assert '{pair: "demo-cpu-' not in text and '{pair: "scanpy-cpu-venv"' in text
    assert "# not emitted, REFUSED [lock_source]: demo-cpu-venv: phase 1 pins torch==2.13.0+cpu" in text
    # The committed site has the CPU index: the container pairs are emitted; the host pairs, whose builds use
    # the runner's own pip (PyPI), are not (U4); nor any SSH pair (U3). The file is the committed one.
    (project / "sites" / "github.yaml").write_text((REPO / "sites" / "github.yaml").read_text())
    proc = run_envport("matrix", "--format", "github", root=project, timeout=120)
    refused = {ln.split()[1]: ln for ln in proc.stdout.splitlines() if ln.startswith("REFUSED")}
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert {k for k, v in refused.items() if "[lock_source]" in v} == {"demo-cpu-venv", "demo-cpu-conda",
                                                                       "demo-cpu-ssh-test"}, refused
    assert "spec phase's own extra_index_urls" in refused["demo-cpu-venv"]
    assert all("[unreachable_host]" in v for k, v in refused.items() if k.endswith("-ssh-test")
               and k != "demo-cpu-ssh-test"), refused
    assert (project / WORKFLOW).read_text() == (REPO / WORKFLOW).read_text()


def test_no_emitted_pair_needs_an_ssh_host_the_runner_cannot_reach():
    """U3: the SSH pairs used the sshd a job starts under sudo (root-only config, remote user root): not
    emitted, each named in the header with its reason."""
    data = yaml.safe_load((REPO / WORKFLOW).read_text())
    rows = data["jobs"]["up"]["strategy"]["matrix"]["include"]
    assert rows and all(r["host"] == "" for r in rows), [r["pair"] for r in rows if r["host"]]
    text = (REPO / WORKFLOW).read_text()
    for name in all_spec_names(REPO):
        assert f"[unreachable_host]: {name}-ssh-test:" in text or f"[lock_source]: {name}-ssh-test:" in text, name


def test_podman_pairs_on_a_local_base_get_it_into_podmans_store():
    """U5: `envport base` puts the base into docker (as root); rootless podman reads the runner user's
    own store, so a podman pair on an envport/* base needs the step that loads it there."""
    data = yaml.safe_load((REPO / WORKFLOW).read_text())
    rows = data["jobs"]["up"]["strategy"]["matrix"]["include"]
    steps = data["jobs"]["up"]["steps"]
    podman_local = [r for r in rows if r["target"] == "podman" and r["local-base"]]
    assert podman_local, "no podman pair on a local base: this test has nothing to check"
    for row in podman_local:
        ran = [s for s in steps if _runs(s.get("if", ""), row)]
        body = "\n".join(s.get("run", "") for s in ran)
        load = body.index("| podman load")
        assert body.index("envport base debian-bookworm") < load, body
        assert "podman image exists envport/debian-bookworm:base" in body and load < body.index(UP_LINE)
    docker_rows = [r for r in rows if r["target"] == "docker" and r["local-base"]]
    assert all("podman" not in "".join(s.get("run", "") for s in steps if _runs(s.get("if", ""), r))
               for r in docker_rows)


def _up_argv(row: dict, steps: list) -> list[str]:
    """What the `envport up` step runs for ROW, its shell lines played by bash with the row's env (not run)."""
    import subprocess

    step = next(s for s in steps if s.get("name") == "envport up")
    env = {k: str(v).replace("${{ matrix.", "").replace(" }}", "") for k, v in step["env"].items()}
    env = {k: ("" if row.get(v) is None else str(row[v])) for k, v in env.items()}
    script = step["run"].replace(UP_LINE, 'printf "%s\\n" "$@"').replace("mkdir -p reports", ":")
    out = subprocess.run(["bash", "-ec", script], env={**env, "PATH": "/usr/bin:/bin", "ENVPORT_STATE_DIR": "S"},
                         capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


def test_apptainer_rows_build_with_envports_builder_on_a_hosted_runner_and_apptainer_on_a_gpu_one():
    """Issue 38: the hosted runner's apptainer job is the one the faithful runner plays (envport's own SIF
    builder, under sudo, from Ubuntu's packages); a self-hosted GPU row installs apptainer (the PPA)."""
    data = yaml.safe_load((REPO / WORKFLOW).read_text())
    rows = data["jobs"]["up"]["strategy"]["matrix"]["include"]
    steps = data["jobs"]["up"]["steps"]
    apptainer_rows = [r for r in rows if r["target"] == "apptainer"]
    assert {r["sif-builder"] for r in apptainer_rows} == {"envport", "apptainer"}, apptainer_rows
    assert all(r["sif-builder"] == "" for r in rows if r["target"] != "apptainer")
    for row in apptainer_rows:
        body = "\n".join(s.get("run", "") for s in steps if _runs(s.get("if", ""), row))
        argv = _up_argv(row, steps)
        hosted = row["runner"] == ["ubuntu-24.04"]
        assert (row["sif-builder"] == "envport") == hosted, row
        assert ("add-apt-repository -y ppa:apptainer/ppa" in body) != hosted, row
        assert ("charliecloud-runtime" in body) == hosted, row
        if hosted:
            assert argv[:6] == ["sudo", "env", "PATH=/usr/bin:/bin", "ENVPORT_STATE_DIR=/var/lib/envport-runner/state",
                                "ENVPORT_SIF_DIR=/var/lib/envport-runner/sif", "ENVPORT_SIF_BUILDER=envport"], argv
            assert argv[6:9] == ["envport", "up", row["env"]], argv
        else:
            assert argv[:3] == ["envport", "up", row["env"]], argv
    docker_row = next(r for r in rows if r["target"] == "docker")
    assert _up_argv(docker_row, steps)[:2] == ["envport", "up"]


def test_no_conda_job_on_a_hosted_runner():
    """Issue 38: a hosted runner's conda job is not played by the faithful runner (no conda channel where
    envport is tested): not emitted, each named with its reason; a GPU spec's self-hosted conda row stays."""
    data = yaml.safe_load((REPO / WORKFLOW).read_text())
    rows = data["jobs"]["up"]["strategy"]["matrix"]["include"]
    assert not [r["pair"] for r in rows if r["target"] == "conda" and r["runner"] == ["ubuntu-24.04"]]
    assert [r for r in rows if r["target"] == "conda"], "no self-hosted conda row: the GPU specs lost theirs"
    text = (REPO / WORKFLOW).read_text()
    for name in all_spec_names(REPO):
        ld = load_spec(name, REPO)
        if ld.spec.resources.gpus == 0:
            assert re.search(rf"# not emitted, REFUSED \[(unverified_job|lock_source)\]: {name}-conda: ", text), name


def _runs(condition, row) -> bool:
    """A step's `if:` for ROW: the workflow's conditions are `&&` of `matrix.X`, `matrix.X == 'v'` and
    `matrix.X != 'v'` (the faithful-runner test evaluates them the same way)."""
    if isinstance(condition, bool) or not condition:
        return condition is not False
    for term in (t.strip() for t in str(condition).split("&&")):
        if term == "always()":
            continue
        m = re.fullmatch(r"matrix\.([\w-]+)(?:\s*(==|!=)\s*'([^']*)')?", term)
        assert m, f"a condition this test cannot read: {term!r}"
        value = row.get(m.group(1))
        ok = bool(value) if m.group(2) is None else (str(value) == m.group(3)) == (m.group(2) == "==")
        if not ok:
            return False
    return True


def test_envport_sif_dir_moves_the_sif_and_keys_the_no_op_builds_memory(monkeypatch):
    """The hosted apptainer job's root build keeps its SIF out of the runner user's checkout with
    $ENVPORT_SIF_DIR: it overrides the profile's sif_dir as the profile is read (a site copy that names its
    own folder, as rebuild-check's does, keeps it), and a no-op build under another one is asked afresh."""
    from envport.builders.present_cache import inputs_digest

    monkeypatch.delenv("ENVPORT_SIF_DIR", raising=False)
    assert load_site("github", REPO).apptainer.sif_path(REPO) == REPO / ".cache" / "sif"
    before = inputs_digest(str(REPO), "demo-cpu", "github", "apptainer")
    monkeypatch.setenv("ENVPORT_SIF_DIR", "/var/lib/envport-runner/sif")
    site = load_site("github", REPO)
    assert site.apptainer.sif_path(REPO) == Path("/var/lib/envport-runner/sif")
    assert load_site("local", REPO).apptainer.sif_path(REPO) == Path("/var/lib/envport-runner/sif")
    copy = site.model_copy(update={"apptainer": site.apptainer.model_copy(update={"sif_dir": "/tmp/x"})})
    assert copy.apptainer.sif_path(REPO) == Path("/tmp/x")
    assert inputs_digest(str(REPO), "demo-cpu", "github", "apptainer") != before

"""The generated workflow's jobs, run the way a hosted ubuntu runner runs them (issue 38: the faithful runner).

tests/faithful_runner.py plays the runner on this host and says what it plays; HOST-CHANGING, said so: it
makes the user `runner` (.ci/faithful-runner.sh: password-less sudo, the docker group, a subordinate id
range, Debian's sudo where missing), as tests/test_podman.py's fixtures make theirs.

Every job kind the committed workflow emits for ubuntu-24.04 runs once, on the cheapest pair that has it
(CI cost: the whole suite runs on 2 cores): docker, podman, apptainer (envport's own SIF builder: the job
installs its Ubuntu packages, here Debian's, already installed, and runs `envport up` under the runner's
password-less sudo) and venv on a six-only spec the user
adds (its pairs are the same steps as the committed pairs of each kind; `matrix --format github` and
`render --all` in the checkout, as the user would commit them). ENVPORT_TEST_DEEP=1 (`--deep`) runs every
committed ubuntu pair this host can run too: demo-cpu's (the `+cpu` torch from the site's index, issue 38's
U4; demo-cpu-docker alone took 12 min here under load, 5 of them building) and scanpy-cpu's venv. Pairs on a
registry base (python:3.11-slim-bookworm) cannot run here (no registry): their kind is covered.

The site's PyTorch CPU index is played by a local find-links folder served over HTTP on 127.0.0.1 that
holds the local torch wheel (the same file the index serves: the lock's sha256 checks it), added to the
checkout's sites/github.yaml beside the index URL, which stays (unreachable here, pip passes over it). A
runner's pip reaches download.pytorch.org itself; nothing else of this machine's pip setup reaches the job.
This host also intercepts TLS, so the same copy of the site names the host's CA bundle (as sites/local.yaml
does; a runner needs none): without it a container's pip cannot reach PyPI here. Both change the pairs'
hashes, not the workflow (`render --all --check` in the job compares it). pip's own cache folder is shared
by this session's jobs (XDG_CACHE_HOME): the first job fills it from PyPI through the same unconfigured pip,
the next ones save the downloads (CI time); a container build never sees it.
"""

from __future__ import annotations

import functools
import http.server
import json
import shutil
import subprocess
import threading
from pathlib import Path

import pytest
import yaml

from envport.report.workflow import ROOT_DIR

from . import faithful_runner as fr
from .support import copy_tracked, deep, run_envport, torch_wheel, write_spec

WORKFLOW = Path(".github/workflows/envs.yml")
TINY = "ghrunner-tiny"
CPU_RUNNER = ["ubuntu-24.04"]
# This host intercepts TLS (sites/local.yaml says so): a container reaches PyPI only trusting this bundle.
HOST_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
# Each kind the committed workflow emits for ubuntu-24.04 -> the pair that proves it in CI.
CI_PAIRS = {"docker": f"{TINY}-docker", "podman": f"{TINY}-podman", "apptainer": f"{TINY}-apptainer",
            "venv": f"{TINY}-venv"}


def _kind(row: dict) -> str:
    return row["target"] + (f"@{row['host']}" if row["host"] else "")


def _ubuntu_rows(workflow: dict) -> list[dict]:
    return [r for r in workflow["jobs"]["up"]["strategy"]["matrix"]["include"] if r["runner"] == CPU_RUNNER]


def _runnable_here(row: dict) -> bool:
    """A pair this host can run as a runner would: its base is made here (debootstrap), or it is a host
    target; a registry base is not reachable here."""
    return row["local-base"] or row["target"] == "venv"


def test_every_ubuntu_job_kind_the_committed_workflow_emits_is_played():
    committed = yaml.safe_load((fr.REPO / WORKFLOW).read_text())
    kinds = {_kind(r) for r in _ubuntu_rows(committed)}
    assert kinds <= set(CI_PAIRS), f"a new job kind: add its pair to CI_PAIRS: {kinds}"


def test_each_played_pair_runs_the_steps_of_the_committed_pairs_of_its_kind(runner_project):
    """The six-only spec's pairs stand for the committed ones: the same steps, `if:`s evaluated, for every
    committed ubuntu pair of the kind with the same kind of base (a registry base skips the base steps)."""
    _, _, workflow, _ = runner_project
    committed = yaml.safe_load((fr.REPO / WORKFLOW).read_text())
    played = {r["pair"]: r for r in workflow["jobs"]["up"]["strategy"]["matrix"]["include"]}

    def names(wf: dict, row: dict) -> list[str]:
        return [s.name for s in fr.job_steps(wf, row, Path("/workspace"))]

    compared = 0
    for row in _ubuntu_rows(committed):
        pair = played.get(CI_PAIRS.get(_kind(row), ""))
        if pair is None or pair["local-base"] != row["local-base"]:
            continue
        assert names(committed, row) == names(workflow, pair), (row["pair"], pair["pair"])
        compared += 1
    assert compared >= len(CI_PAIRS), compared


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def pytorch_index_played(tmp_path_factory):
    """A find-links folder holding the local torch wheel, served on 127.0.0.1 (its URL)."""
    wheel = torch_wheel()
    if wheel is None:
        pytest.fail("the local torch wheel is missing (tests/support.py TORCH_WHEELS)")
    folder = tmp_path_factory.mktemp("pytorch-cpu-index")
    (folder / wheel.name).symlink_to(wheel)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                             functools.partial(_Quiet, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()


@pytest.fixture(scope="module")
def runner_project(tmp_path_factory, pytorch_index_played):
    """(runner user, the checkout a job starts from, its workflow): the user's commit of a six-only spec
    (its workflow rows and images/ written as the user would), the site's PyTorch index played."""
    pw = fr.ensure_runner()
    project = copy_tracked(tmp_path_factory.mktemp("checkout") / "project")
    _copy_new_files(project)
    site_file = project / "sites" / "github.yaml"
    site = yaml.safe_load(site_file.read_text())
    site["pip"]["find_links"] = [pytorch_index_played]
    site["ca_bundle"] = HOST_CA_BUNDLE
    site_file.write_text(yaml.safe_dump(site, sort_keys=False))
    write_spec(project, TINY, witnesses={"imports": ["six"],
                                         "cli": [{"cmd": "python -c 'import six; print(six.__version__)'",
                                                  "expect": "^1\\.16\\.0"}]})
    wrote = run_envport("matrix", "--format", "github", root=project, timeout=300)
    assert wrote.returncode in (0, 3), wrote.stdout + wrote.stderr  # 3: pairs left out, each named
    run_envport("render", "--all", root=project, timeout=300, check=True)
    workflow = yaml.safe_load((project / WORKFLOW).read_text())
    cache = fr.new_cache(pw)
    yield pw, project, workflow, cache
    shutil.rmtree(cache, ignore_errors=True)


def _copy_new_files(project: Path) -> None:
    """Files not yet committed but not ignored either (a clone in CI has none): what the next commit holds."""
    listed = subprocess.run(["git", "ls-files", "-z", "--others", "--exclude-standard"], cwd=fr.REPO,
                            capture_output=True, check=True)
    for rel in filter(None, listed.stdout.decode().split("\0")):
        if (fr.REPO / rel).is_file():
            (project / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(fr.REPO / rel, project / rel)


def _pairs() -> list[str]:
    if not deep():
        return sorted(CI_PAIRS.values())
    committed = yaml.safe_load((fr.REPO / WORKFLOW).read_text())
    return sorted({*CI_PAIRS.values(), *(r["pair"] for r in _ubuntu_rows(committed) if _runnable_here(r))})


def _remove_built_images(env: str, env_hash: str) -> None:
    """The docker images this job built (their hash is this run's: the played index's URL is in it)."""
    listed = subprocess.run(["docker", "images", "--format", "{{.Repository}}:{{.Tag}}", f"envport/{env}"],
                            capture_output=True, text=True)
    tags = [t for t in listed.stdout.split() if env_hash[:12] in t]
    if tags:
        subprocess.run(["docker", "rmi", "-f", *tags], capture_output=True)


@pytest.mark.parametrize("pair", _pairs())
def test_the_job_passes_on_a_faithful_runner(runner_project, pair):
    pw, project, workflow, cache = runner_project
    row = next((r for r in workflow["jobs"]["up"]["strategy"]["matrix"]["include"] if r["pair"] == pair), None)
    assert row is not None, f"{pair} is not in the workflow (`envport matrix` says why)"
    assert row["runner"] == CPU_RUNNER, row
    job = fr.new_job(pw, project, cache)
    up = None
    try:
        passed, steps = fr.run_job(job, pw, workflow, row)
        log = "\n".join(job.log)[-12000:]
        report = job.workspace / "reports" / f"up-{pair}.json"
        if report.is_file() and report.read_text().strip():
            up = json.loads(report.read_text())
        assert passed, log
        ran = [s.name for s in steps if s.run is not None]
        assert "envport up" in ran and "Install envport" in ran, ran
        assert up is not None, log
        assert up["exit_code"] == 0, json.dumps(up["steps"], indent=1)[-6000:]
        verdicts = {s["step"]: s["verdict"] for s in up["steps"]}
        assert verdicts["build"] in ("OK", "present"), up["steps"]
        assert all(v in ("OK", "present", "skipped") for v in verdicts.values()), up["steps"]
        assert verdicts.get("witness") == "OK", up["steps"]  # it ran, and held
    finally:
        if up is not None and row["target"] == "docker":
            _remove_built_images(row["env"], up["hash"])
        if row["sif-builder"] == "envport":
            # HOST-CHANGING, said so: the job's sudo'd SIF build keeps its state and SIF where a runner's root
            # would (the workflow's root folder); removed, so no later job here finds this one's records.
            shutil.rmtree(ROOT_DIR, ignore_errors=True)
        fr.remove_job(job, pw)
        shutil.rmtree(job.top, ignore_errors=True)

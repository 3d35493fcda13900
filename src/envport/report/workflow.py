"""`.github/workflows/envs.yml`: the (env, target) matrix as a GitHub Actions workflow, generated from specs/.

One job per pair of report/matrix.py (strategy matrix `include:` rows, so a
new spec adds its jobs): checkout, setup-python, install envport, `envport
render --all --check`, what the target needs on the runner, `envport up` for
the pair, and the verify JUnit, the up JSON and the ledger uploaded. Jobs use
the `github` site profile (sites/github.yaml: the runner pulls base images).
A pair whose spec asks for GPUs (resources.gpus > 0) runs on a self-hosted
runner labelled `[self-hosted, linux, gpu, gpus-N]` (N from the spec's
resources.gpus). An apptainer job on a
hosted runner builds with envport's own SIF builder (Ubuntu's squashfs-tools,
bubblewrap, squashfuse, charliecloud-runtime; `envport up` under sudo: its
%post runs as root, as apptainer's own root builds do), the job the project's
faithful-runner test plays; on a self-hosted runner it installs apptainer the
way its admin guide does on Ubuntu (the apptainer PPA). Other steps run as the
runner's user; only apt, sshd, debootstrap and that SIF build run under sudo
(sudo's secure_path on GitHub's images would drop setup-python's bin/ and
conda's, so sudo is given this PATH). A spec whose lock pins a file the site's sources cannot serve
(a `+cpu` torch with PyPI alone) has none of its pairs emitted, nor has a conda
pair on a hosted runner (`unverified_job`: see _hosted_refusal): the file's
header names each with why, and `matrix --format github` exits 3. The
text (envs.yml.j2 beside this module) is a pure function of the specs and the
site: the same bytes every run, which `envport render --all --check` compares.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from envport.builders.base_image import RECIPES
from envport.core.files import write_atomic

WORKFLOW_PATH = Path(".github/workflows/envs.yml")
WORKFLOW_SITE = "github"
CPU_RUNNER = "ubuntu-24.04"
PYTHON = "3.11"
# What the workflow's `envport base debian-bookworm` step makes (docker's store, as root): the base of every
# `local-base` pair, which the podman step copies into the runner user's own store.
LOCAL_BASE_RECIPE = "debian-bookworm"
TEMPLATE = "envs.yml.j2"
# A spec's lock pins a file no source of the site serves (report/lock_sources.py).
LOCK_SOURCE_REASON = "lock_source"
# A pair on a site host the runner cannot reach as its own user (issue 38, U3).
HOST_REASON = "unreachable_host"
# A job kind on a hosted runner that the project's faithful-runner test cannot play (issue 38).
UNVERIFIED_REASON = "unverified_job"
# Which SIF builder an apptainer job uses (the row's `sif-builder`): envport's own on a hosted runner (its
# packages are Ubuntu's, and the faithful-runner test plays that job), apptainer on a self-hosted one.
OWN_SIF_BUILDER = "envport"
APPTAINER_SIF_BUILDER = "apptainer"
# Where envport's own SIF build (under sudo) keeps its state and its SIF on a hosted runner: folders of
# root's, since root trusts no build record (state_dir_unsafe) and mounts no SIF (sif_unsafe) under a folder
# another user owns, as the runner user owns the checkout; the state is copied to the job's for upload.
ROOT_DIR = "/var/lib/envport-runner"


def gpu_runner(gpus: int) -> list[str]:
    return ["self-hosted", "linux", "gpu", f"gpus-{gpus}"]


def rows(loaded_specs: list, site) -> list[dict]:
    """One strategy-matrix row per pair, in spec-name then target order."""
    from envport.report.matrix import TARGETS, base_of, pairs
    from envport.targets.registry import row_target

    by_name = {ld.spec.name: ld for ld in loaded_specs}
    out = []
    for p in pairs(sorted(by_name), site, TARGETS):
        loaded = by_name[p.env]
        gpus = loaded.spec.resources.gpus
        target = row_target(p.target)
        up_target = target.name
        # A container target builds FROM the base image; a host target (venv, conda) runs on the runner itself.
        local_base = not target.hosts and base_of(loaded, site, up_target).image.startswith("envport/")
        out.append({"pair": p.key, "env": p.env, "target": up_target, "host": p.host or "",
                    "local-base": local_base, "sif-builder": sif_builder(target, gpus),
                    "runner": gpu_runner(gpus) if gpus > 0 else [CPU_RUNNER]})
    return out


def sif_builder(target, gpus: int) -> str:
    """The row's `sif-builder` ("" for a Target that builds no SIF)."""
    if not target.signs:
        return ""
    return APPTAINER_SIF_BUILDER if gpus > 0 else OWN_SIF_BUILDER


def _flow(value) -> str:
    """A YAML flow value that is also JSON (strings quoted, lists inline): stable and unambiguous."""
    return json.dumps(value)


@dataclass(frozen=True)
class RefusedPair:
    pair: str
    reason: str
    message: str


def refused(loaded_specs: list, site) -> list[RefusedPair]:
    """The pairs the workflow must not emit: a pair whose lock pins a file its build's pip sources cannot
    serve (report/lock_sources.py, read from the plan that build renders: a host build gets none of the
    site's sources) fails on the runner, so it is not written; nor is a pair on a site host the runner
    cannot reach as its own user (`unreachable_host`), nor a hosted runner's conda job (`unverified_job`)."""
    from envport.plan.lock import current
    from envport.report.matrix import TARGETS, pairs

    out = []
    for ld in sorted(loaded_specs, key=lambda ld: ld.spec.name):
        lock = current(ld) if site.lock else None
        for p in pairs([ld.spec.name], site, TARGETS):
            why = ((_lock_refusal(ld, lock, p, site) if lock is not None else None) or _host_refusal(p, site)
                   or _hosted_refusal(p, ld.spec.resources.gpus))
            if why:
                out.append(why)
    return out


def _lock_refusal(ld, lock, pair, site) -> RefusedPair | None:
    from envport.recipe.identity import resolve
    from envport.report.lock_sources import takes_site_sources, unserved
    from envport.targets.registry import row_target

    plan = resolve(ld, site, row_target(pair.target)).plan
    missing = unserved(lock, plan)
    if not missing:
        return None
    known = sorted({m.source for m in missing if m.known})
    step = next(s for s in plan.steps if getattr(s, "kind", "") == "pip" and s.index == missing[0].phase)
    site_sources = takes_site_sources(step, site)
    where = "the site's pip.extra_index_urls" if site_sources else "the spec phase's own extra_index_urls"
    fix = f"; fix: add {', '.join(known)} to {where}" if known else ""
    return RefusedPair(pair.key, LOCK_SOURCE_REASON,
                       "; ".join(m.message(site.name, site_sources) for m in missing) + fix)


def _host_refusal(pair, site) -> RefusedPair | None:
    """A pair on an SSH site host: a runner has none but the one a job would start itself
    (.ci/services/sshd.sh, under sudo), whose config is root's alone and whose remote user is root, so
    `envport up --host` as the runner user gets Permission denied [ssh_unreachable]; not emitted."""
    if not pair.host:
        return None
    return RefusedPair(pair.key, HOST_REASON, f"site host {pair.host} is the sshd the workflow would start with "
                       "`sudo bash .ci/services/sshd.sh`: its ssh_config (/var/lib/envport-ssh) is root's alone and "
                       "it logs in as root, whose PATH on ubuntu-24.04 may have no python3.11, so `envport up "
                       "--host` as the runner user fails [ssh_unreachable]; run SSH pairs against a real site host "
                       "(a self-hosted runner with its own ssh_config)")


def _hosted_refusal(pair, gpus: int) -> RefusedPair | None:
    """A pair on a hosted runner whose job kind the project's faithful-runner test (tests/test_workflow_run.py)
    cannot play (the Target's hosted_job_unplayed: conda's): the workflow does not emit a job never seen to
    pass there. A GPU spec's pair runs on a self-hosted runner (its admin's tools) and stays."""
    from envport.targets.registry import row_target

    why = row_target(pair.target).hosted_job_unplayed
    if gpus > 0 or not why:
        return None
    return RefusedPair(pair.key, UNVERIFIED_REASON, f"{why}; run this pair with `envport matrix --run` (or "
                       "`--run --slurm CLUSTER`) on a host that has what it needs, or on a self-hosted runner")


def _template():
    # The renderers' environment (StrictUndefined, trim_blocks), reading the template beside this module;
    # values are {= =} so GitHub's own ${{ }} expressions pass through as they are.
    import jinja2

    from envport.renderers import ENV

    return ENV.overlay(loader=jinja2.FileSystemLoader(str(Path(__file__).parent)), variable_start_string="{=",
                       variable_end_string="=}").get_template(TEMPLATE)


def workflow_text(loaded_specs: list, site) -> str:
    skip = refused(loaded_specs, site)
    dropped = {r.pair for r in skip}
    include = [", ".join(f"{k}: {_flow(v)}" for k, v in row.items())
               for row in rows(loaded_specs, site) if row["pair"] not in dropped]
    return _template().render(site=site.name, python=PYTHON, rows=include, refused=skip, root_dir=ROOT_DIR,
                              local_base=RECIPES[LOCAL_BASE_RECIPE], local_base_recipe=LOCAL_BASE_RECIPE)


def for_project(root: Path, loaded_specs: list, site_name: str = WORKFLOW_SITE) -> str:
    from envport.plan.site import load_site

    return workflow_text(loaded_specs, load_site(site_name, root))


def emit(root: Path, loaded_specs: list) -> int:
    """`envport matrix --format github`: write the workflow, say what it holds and each pair it refused
    to emit; exit 3 when any was refused (the workflow then runs the others)."""
    from envport.plan.site import load_site

    site = load_site(WORKFLOW_SITE, root)
    text = workflow_text(loaded_specs, site)
    changed = write(root, text)
    jobs = text.count("\n          - {")
    print(f"{'OK' if changed else 'present':<8} {WORKFLOW_PATH} ({jobs} jobs{'' if changed else ', unchanged'})")
    skip = refused(loaded_specs, site)
    for r in skip:
        print(f"REFUSED  {r.pair} [{r.reason}]: not in the workflow: {r.message}")
    return 3 if skip else 0


def write(root: Path, text: str) -> bool:
    """Write the workflow under ROOT; True when it changed."""
    path = root / WORKFLOW_PATH
    if path.is_file() and path.read_text() == text:
        return False
    write_atomic(path, text)
    return True


def drift(root: Path, text: str) -> list[str]:
    """[the workflow's path] when the committed file exists and differs from TEXT; a project that never
    generated one has nothing to drift."""
    path = root / WORKFLOW_PATH
    if not path.exists():
        return []
    try:
        same = path.read_text() == text
    except (OSError, UnicodeDecodeError):
        same = False
    # No fix here: `envport render --all --check` prints the one fix for all its drift (`render --all`).
    return [] if same else [str(WORKFLOW_PATH)]

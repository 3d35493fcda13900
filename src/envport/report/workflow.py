"""`.github/workflows/envs.yml`: the (env, target) matrix as a GitHub Actions workflow, generated from specs/.

One job per pair of report/matrix.py (strategy matrix `include:` rows, so a
new spec adds its jobs): checkout, setup-python, install envport, `envport
render --all --check`, what the target needs on the runner, `envport up` for
the pair, and the verify JUnit, the up JSON and the ledger uploaded. Jobs use
the `github` site profile (sites/github.yaml: the runner pulls base images).
A pair whose spec asks for GPUs (resources.gpus > 0) runs on a self-hosted
runner labelled `[self-hosted, linux, gpu, gpus-N]` (N from the spec's
resources.gpus). Apptainer jobs
install apptainer the way its admin guide installs it on Ubuntu (the
apptainer PPA). Steps run as the runner's user; only apt, sshd and debootstrap
run under sudo (sudo's secure_path on GitHub's images would drop setup-python's
bin/ and conda's). A spec whose lock pins a file the site's sources cannot serve
(a `+cpu` torch with PyPI alone) has none of its pairs emitted: the file's header
names each with the missing source, and `matrix --format github` exits 3. The
text (envs.yml.j2 beside this module) is a pure function of the specs and the
site: the same bytes every run, which `envport render --all --check` compares.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from envport.core.files import write_atomic

WORKFLOW_PATH = Path(".github/workflows/envs.yml")
WORKFLOW_SITE = "github"
CPU_RUNNER = "ubuntu-24.04"
PYTHON = "3.11"
TEMPLATE = "envs.yml.j2"
# A spec's lock pins a file no source of the site serves (report/lock_sources.py).
LOCK_SOURCE_REASON = "lock_source"


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
                    "local-base": local_base, "runner": gpu_runner(gpus) if gpus > 0 else [CPU_RUNNER]})
    return out


def _flow(value) -> str:
    """A YAML flow value that is also JSON (strings quoted, lists inline): stable and unambiguous."""
    return json.dumps(value)


@dataclass(frozen=True)
class RefusedPair:
    pair: str
    reason: str
    message: str


def refused(loaded_specs: list, site) -> list[RefusedPair]:
    """The pairs the workflow must not emit: a spec whose lock pins a file the site's sources cannot
    serve fails every one of its pairs on the runner (report/lock_sources.py), so none is written."""
    from envport.plan.lock import current
    from envport.report.lock_sources import unserved
    from envport.report.matrix import TARGETS, pairs

    if not site.lock:
        return []
    out = []
    for ld in sorted(loaded_specs, key=lambda ld: ld.spec.name):
        lock = current(ld)
        missing = unserved(lock, ld.spec, site) if lock is not None else []
        if not missing:
            continue
        message = "; ".join(m.message(site.name) for m in missing) + (
            f"; fix: add {', '.join(sorted({m.source for m in missing if m.known}))} to the site's "
            "pip.extra_index_urls" if any(m.known for m in missing) else "")
        out += [RefusedPair(p.key, LOCK_SOURCE_REASON, message) for p in pairs([ld.spec.name], site, TARGETS)]
    return out


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
    return _template().render(site=site.name, python=PYTHON, rows=include, refused=skip)


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

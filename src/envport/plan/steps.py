"""The plan: a spec as an ordered list of typed steps.

Every renderer consumes this list and nothing else, so the targets cannot
drift apart: a step a renderer does not know is a crash in its tests, not a
silently missing line in a recipe.  The plan is also what the content hash is
computed over (plus the renderer version), because it is exactly what reaches
a recipe.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Union

from envport.spec.loader import Loaded
from envport.spec.model import PipPhase
from envport.plan.lock import LockedDist, current as current_lock

# Where containers keep the env's interpreter: a venv, so pip never fights the
# distribution's externally-managed Python (PEP 668) on Debian/Ubuntu bases.
CONTAINER_VENV = "/opt/envport/venv"
# Where a container recipe puts each locked phase's requirements (`%files` must not use /tmp:
# apptainer mounts the host's /tmp over the image's during %post).
CONTAINER_LOCKS = "/opt/envport/locks"
INSTALLERS = ("pip", "uv")
# uv, when a site installs with it: the PyPI wheel's binary, mounted (docker) or copied then
# removed (.def) at CONTAINER_UV, or installed once per host beside the envs (shell scripts).
UV_VERSION = "0.13.9"
CONTAINER_UV = "/opt/envport-tools/uv"


@dataclass(frozen=True)
class BaseStep:
    image: str
    kind: str = "base"
    # How an Apptainer build fetches this base (`Bootstrap:`/`From:` of the .def), set by the
    # site profile (plan/site.py); "" lets the renderer decide.  Where a base comes from is not
    # what gets built, so both stay out of the content hash (_canonical).
    bootstrap: str = field(default="", compare=False)
    bootstrap_from: str = field(default="", compare=False)


@dataclass(frozen=True)
class CaStep:
    """A site's CA bundle, trusted by pip and TLS clients in the env (only added by a site)."""

    path: str
    sha256: str
    data: bytes = field(default=b"", repr=False, compare=False)
    kind: str = "ca"


@dataclass(frozen=True)
class SystemStep:
    packages: tuple[str, ...]
    kind: str = "system"


@dataclass(frozen=True)
class PythonStep:
    version: str
    venv: str = CONTAINER_VENV
    kind: str = "python"


@dataclass(frozen=True)
class EnvStep:
    vars: tuple[tuple[str, str], ...]  # sorted by key
    kind: str = "env"



def pip_source_args(index_url, extra_index_urls, find_links) -> list[str]:
    """pip's options for where distributions come from, in pip's own order (a phase's or a site's)."""
    args = []
    if index_url:
        args += ["--index-url", index_url]
    for url in extra_index_urls:
        args += ["--extra-index-url", url]
    for link in find_links:
        args += ["--find-links", link]
    return args

@dataclass(frozen=True)
class PipStep:
    index: int  # 1-based phase number
    packages: tuple[str, ...]  # in the spec's order: pip sees them in this order
    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    no_deps: bool = False
    force_reinstall: bool = False
    pre: bool = False
    # Set by a site profile (sources, --no-index wheelhouse); the spec never sets it.
    site_args: tuple[str, ...] = ()
    # The lock's set for this phase (plan/lock.py), installed exactly: --no-deps --require-hashes
    # from the requirements file the recipe carries.  Empty: the phase resolves at build time.
    locked: tuple[LockedDist, ...] = ()
    # Who installs it, set by the site profile: pip or uv (from the PyPI wheel, outside the env).
    installer: str = "pip"
    # When its .py files are compiled: "build" (before the next phase) or "first-import", set by the
    # site profile with the installer (Site.bytecode_mode; compiles_after says whether the recipe compiles
    # after the phase).
    bytecode: str = "build"
    kind: str = "pip"

    @property
    def uses_wheelhouse(self) -> bool:
        return "--no-index" in self.site_args

    @property
    def marker(self) -> str:
        return f"pip-{self.index}"

    @property
    def lock_file(self) -> str:
        """The phase's requirements file inside a container (renderers copy it there)."""
        return f"{CONTAINER_LOCKS}/{self.marker}.txt"

    def requirements_text(self) -> str:
        return "".join(d.requirement() + "\n" for d in self.locked)

    def pip_args(self, requirements: str | None = None) -> list[str]:
        """Arguments after `pip install`, identical on every target.

        A locked phase installs `-r <requirements>` (default: the container path; pass "" to leave
        `-r` off and add your own) instead of the spec's requirements."""
        args = list(self.site_args)
        if not self.uses_wheelhouse:
            args += self.source_args()
        if self.locked:
            args += ["--no-deps", "--require-hashes"] + (["--force-reinstall"] if self.force_reinstall else [])
            req = self.lock_file if requirements is None else requirements
            return args + (["-r", req] if req else [])
        return args + self.flag_args() + list(self.packages)

    def uv_args(self, requirements: str | None = None) -> list[str]:
        """The same phase for `uv pip install`: uv spells two flags its own way, and by default takes a
        name only from the first index that has it, where pip takes the best match of all of them."""
        spelled = {"--force-reinstall": "--reinstall", "--pre": "--prerelease=allow"}
        return ["--index-strategy", "unsafe-best-match"] + [spelled.get(a, a) for a in self.pip_args(requirements)]

    def bytecode_args(self) -> list[str]:
        """The installer's bytecode flag: neither compiles itself.  pip would compile one file after
        another (--no-compile); uv compiles only when asked, and is not: its pool hands each file to
        whichever worker is free, so a file's bytes can follow that worker's history.  Where the mode is
        build, the recipe compiles after either (`compiles_after`, renderers/bytecode.py)."""
        return ["--no-compile"] if self.installer == "pip" else []

    def install_args(self, requirements: str | None = None) -> list[str]:
        """What every recipe writes after `pip install` (or `uv pip install --python PY`) for this phase:
        the bytecode flag, then the phase's own arguments (`requirements` as in pip_args)."""
        own = self.uv_args(requirements) if self.installer == "uv" else self.pip_args(requirements)
        return self.bytecode_args() + own

    @property
    def compiles_after(self) -> bool:
        return self.bytecode == "build"

    def source_args(self) -> list[str]:
        """Where the spec says this phase's distributions come from."""
        return pip_source_args(self.index_url, self.extra_index_urls, self.find_links)

    def flag_args(self) -> list[str]:
        args = []
        if self.no_deps:
            args.append("--no-deps")
        if self.force_reinstall:
            args.append("--force-reinstall")
        if self.pre:
            args.append("--pre")
        return args


@dataclass(frozen=True)
class ShimFile:
    dest: str  # absolute container path
    source: str  # path relative to specs/
    sha256: str
    mode: str = "0644"
    # The bytes ride along for the shell target, which embeds them; the hash
    # covers them through sha256, so they stay out of the canonical form.
    data: bytes = field(default=b"", repr=False, compare=False)


@dataclass(frozen=True)
class FilesStep:
    files: tuple[ShimFile, ...]  # sorted by dest
    kind: str = "files"


@dataclass(frozen=True)
class RunStep:
    commands: tuple[str, ...]
    kind: str = "run"


@dataclass(frozen=True)
class WeightsStep:
    mounts: tuple[tuple[str, str], ...]  # (weight name, container path), sorted by name
    kind: str = "weights"


@dataclass(frozen=True)
class LabelsStep:
    labels: tuple[tuple[str, str], ...]  # user labels, sorted; envport adds its own at render time
    kind: str = "labels"


Step = Union[BaseStep, CaStep, SystemStep, PythonStep, EnvStep, PipStep, FilesStep, RunStep, WeightsStep, LabelsStep]


@dataclass(frozen=True)
class Plan:
    name: str
    python: str
    steps: tuple[Step, ...]
    description: str = field(default="", compare=False)

    def markers(self) -> list[str]:
        """The ordered step list as short tokens, e.g. ['base', 'system', 'python', 'pip-1']."""
        return [step_marker(s) for s in self.steps]

    def canonical(self) -> list[dict]:
        return [_canonical(s) for s in self.steps]

    def step_keys(self) -> list[str]:
        """A key per step that changes when the step or any step before it changes:
        what the shell target records to skip finished steps on a re-run."""
        keys, running = [], hashlib.sha256()
        for s in self.steps:
            running.update(json.dumps(_canonical(s), sort_keys=True, ensure_ascii=True).encode())
            keys.append(running.copy().hexdigest()[:16])
        return keys


def _canonical(step: Step) -> dict:
    d = asdict(step)
    d.pop("data", None)
    d.pop("bootstrap", None)
    d.pop("bootstrap_from", None)
    for f in d.get("files", ()):
        f.pop("data", None)
    if d["kind"] == "pip":
        # An unlocked phase installed by pip hashes as it did before locks and installers existed.
        if not d["locked"]:
            d.pop("locked")
        for dist in d.get("locked", ()):
            # Only a direct reference has a URL; every other locked file hashes as before URLs existed.
            if not dist["url"]:
                dist.pop("url")
        if d["installer"] == "pip":
            d.pop("installer")
        # Bytecode at build is what every pip and uv phase did before the mode existed.
        if d["bytecode"] == "build":
            d.pop("bytecode")
    return d


def step_marker(step: Step) -> str:
    return f"pip-{step.index}" if isinstance(step, PipStep) else step.kind


def _pip_step(i: int, phase: PipPhase, lock=None) -> PipStep:
    locked = lock.phase(i) if lock is not None else None
    return PipStep(
        index=i,
        packages=tuple(phase.packages),
        index_url=phase.index_url,
        extra_index_urls=tuple(phase.extra_index_urls),
        find_links=tuple(phase.find_links),
        no_deps=phase.no_deps,
        force_reinstall=phase.force_reinstall,
        pre=phase.pre,
        locked=locked.dists if locked is not None else (),
    )


def make_plan(loaded: Loaded, locked: bool = True) -> Plan:
    """Pure: the same spec, shim bytes and lock give the same plan.

    With `locked`, a lock that fits the spec's phases (specs/<name>.lock, plan/lock.py) makes each
    phase its locked set; `locked=False` is `--no-lock`: every phase resolves at build time."""
    spec = loaded.spec
    lock = current_lock(loaded) if locked else None
    steps: list[Step] = [BaseStep(spec.base)]
    if spec.system_pkgs:
        steps.append(SystemStep(tuple(spec.system_pkgs)))
    steps.append(PythonStep(spec.python))
    env = dict(spec.env)
    for w in spec.weight_dirs.values():
        if w.env:
            env.setdefault(w.env, w.path)
    if env:
        steps.append(EnvStep(tuple(sorted(env.items()))))
    steps += [_pip_step(i, p, lock) for i, p in enumerate(spec.pip_phases, start=1)]
    if spec.shim_files:
        shims = loaded.shim_bytes()
        steps.append(FilesStep(tuple(
            ShimFile(dest, spec.shim_files[dest], hashlib.sha256(data).hexdigest(),
                     "0755" if data.startswith(b"#!") else "0644", data)
            for dest, data in shims.items()
        )))
    if spec.run_commands:
        steps.append(RunStep(tuple(spec.run_commands)))
    if spec.weight_dirs:
        steps.append(WeightsStep(tuple(sorted((n, w.path) for n, w in spec.weight_dirs.items()))))
    steps.append(LabelsStep(tuple(sorted(spec.labels.items()))))
    return Plan(name=spec.name, python=spec.python, steps=tuple(steps), description=spec.description)

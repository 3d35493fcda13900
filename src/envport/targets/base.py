"""The `Target` protocol: what every command asks of a backend, and `Unsupported`, what it cannot do."""

from __future__ import annotations

from abc import ABC
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Optional

from envport.core.progress import Progress, quiet
from envport.core.verdict import StepResult, Verdict

# The operations a command asks a target for; `Target.unsupported` keys are these.
BUILD = "build"
PRESENT = "present"
VERIFY = "verify"
WITNESS = "witness"
PROBE = "parity"
SLURM = "slurm"
GC = "gc"
PUSH = "push"
SBOM = "sbom"
OPERATIONS = (BUILD, PRESENT, VERIFY, WITNESS, PROBE, SLURM, GC, PUSH, SBOM)
UNSUPPORTED_REASON = "unsupported"


class Unsupported(Exception):
    """TARGET cannot do OPERATION, and why: a verdict for the user, never a missing `--target` choice."""

    def __init__(self, target: str, operation: str, reason: str):
        self.target, self.operation, self.reason = target, operation, reason
        super().__init__(f"--target {target} has no {operation}: {reason}")

    def result(self, step: str, verdict: Verdict = Verdict.REFUSED) -> StepResult:
        return StepResult(step, verdict, str(self), reason=UNSUPPORTED_REASON)


class Unavailable(Exception):
    """The operation cannot run on this host now (an engine that does not answer): RESULT says why and the fix."""

    def __init__(self, result: StepResult):
        self.result = result
        super().__init__(result.detail)


@dataclass
class Need:
    """One thing a (env, target) pair needs of this host, and whether it has it."""

    what: str  # "docker engine", "base image envport/debian-bookworm:base", "1 GPU(s) in sm_80..sm_90"
    ok: Optional[bool]  # None: not checked here (said so in detail)
    detail: str = ""
    reason: str = ""
    fix: str = ""

    def to_dict(self) -> dict:
        d = {"what": self.what, "ok": self.ok, "detail": self.detail}
        if self.reason:
            d["reason"] = self.reason
        if self.fix:
            d["fix"] = self.fix
        return d


@dataclass(frozen=True)
class BuildRequest:
    loaded: Any  # spec.loader.Loaded
    site: Any  # plan.site.Site, after the lock gate
    root: Path
    identity: Any = None  # recipe.identity.Identity; needed only to remember the build (remember=True)
    site_name: Optional[str] = None  # as the user named it (--site): the fast path remembers it
    host: Optional[str] = None
    rebuild: bool = False
    no_cache: bool = False
    check: bool = False
    install_system_pkgs: bool = False
    from_docker: bool = False
    remember: bool = False  # the fast path's plain `build NAME` means this env: remember where it is
    progress: Progress = quiet


@dataclass(frozen=True)
class EnvOnSite:
    loaded: Any  # spec.loader.Loaded
    site: Any  # plan.site.Site


@dataclass(frozen=True)
class VerifyRequest(EnvOnSite):
    root: Path
    host: Optional[str] = None
    image: Optional[str] = None
    sif: Optional[Path] = None
    junit: Optional[Path] = None
    progress: Progress = quiet
    identity: Any = None  # the identity the artefact was built under, for a spec it embeds (`embedded`)


@dataclass(frozen=True)
class WitnessRequest(EnvOnSite):
    identity: Any
    gpus: bool = False  # the witnesses get the host's GPUs
    host: Optional[str] = None
    python: Optional[str] = None
    image: Optional[str] = None
    sif: Optional[str] = None


@dataclass(frozen=True)
class NeedsRequest:
    loaded: Any
    site: Any
    root: Path
    probes: Any  # targets.needs.Probes: host facts asked once per judge run
    host: Optional[str] = None
    gpu_inventory: Optional[Callable[[], dict]] = None


@dataclass(frozen=True)
class SlurmRequest:
    loaded: Any
    site: Any
    identity: Any
    profile: Any  # witness.slurm_job's cluster profile
    image: Optional[str] = None
    sif: Optional[str] = None
    prefix: Optional[str] = None


@dataclass(frozen=True)
class PushRequest:
    loaded: Any  # spec.loader.Loaded
    site: Any  # plan.site.Site: the env's hash and registry_ca
    root: Path
    identity: Any  # recipe.identity.Identity
    ref: Any  # engines.registry's parsed --to reference
    named: tuple[str, ...] = ()  # the tags the user named (--to's, then each --tag)
    sif: Optional[Path] = None  # --sif FILE: push this file instead of the built one (a SIF target)
    attest: Any = None  # --attest: sif.provenance.image.ImageAttest (an image target's build provenance)


@dataclass(frozen=True)
class SbomRequest:
    loaded: Any
    site: Any
    root: Path
    identity: Any
    lock: Optional[str]  # sif.sbom.lock_fact: the lock the env was built from, as the spec's side knows it
    fmt: str = "cyclonedx"  # or spdx


@dataclass(frozen=True)
class GcRequest:
    name: str  # the env's name: only artefacts named for it are looked at
    site: Any  # plan.site.Site: where its SIFs live
    root: Path
    cache: dict = field(default_factory=dict)  # one gc run's engine answers, asked once for every env


@dataclass(frozen=True)
class Artefact:
    """One thing a build of env NAME left on this host, found by the marks envport's own builds leave.

    `foreign` says why it is not envport's after all (named like one, without envport's marks): gc lists it
    and never touches it. `unfinished`: a build that never became the env (killed), removed whatever its
    hash. `busy`: why it cannot be removed now (a container uses the image, a build holds the env's lock)."""

    target: str
    name: str
    hash12: str
    where: str  # an image tag, a SIF's path, an env's folder
    bytes: int  # what removing it frees
    made: float  # epoch seconds it was made: the order of old hashes no ledger record names
    handle: Any = None  # the target's own: an image id, the paths to remove
    foreign: str = ""
    unfinished: bool = False
    busy: str = ""


# probe(run, where, names): `run(argv, env=None) -> (rc, text)` runs parity's probe script on stdin.
ProbeRun = Callable[..., tuple[Optional[int], str]]


class Target(ABC):
    name: ClassVar[str]
    recipe: ClassVar[str]  # the renderer kind its build renders: docker, apptainer or shell
    summary: ClassVar[str]  # one line for docs/cli.md's target table
    hosts: ClassVar[bool] = False  # --host: the env on an SSH host
    ssh_row: ClassVar[Optional[str]] = None  # the matrix/parity row name of this target on the site's SSH hosts
    # Pairs holding the same lock run one at a time in `matrix --run` (two docker builds share one engine).
    engine_lock: ClassVar[Optional[str]] = None
    signs: ClassVar[bool] = False  # its build makes a SIF that `build --sign` signs
    # Why a hosted CI runner's job for this target is not generated ("" when it is): the generated workflow
    # emits only the job kinds the project's faithful-runner test plays (report/workflow.py, issue 38).
    hosted_job_unplayed: ClassVar[str] = ""
    # Its build replaces the env of another hash at the same place (a venv, a conda env), and says which
    # (StepResult data `replaced`); an image or SIF of a new hash is made beside the old ones instead.
    replaces_in_place: ClassVar[bool] = False
    unsupported: ClassVar[dict[str, str]] = {}

    def supports(self, operation: str) -> bool:
        return operation not in self.unsupported

    def refuse(self, operation: str) -> Unsupported:
        return Unsupported(self.name, operation, self.unsupported.get(operation, "not implemented"))

    # --- what the host must have -------------------------------------------------
    def runtime_findings(self, ctx) -> list:
        """Preflight's runtime check (core.finding.Finding list) for this target on this host."""
        return []

    def weights_interpreter(self, name: str, host: Optional[str]) -> Optional[Path]:
        """The bin/ whose python `up`'s weights step runs the spec's `source` command with (None: the caller's
        PATH; a container target fetches weights on the host, outside its image)."""
        return None

    def env_disk(self, spec, project_root) -> Optional[Path]:
        """Where this target's env takes its bytes on this host (preflight's disk check); None: not here."""
        return None

    def needs(self, req: NeedsRequest) -> list[Need]:
        """What the matrix lists for (env, this target): each need checked, or said unchecked."""
        return []

    def parity_unavailable(self) -> Optional[str]:
        """'reason: detail' when parity should skip this target on this host before building; else None."""
        return None

    # --- build, present ------------------------------------------------------------
    def build(self, req: BuildRequest) -> list[StepResult]:
        raise self.refuse(BUILD)

    def present(self, req: BuildRequest) -> StepResult:
        """Whether the env is built here (checked), building nothing."""
        raise self.refuse(PRESENT)

    def built_dists(self, result: StepResult) -> Optional[dict[str, str]]:
        """{name: version} of what the env RESULT built holds, as the env itself recorded it; None where this
        target cannot read that here (the lock, when the build used one, says it instead)."""
        return None

    # --- prove it ---------------------------------------------------------------------
    def verify(self, req: VerifyRequest) -> StepResult:
        raise self.refuse(VERIFY)

    def launcher(self, req: WitnessRequest) -> tuple[Any, dict]:
        """The witness launcher and the facts the ledger records about where it ran."""
        raise self.refuse(WITNESS)

    def probe(self, run: ProbeRun, where: str, names: list[str], site: Any = None,
              host: Optional[str] = None) -> tuple[Optional[int], str]:
        """Parity's probe (freeze, python, env) inside the built env WHERE (an image, a SIF, a prefix)."""
        raise self.refuse(PROBE)

    # --- the spec an artefact was built from ------------------------------------------------
    def built_file(self, site: Any, root: Path, identity: Any) -> Optional[Path]:
        """The one file this target's build makes (a SIF: what `build --sign` signs and `--attest` writes a
        statement into), else None: an image or an env has no file to carry one."""
        return None

    def embedded(self, where: str, name: str, root: Path):
        """The spec the artefact WHERE (a --sif FILE) embeds, for a run without the project: an object with
        `loaded`, `identity` and `note` (the line saying so), or the StepResult refusing it."""
        raise Unsupported(self.name, "embedded spec", "its artefacts embed no spec: run inside the project")

    def difference(self, where: str, loaded: Any, spec_hash: str) -> Optional[dict]:
        """How the artefact WHERE differs from LOADED as it resolves now (SPEC_HASH): sif_hash, spec_hash,
        changed (spec fields) and a `line` for people; None when it does not, or this target cannot say."""
        return None

    def slurm_wrap(self, req: SlurmRequest) -> dict:
        """Where a Slurm task finds the env: witness/slurm_job.JobSpec's image, sif or prefix field."""
        raise self.refuse(SLURM)

    def slurm_task(self, job) -> Any:
        """witness/slurm_job.TaskEnv: the launcher a task of JOB (a slurm_job.JobSpec with this target's
        `slurm_wrap` fields) runs its witness through on its node, and the shell lines before it."""
        raise self.refuse(SLURM)

    def slurm_refusal(self, profile) -> Optional[StepResult]:
        """Why the cluster PROFILE's nodes cannot run this target's tasks (a container runtime they lack), or
        None. Asked before anything is submitted."""
        return None

    # --- publish, describe ------------------------------------------------------------
    def push(self, req: PushRequest) -> StepResult:
        """The built env into the registry REQ.ref under its hash12 tag and REQ.named (`envport push`)."""
        raise self.refuse(PUSH)

    def sbom(self, req: SbomRequest) -> tuple[StepResult, Optional[str]]:
        """(the verdict, the SBOM's text or None) of what the built env holds, read from it (`envport sbom`)."""
        raise self.refuse(SBOM)

    # --- what old builds left ---------------------------------------------------------
    def artefacts(self, req: GcRequest) -> list[Artefact]:
        """Every build of env REQ.name this target left on this host, of any hash (`envport gc`)."""
        raise self.refuse(GC)

    def remove(self, art: Artefact) -> tuple[int, str]:
        """Remove ART (one of `artefacts`): (the bytes that freed, '' or what stayed and why)."""
        raise self.refuse(GC)


def launcher_for(target: Target, loaded, site, identity, opts, **where) -> tuple[Any, dict]:
    """TARGET's witness launcher (the host's GPUs where the spec asks for them and it has some) and its facts."""
    from envport.witness.census import host_gpu_count
    from envport.witness.plan import requires_gpu

    gpus = requires_gpu(loaded.spec, opts) and host_gpu_count() > 0
    return target.launcher(WitnessRequest(loaded, site, identity, gpus=gpus, **where))

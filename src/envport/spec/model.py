"""The env spec: pydantic models, unknown keys forbidden.

Everything that can reach a shell or a recipe is checked here so that the
renderers never meet a value they cannot quote: names, env keys, package
names, container paths.  Free text that is meant for a shell (run_commands,
cli checks) is passed through as written, but never with control characters
that would break a Dockerfile line or a `.def` section.
"""

from __future__ import annotations

import json
import posixpath
import re
from typing import Annotated, Any, Literal, Optional, Union

from packaging.requirements import InvalidRequirement, Requirement
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    ValidationInfo,
    field_validator,
)

from envport.core.nesting import too_deep

SLUG_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Docker/OCI image reference: registry/path:tag@digest, no shell metacharacters.
IMAGE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@-]*$")
DEB_PKG_RE = re.compile(r"^[a-z0-9][a-z0-9+.-]+(=[A-Za-z0-9.+~:-]+)?$")
PYTHON_RE = re.compile(r"^3\.\d{1,2}$")
# Container paths may hold spaces (they are quoted everywhere) but never quotes,
# `$`, backticks, globs or backslashes: those cannot be written into a `.def`
# %files line or a Dockerfile COPY without changing meaning on some engine.
SAFE_PATH_RE = re.compile(r"^[A-Za-z0-9 ._+@=,%/-]+$")
LABEL_KEY_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
SM_RE = re.compile(r"^sm_\d{2,3}a?$")
URL_RE = re.compile(r"^(https?|file)://[^\s'\"`$\\]+$")
# C0 and C1 controls, and the Unicode line and paragraph separators: Python's splitlines() (and
# some editors and terminals) break a line at U+0085, U+2028 and U+2029, so a value holding one
# could read as two lines to one parser and as one to another (a smuggled `.def` label).
CONTROL_RE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


def _no_control(value: str) -> str:
    if CONTROL_RE.search(value):
        raise ValueError(
            "must not contain newlines, tabs, line separators (U+2028, U+2029, U+0085) or other "
            "control characters (split a multi-line command into several entries or a shim file)"
        )
    return value


def _slug(value: str) -> str:
    if not SLUG_RE.match(value):
        raise ValueError(
            f"{value!r} is not a valid name: expected lowercase letters, digits and '-', "
            "starting with a letter or digit, at most 63 characters"
        )
    return value


# Names bash will not set (readonly: `export UID=1` fails and stops a `set -e`
# script) or manages itself (an exported value does not survive), and envport's
# own: none of them can reach every target byte-for-byte.
SHELL_MANAGED_ENV = frozenset({
    "UID", "EUID", "PPID", "BASHOPTS", "SHELLOPTS", "BASH_VERSINFO", "BASHPID", "BASH_ARGV0",
    "BASH_ARGC", "BASH_ARGV", "BASH_COMMAND", "BASH_LINENO", "BASH_SOURCE", "BASH_SUBSHELL",
    "RANDOM", "SRANDOM", "SECONDS", "LINENO", "FUNCNAME", "GROUPS", "DIRSTACK", "HISTCMD",
    "EPOCHSECONDS", "EPOCHREALTIME", "OPTIND", "SHLVL", "BASH_ALIASES", "BASH_CMDS", "_",
})


# Names that validate as identifiers but break the build or the env's shell when a
# spec sets them: each with the reason the error gives (docs/spec.md lists them).
BUILD_BREAKING_ENV = {
    "PATH": "replaces the search path the build and the env rely on (the venv's bin/, /usr/bin: "
            "`cat: command not found`); put tools in the env, or wrap them with a shim file",
    "PYTHONHOME": "points the env's interpreter at another standard library; python and pip stop starting",
    "PYTHONPATH": "puts other code ahead of the env's packages, so the pinned versions are not what is imported",
    "LD_LIBRARY_PATH": "replaces the base image's library path (CUDA images set their own)",
    "LD_PRELOAD": "injects a library into every process, pip and apt included",
    "IFS": "changes how every shell line of the setup scripts splits words",
    "HOME": "the setup scripts and pip find the env folder and caches under $HOME",
    "VIRTUAL_ENV": "set by the env's own activation; another value points tools at another env",
    "CONDA_PREFIX": "set by the env's own activation; another value points tools at another env",
    "SHELL": "the login shell's own; programs would start another shell than the user's",
    "PWD": "maintained by the shell on every cd; an exported value is wrong at once",
    "OLDPWD": "maintained by the shell on every cd",
    "ENV": "sh sources this file at the start of every shell, the build's included",
    "BASH_ENV": "bash sources this file at the start of every script, the build's included",
    "CDPATH": "makes `cd` in the setup scripts go to another folder (and print it)",
    "POSIXLY_CORRECT": "switches bash and GNU tools into another mode under the setup scripts",
}
# Refused unless the spec lists them in `allow_env` (they have real uses).
ALLOWABLE_ENV = ("LD_LIBRARY_PATH", "PYTHONPATH")


def _env_key(value: str, info: ValidationInfo) -> str:
    if not ENV_KEY_RE.match(value):
        raise ValueError(f"{value!r} is not an environment variable name; expected [A-Za-z_][A-Za-z0-9_]*")
    if value in SHELL_MANAGED_ENV:
        raise ValueError(f"{value!r} is set or managed by the shell itself; the setup scripts could not export it")
    if value.startswith("ENVPORT_"):
        raise ValueError(f"{value!r}: ENVPORT_* variables are reserved for envport's own")
    # info.data is the enclosing model's fields so far: the spec's allow_env comes before env.
    if value in BUILD_BREAKING_ENV and value not in ((info.data or {}).get("allow_env") or ()):
        allow = " (or list it in allow_env)" if value in ALLOWABLE_ENV else ""
        raise ValueError(f"{value!r} would break the build or the env's shell: {BUILD_BREAKING_ENV[value]}{allow}")
    return value


def _label_key(value: str) -> str:
    if not LABEL_KEY_RE.match(value):
        raise ValueError(f"{value!r} is not a label key; expected lowercase [a-z0-9._-], e.g. 'org.example.team'")
    if value.startswith("envport."):
        raise ValueError(f"label key {value!r} is reserved for envport's own labels")
    return value


def _deb_pkg(value: str) -> str:
    if not DEB_PKG_RE.match(value):
        raise ValueError(f"{value!r} is not a Debian package name; expected e.g. 'git' or 'curl=7.88.1-10'")
    return value


def _shim_source(value: str) -> str:
    if not value.startswith("files/") or ".." in value.split("/") or not SAFE_PATH_RE.match(value) \
            or value.endswith("/"):
        raise ValueError(f"source {value!r} must be a file under specs/files/ (e.g. files/run.py), without '..'")
    return value


def _container_path(value: str) -> str:
    if not value.startswith("/"):
        raise ValueError(f"{value!r} must be an absolute container path (start with '/')")
    if not SAFE_PATH_RE.match(value):
        raise ValueError(
            f"{value!r} has characters that cannot be quoted safely in every recipe; "
            "use letters, digits, spaces and ._+@=,%/-"
        )
    if ".." in value.split("/"):
        raise ValueError(f"{value!r} must not contain '..'")
    if value != "/" and value.rstrip("/") != posixpath.normpath(value):
        raise ValueError(f"{value!r} is not normalized; write {posixpath.normpath(value)!r}")
    return value.rstrip("/") or "/"


def _requirement(value: str) -> str:
    _no_control(value)
    if deep := too_deep(value):
        # packaging's marker parser recurses once per `(`: thousands of them are a RecursionError
        raise ValueError(f"{value[:40]!r}... is {deep}; write the requirement without the nesting")
    try:
        req = Requirement(value)
    except InvalidRequirement as exc:
        raise ValueError(f"{value!r} is not a valid requirement ({exc}); e.g. 'torch==2.4.1'") from None
    if req.url:
        _direct_url(value, req.url)
    if req.marker is not None:
        raise ValueError(f"{value!r}: environment markers are not supported; phases are per env already")
    return value


# PEP 508 direct references (`name @ URL`): a VCS checkout or an archive. The URL reaches
# every recipe inside a quoted pip argument, so it gets the same character rules as URL_RE.
DIRECT_URL_RE = re.compile(r"^(git\+(https|ssh|file)|https|file)://[^\s'\"`$\\]+$")
GIT_SHA_RE = re.compile(r"^[0-9a-f]{40}$")


def _direct_url(value: str, url: str) -> None:
    if not DIRECT_URL_RE.match(url):
        raise ValueError(f"{value!r}: a direct reference must be git+https://, git+ssh://, git+file://, https:// "
                         "or file:// without quotes, spaces or '$'")
    if url.startswith("git+") and url.split("://", 1)[1].startswith("/"):
        # pip < 24 (the one `python3 -m venv` bundles) refuses a VCS URL without a host: "Invalid requirement".
        raise ValueError(f"{value!r}: a git URL needs a host; for a local repository write "
                         "git+file://localhost/PATH")
    if not url.startswith("git+") and not re.search(r"#sha256=[0-9a-f]{64}$", url):
        raise ValueError(f"{value!r}: an archive URL must end in #sha256=<64 hex digits> so pip checks "
                         "what it downloads (sha256sum the file)")


def direct_ref(text: str) -> Optional[tuple[str, str, str]]:
    """(kind, url, ref) of a `name @ URL` requirement, None for a plain one.

    kind is "git" (ref: the part after the last '@' of the URL's path, "" when none)
    or "archive" (ref: the sha256 of the file).
    """
    url = Requirement(text).url
    if not url:
        return None
    if url.startswith("git+"):
        path = url.split("://", 1)[1].split("#", 1)[0]
        ref = path.rsplit("@", 1)[1] if "@" in path.split("/", 1)[-1] else ""
        return "git", url, ref
    return "archive", url, url.rsplit("#sha256=", 1)[1]


def requirement_warnings(spec: "Spec") -> list[tuple[str, str]]:
    """(field path, message) for requirements that validate but may not build the same env twice."""
    out = []
    for i, phase in enumerate(spec.pip_phases):
        for j, text in enumerate(phase.packages):
            ref = direct_ref(text)
            if ref and ref[0] == "git" and not GIT_SHA_RE.match(ref[2]):
                what = f"ref {ref[2]!r} is not a full commit sha" if ref[2] else "no ref (the default branch)"
                out.append((f"pip_phases[{i}].packages[{j}]",
                            f"{text!r}: {what}; the env changes when the branch or tag moves and the content "
                            "hash does not (fix: pin @<40-hex commit>)"))
    return out


def _url(value: str) -> str:
    if not URL_RE.match(value):
        raise ValueError(f"{value!r} is not an http(s):// or file:// URL without quotes or spaces")
    return value


def _find_link(value: str) -> str:
    if URL_RE.match(value):
        return value
    return _container_path(value)


Slug = Annotated[str, AfterValidator(_slug)]
ContainerPath = Annotated[str, AfterValidator(_container_path)]
RequirementStr = Annotated[str, AfterValidator(_requirement)]
Url = Annotated[str, AfterValidator(_url)]
FindLink = Annotated[str, AfterValidator(_find_link)]
Line = Annotated[str, AfterValidator(_no_control)]
EnvKey = Annotated[str, AfterValidator(_env_key)]
LabelKey = Annotated[str, AfterValidator(_label_key)]
ShimSource = Annotated[str, AfterValidator(_shim_source)]
DebPkg = Annotated[str, AfterValidator(_deb_pkg)]


def _one_or_list(value: Any) -> Any:
    # pip's `-f URL` takes one; a YAML `find_links: URL` means the same one-element list.
    return [value] if isinstance(value, str) else value


# A list of URLs (or find-links paths) that also takes one string as a one-element list.
UrlList = Annotated[list[Url], BeforeValidator(_one_or_list, json_schema_input_type=Union[Url, list[Url]])]
FindLinkList = Annotated[list[FindLink], BeforeValidator(_one_or_list,
                                                         json_schema_input_type=Union[FindLink, list[FindLink]])]


class Model(BaseModel):
    # YAML reads 1e99999 as inf and .nan as nan: no size, memory or count is either.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def _phase_from_list(value: Any) -> Any:
    # A bare list is the common case: one pip call with those requirements.
    if isinstance(value, list):
        return {"packages": value}
    return value


class PipPhase(Model):
    packages: list[RequirementStr] = Field(min_length=1, description="requirements for this one pip call")
    index_url: Optional[Url] = None
    extra_index_urls: UrlList = []
    find_links: FindLinkList = []
    no_deps: StrictBool = False
    force_reinstall: StrictBool = False
    pre: StrictBool = False

    @field_validator("packages")
    @classmethod
    def _unique_packages(cls, value: list[str]) -> list[str]:
        names = [canonical_name(Requirement(v).name) for v in value]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"names {', '.join(dupes)} more than once in one phase; pip would refuse it")
        return value


Phase = Annotated[
    PipPhase,
    BeforeValidator(_phase_from_list, json_schema_input_type=Union[list[RequirementStr], PipPhase]),
]


class WeightFile(Model):
    path: str = Field(description="path relative to the weight dir")
    sha256: Optional[str] = None
    size: Optional[int] = Field(default=None, ge=0)

    @field_validator("path")
    @classmethod
    def _relative(cls, value: str) -> str:
        if value.startswith("/") or ".." in value.split("/") or not SAFE_PATH_RE.match(value):
            raise ValueError(f"{value!r} must be a relative path inside the weight dir, without '..'")
        return value

    @field_validator("sha256")
    @classmethod
    def _hex(cls, value: Optional[str]) -> Optional[str]:
        if value is not None and not SHA256_RE.match(value):
            raise ValueError("expected 64 lowercase hex digits")
        return value


class WeightDir(Model):
    path: ContainerPath
    env: Optional[EnvKey] = None
    source: Line = ""
    gated: StrictBool = False
    auth_hint: Optional[Line] = None
    size_gb: Optional[float] = Field(default=None, ge=0)
    files: list[WeightFile] = []


CLI_SHAPE = '{cmd: "the command line", expect: "a regex searched for in its output"}'


def _cli_shape(value: Any) -> Any:
    # pydantic's own words here name an internal class ("instance of CliCheck") and no fix.
    if isinstance(value, str):
        raise ValueError(f"a CLI witness is a mapping, not a string; write {{cmd: {json.dumps(value)}, expect: \"regex\"}} "
                         f"(the shape: {CLI_SHAPE})")
    if not isinstance(value, dict) and not isinstance(value, BaseModel):
        raise ValueError(f"a CLI witness is a mapping {CLI_SHAPE}, not {type(value).__name__}")
    return value


class CliCheck(Model):
    cmd: Line = Field(description="the command line, run by /bin/sh -c inside the env")
    expect: str = Field(description="a Python regex searched for (re.search, multiline: ^ and $ match at "
                        "each line) in the command's output (stdout and stderr together); the regex decides, not the exit status (many "
                        "tools print usage and exit 1), and the command must finish in time")

    @field_validator("expect")
    @classmethod
    def _regex(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"{value!r} is not a valid regex: {exc}") from None
        return value


class Collectives(Model):
    world_size: int = Field(default=2, ge=1, le=64)


class DTensorCheck(Model):
    mesh: list[int] = Field(min_length=1, max_length=2)

    @field_validator("mesh")
    @classmethod
    def _square(cls, value: list[int]) -> list[int]:
        if any(v < 1 for v in value):
            raise ValueError("mesh sizes must be >= 1")
        if len(value) == 2 and value[0] != value[1]:
            raise ValueError(f"a 2-D mesh must be square (e.g. [2, 2]), got {value}")
        return value


def _module(value: str) -> str:
    if not MODULE_RE.match(value):
        raise ValueError(f"{value!r} is not an importable module name")
    return value


# The frameworks a kernel witness exists for (witness/scripts/kernel.py), in the order they run.
KERNEL_FRAMEWORKS = ("torch", "jax", "triton")
KernelFramework = Literal[KERNEL_FRAMEWORKS]  # type: ignore[valid-type]


def _kernel_shape(value: Any) -> Any:
    """One message for a wrong `kernel` (pydantic's own names both union branches, the list's as a Literal)."""
    choices = ", ".join(KERNEL_FRAMEWORKS)
    if isinstance(value, bool):
        return value
    if not isinstance(value, list):
        raise ValueError(f"{value!r} is neither a valid boolean nor a list: write true (every framework the env "
                         f"holds) or false, unquoted, or a list of {choices}")
    if not value:
        raise ValueError("an empty list asks for no kernel witness: write false (or true for every framework)")
    unknown = [v for v in value if v not in KERNEL_FRAMEWORKS]
    if unknown:
        raise ValueError(f"{', '.join(map(repr, unknown))}: no kernel witness for that framework; choose from "
                         f"{choices}")
    if len(set(value)) != len(value):
        raise ValueError(f"{value}: each framework once")
    return value


class Witnesses(Model):
    imports: list[Annotated[str, AfterValidator(_module)]] = []
    cli: list[Annotated[CliCheck, BeforeValidator(_cli_shape, json_schema_input_type=CliCheck)]] = []
    kernel: Annotated[Union[StrictBool, list[KernelFramework]], BeforeValidator(_kernel_shape)] = Field(
        default=False, description="the kernel witness: true runs one for every framework the env holds "
        "(torch, jax, triton), a list names them (a named framework the env lacks is FAILED)")
    collectives: Optional[Collectives] = None
    dtensor: Optional[DTensorCheck] = None
    # The third validation level: docs whose `console` transcripts run verbatim inside the env.
    docs: list[ShimSource] = Field(default=[], description="markdown files under specs/ (e.g. "
                                   "files/NAME/USAGE.md) whose console transcripts run inside the env")

    def kernel_frameworks(self) -> Optional[list[str]]:
        """The frameworks the kernel witness names; None for `true` (every one the env holds), [] for none."""
        if self.kernel is True:
            return None
        return list(self.kernel) if self.kernel else []


class Resources(Model):
    cpus: int = Field(default=1, ge=1)
    mem_gib: float = Field(default=4, gt=0)
    gpus: int = Field(default=0, ge=0)


class Spec(Model):
    """One env. See docs/spec.md for every field and the `extends` merge rules."""

    name: Slug
    description: str = ""
    extends: Optional[Slug] = None
    base: str = Field(description="base image reference, e.g. debian:bookworm-slim")
    python: str = Field(description="the env's interpreter, MAJOR.MINOR, e.g. '3.11'")
    system_pkgs: list[DebPkg] = []
    pip_phases: list[Phase] = Field(default=[], description="each phase is ONE pip call, in this order")
    allow_env: list[Literal[ALLOWABLE_ENV]] = Field(  # type: ignore[valid-type]
        default=[], description="env keys refused by default that this spec may set: " + ", ".join(ALLOWABLE_ENV))
    env: dict[EnvKey, Line] = {}
    run_commands: list[Line] = []
    shim_files: dict[ContainerPath, ShimSource] = Field(default={}, description="container path -> file under specs/")
    weight_dirs: dict[Slug, WeightDir] = {}
    witnesses: Witnesses = Witnesses()
    resources: Resources = Resources()
    sm_range: Optional[list[str]] = None
    labels: dict[LabelKey, Line] = {}

    @field_validator("base")
    @classmethod
    def _image(cls, value: str) -> str:
        if not IMAGE_RE.match(value):
            raise ValueError(f"{value!r} is not an image reference like 'debian:bookworm-slim'")
        return value

    @field_validator("python")
    @classmethod
    def _python(cls, value: str) -> str:
        if not PYTHON_RE.match(value):
            raise ValueError(f"{value!r} is not a Python version like '3.11' (quote it in YAML)")
        return value

    @field_validator("sm_range")
    @classmethod
    def _sm_range(cls, value: Optional[list[str]]) -> Optional[list[str]]:
        if value is None:
            return value
        if len(value) != 2 or not all(SM_RE.match(v) for v in value):
            raise ValueError(f"expected [lowest, highest] like [sm_80, sm_90], got {value}")
        lo, hi = (int(v[3:].rstrip("a")) for v in value)
        if lo > hi:
            raise ValueError(f"{value[0]} is above {value[1]}")
        return value

    @field_validator("weight_dirs")
    @classmethod
    def _weight_envs(cls, value: dict[str, WeightDir], info: ValidationInfo) -> dict[str, WeightDir]:
        # A field validator (not a model one) so that the error names a field and a line.
        env = info.data.get("env") or {}
        claimed: dict[str, str] = {}
        for wname, w in value.items():
            if not w.env:
                continue
            if w.env in env and env[w.env] != w.path:
                raise ValueError(f"env.{w.env} is {env[w.env]!r} but weight_dirs.{wname} points it at "
                                 f"{w.path!r}; drop one of them")
            other = claimed.setdefault(w.env, wname)
            if other != wname and value[other].path != w.path:
                raise ValueError(f"weight_dirs.{other} and weight_dirs.{wname} both set {w.env} "
                                 f"({value[other].path!r} vs {w.path!r}); give each its own variable")
        return value


def canonical_name(name: str) -> str:
    """PEP 503 normalization: `Foo_Bar.baz` and `foo-bar-baz` are the same package."""
    return re.sub(r"[-_.]+", "-", name).lower()


def last_pins(spec: Spec) -> dict[str, str]:
    """Each package's version as pinned by the LAST phase that names it (== only)."""
    pins: dict[str, str] = {}
    for phase in spec.pip_phases:
        for text in phase.packages:
            req = Requirement(text)
            name = canonical_name(req.name)
            exact = [s.version for s in req.specifier if s.operator in ("==", "===") and "*" not in s.version]
            if exact:
                pins[name] = exact[0]
            else:
                pins.pop(name, None)
    return pins

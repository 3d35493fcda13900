"""Which CUDA architectures a torch build can drive: pure functions, no torch.

A torch build carries compiled code for a list of targets, the list
`torch.cuda.get_arch_list()` prints.  Three kinds of entry, three rules:

- `sm_XY`  a cubin.  It runs on a GPU of the same major capability whose minor
  is equal or higher (an sm_80 cubin runs on an 8.6 card, not on 9.0 nor 7.5).
- `compute_XY`  PTX.  The driver JIT-compiles it forward to any capability
  >= X.Y, across majors (compute_90 runs on 10.0 and 12.0, slowly the first time).
- `sm_XYa` / `compute_XYa`  arch-specific targets (Hopper's wgmma, Blackwell's
  tcgen05): code that only exactly capability X.Y can execute.
- `sm_XYf` / `compute_XYf`  family-specific (CUDA 12.9+): runs within the
  family, i.e. the same major with minor >= Y (sm_100f on 10.0 and 10.3).
  Family PTX stays in its family too: compute_100f never JIT-compiles to 12.0.

A comparison of torch or CUDA version numbers cannot answer this: a build may
carry PTX for an older target that compiles forward, so read the list.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterable, Optional, Sequence, Union

from envport.core.finding import Finding
from envport.core.verdict import Verdict

Capability = tuple[int, int]

# sm_86, sm_90a, sm_100f, compute_90, compute_90a; TORCH_CUDA_ARCH_LIST spells
# "8.6", "9.0a" and "8.6+PTX" (cubin plus PTX of the same target).
_NAME_RE = re.compile(r"^(sm|compute)_(\d{2,3})([af]?)$")
_DOTTED_RE = re.compile(r"^(\d{1,2})\.(\d)([af]?)(\+PTX)?$", re.IGNORECASE)

# Capabilities NVIDIA has shipped, for judging a whole sm_range.  10.1 was
# renamed 11.0 (Thor) in CUDA 13; both are listed so either spelling resolves.
KNOWN_CAPABILITIES: tuple[Capability, ...] = (
    (3, 5), (3, 7), (5, 0), (5, 2), (5, 3), (6, 0), (6, 1), (6, 2), (7, 0), (7, 2), (7, 5),
    (8, 0), (8, 6), (8, 7), (8, 9), (9, 0), (10, 0), (10, 1), (10, 3), (11, 0), (12, 0), (12, 1),
)


@dataclass(frozen=True)
class ArchTarget:
    """One entry of a torch arch list."""

    text: str
    ptx: bool  # compute_XY: JIT-compiled forward by the driver
    major: int
    minor: int
    suffix: str = ""  # "a" arch-specific, "f" family-specific, "" portable

    @property
    def capability(self) -> Capability:
        return (self.major, self.minor)

    def runs_on(self, cap: Capability) -> bool:
        if self.suffix == "a":
            return cap == self.capability
        if self.suffix == "f":  # cubin or PTX: family code never leaves its major
            return cap[0] == self.major and cap[1] >= self.minor
        if self.ptx:
            return cap >= self.capability
        return cap[0] == self.major and cap[1] >= self.minor


def _split_digits(digits: str) -> Capability:
    # The last digit is the minor: sm_86 -> 8.6, sm_100 -> 10.0, sm_121 -> 12.1.
    return int(digits[:-1]), int(digits[-1])


def parse_arch(text: str) -> list[ArchTarget]:
    """Parse one arch-list entry.  "8.6+PTX" gives two targets (cubin and PTX)."""
    raw = text.strip()
    m = _NAME_RE.match(raw.lower())
    if m:
        kind, digits, suffix = m.groups()
        major, minor = _split_digits(digits)
        return [ArchTarget(raw, kind == "compute", major, minor, suffix)]
    m = _DOTTED_RE.match(raw)
    if m:
        major, minor, suffix, plus_ptx = int(m[1]), int(m[2]), m[3], bool(m[4])
        out = [ArchTarget(raw, False, major, minor, suffix)]
        if plus_ptx:
            out.append(ArchTarget(raw, True, major, minor, suffix))
        return out
    raise ValueError(f"{text!r} is not an arch like sm_86, sm_90a, compute_90 or 8.6+PTX")


def parse_arch_list(items: Union[str, Iterable[str]]) -> list[ArchTarget]:
    """Parse a whole list; a string may be space/comma/semicolon separated."""
    if isinstance(items, str):
        items = [p for p in re.split(r"[\s,;]+", items) if p]
    out: list[ArchTarget] = []
    for item in items:
        out.extend(parse_arch(item))
    return out


def parse_capability(value: Union[str, Sequence[int]]) -> Capability:
    """(8, 6) from (8, 6), "8.6", "sm_86" or "sm_90a"."""
    if not isinstance(value, str):
        major, minor = value
        return int(major), int(minor)
    text = value.strip().lower()
    m = re.match(r"^(?:sm_|compute_)?(\d{2,3})[af]?$", text)
    if m:
        return _split_digits(m[1])
    m = re.match(r"^(\d{1,2})\.(\d)$", text)
    if m:
        return int(m[1]), int(m[2])
    raise ValueError(f"{value!r} is not a compute capability like 8.6 or sm_86")


def sm_name(cap: Capability) -> str:
    return f"sm_{cap[0]}{cap[1]}"


@dataclass(frozen=True)
class ArchMatch:
    """Whether one GPU can run a build, and through which entry."""

    capability: Capability
    runnable: bool
    via: Optional[str] = None  # the arch-list entry that covers it
    jit: bool = False  # covered only by PTX: first launch compiles (slow, needs the driver's JIT)
    reason: str = ""

    def to_dict(self) -> dict:
        return {
            "capability": sm_name(self.capability),
            "runnable": self.runnable,
            "via": self.via,
            "jit": self.jit,
            "reason": self.reason,
        }


def gpu_runnable(cap: Union[Capability, str], arch_list: Union[str, Iterable[str]]) -> ArchMatch:
    """Can a build with `arch_list` run kernels on a GPU of capability `cap`?

    A cubin that matches wins over PTX (no JIT); among PTX entries the highest
    one that still compiles forward is named.
    """
    cap = parse_capability(cap) if isinstance(cap, str) else (int(cap[0]), int(cap[1]))
    targets = parse_arch_list(arch_list)
    if not targets:
        return ArchMatch(cap, False, reason="the build carries no CUDA code (a CPU-only torch)")
    cubins = [t for t in targets if not t.ptx and t.runs_on(cap)]
    if cubins:
        best = max(cubins, key=lambda t: (t.capability, t.suffix == "a"))
        return ArchMatch(cap, True, via=best.text)
    ptx = [t for t in targets if t.ptx and t.runs_on(cap)]
    if ptx:
        best = max(ptx, key=lambda t: t.capability)
        return ArchMatch(cap, True, via=best.text, jit=True)
    listed = " ".join(t.text for t in targets)
    reason = (f"{sm_name(cap)} is not covered by [{listed}]: no cubin of major {cap[0]} "
              f"at or below minor {cap[1]}, and no PTX at or below {cap[0]}.{cap[1]} to compile forward")
    confined = [t.text for t in targets if t.suffix and t.capability <= cap]
    if confined:
        reason += (f" ({', '.join(confined)}: arch- and family-specific code runs only on its own "
                   "capability or family)")
    return ArchMatch(cap, False, reason=reason)


@dataclass
class RangeVerdict:
    """An env's declared sm_range judged against a torch arch list."""

    sm_range: list[str]
    arch_list: list[str]
    ok: bool
    covered: list[ArchMatch] = field(default_factory=list)
    uncovered: list[ArchMatch] = field(default_factory=list)

    @property
    def detail(self) -> str:
        lo, hi = self.sm_range
        if self.ok:
            jit = [sm_name(m.capability) for m in self.covered if m.jit]
            text = f"every GPU from {lo} to {hi} can run this build"
            return text + (f" ({', '.join(jit)} only through PTX JIT)" if jit else "")
        names = ", ".join(sm_name(m.capability) for m in self.uncovered)
        return f"{names} in {lo}..{hi} cannot run this build: {self.uncovered[0].reason}"

    def to_dict(self) -> dict:
        return {
            "sm_range": list(self.sm_range),
            "arch_list": list(self.arch_list),
            "ok": self.ok,
            "detail": self.detail,
            "covered": [m.to_dict() for m in self.covered],
            "uncovered": [m.to_dict() for m in self.uncovered],
        }


def capabilities_in_range(sm_range: Sequence[str]) -> list[Capability]:
    """The shipped capabilities between the two bounds, both included."""
    lo, hi = (parse_capability(s) for s in sm_range)
    caps = [c for c in KNOWN_CAPABILITIES if lo <= c <= hi]
    # A bound NVIDIA has not shipped (or that this table predates) still counts.
    for bound in (lo, hi):
        if bound not in caps:
            caps.append(bound)
    return sorted(set(caps))


def range_verdict(sm_range: Sequence[str], arch_list: Union[str, Iterable[str]]) -> RangeVerdict:
    """Does a build with `arch_list` run on every capability the env's sm_range declares?"""
    texts = [p for p in re.split(r"[\s,;]+", arch_list) if p] if isinstance(arch_list, str) else list(arch_list)
    parse_arch_list(texts)  # a malformed entry is an error, not "uncovered"
    matches = [gpu_runnable(c, texts) for c in capabilities_in_range(sm_range)]
    covered = [m for m in matches if m.runnable]
    uncovered = [m for m in matches if not m.runnable]
    return RangeVerdict(list(sm_range), texts, not uncovered, covered, uncovered)


# --- published arch lists -----------------------------------------------------
#
# What `torch.cuda.get_arch_list()` prints for the official Linux x86-64 wheels.
# Used only where no built env can be probed (`envport doctor --env NAME` on a
# machine without the env or a GPU); a probe of the built env is the authority
# (the kernel witness and `envport doctor --python ENV/bin/python` print it).
#
# Up to torch 2.8 the list depended on the CUDA flavour alone; the older rows
# are what those wheels' get_arch_list() printed.
PUBLISHED_ARCH_LISTS: dict[str, list[str]] = {
    "cu118": ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_37", "sm_90"],
    "cu121": ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"],
    "cu124": ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"],
    "cu126": ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"],
    # torch 2.7's cu128 (.ci/manywheel/build_cuda.sh at v2.7.0: 7.5;8.0;8.6;9.0;10.0;12.0+PTX)
    "cu128": ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120", "compute_120"],
    "cpu": [],
}


def _dotted(arch_list: str) -> list[str]:
    """TORCH_CUDA_ARCH_LIST ("7.5;8.0;12.0+PTX") as get_arch_list() prints it (sm_75 sm_80 sm_120 compute_120)."""
    out = []
    for item in arch_list.split(";"):
        digits = item.replace("+PTX", "").replace(".", "")
        out.append(f"sm_{digits}")
        if item.endswith("+PTX"):
            out.append(f"compute_{digits}")
    return out


# From torch 2.9 the list changes by torch minor as well.  Each row is the
# TORCH_CUDA_ARCH_LIST of pytorch's .ci/manywheel/build_cuda.sh at the release
# tag (x86-64; aarch64 cu130 adds 11.0), which is what get_arch_list() prints:
# - v2.9.0: cu126 5.0..9.0; cu128 7.0..12.0 (no PTX); cu129 7.0..12.0+PTX;
#   cu130 7.5;8.0;8.6;9.0;10.0;12.0+PTX (CUDA 13 dropped Maxwell, Pascal, Volta).
# - v2.10.0: the same lists as 2.9.
# - v2.11.0: Volta left cu128/cu129 too (pytorch#172598, cuDNN 9.15 has no
#   sm_70); cu128 and cu130 are 7.5;8.0;8.6;9.0;10.0;12.0 with NO PTX, cu129
#   keeps 12.0+PTX.  A 2.11.0+cu128 and a +cu130 wheel's get_arch_list() both
#   print sm_75 sm_80 sm_86 sm_90 sm_100 sm_120.
# - 2.12, 2.13: cu126 and cu130 only (RELEASE.md's compatibility matrix), cu130
#   "Turing(7.5), Ampere(8.0, 8.6), Hopper(9.0), Blackwell(10.0, 12.0+PTX),
#   +PTX on Linux only" (RELEASE.md's CUDA support matrix; no wheel probed here).
_CU126 = _dotted("5.0;6.0;7.0;7.5;8.0;8.6;9.0")
_VOLTA_TO_BLACKWELL = _dotted("7.0;7.5;8.0;8.6;9.0;10.0;12.0")
_VOLTA_TO_BLACKWELL_PTX = _dotted("7.0;7.5;8.0;8.6;9.0;10.0;12.0+PTX")
_TURING_TO_BLACKWELL = _dotted("7.5;8.0;8.6;9.0;10.0;12.0")
_TURING_TO_BLACKWELL_PTX = _dotted("7.5;8.0;8.6;9.0;10.0;12.0+PTX")
PUBLISHED_ARCH_LISTS_BY_MINOR: dict[tuple[str, str], list[str]] = {
    ("2.9", "cu126"): _CU126, ("2.9", "cu128"): _VOLTA_TO_BLACKWELL,
    ("2.9", "cu129"): _VOLTA_TO_BLACKWELL_PTX, ("2.9", "cu130"): _TURING_TO_BLACKWELL_PTX,
    ("2.10", "cu126"): _CU126, ("2.10", "cu128"): _VOLTA_TO_BLACKWELL,
    ("2.10", "cu129"): _VOLTA_TO_BLACKWELL_PTX, ("2.10", "cu130"): _TURING_TO_BLACKWELL_PTX,
    ("2.11", "cu126"): _CU126, ("2.11", "cu128"): _TURING_TO_BLACKWELL,
    ("2.11", "cu129"): _TURING_TO_BLACKWELL_PTX, ("2.11", "cu130"): _TURING_TO_BLACKWELL,
    ("2.12", "cu126"): _CU126, ("2.12", "cu130"): _TURING_TO_BLACKWELL_PTX,
    ("2.13", "cu126"): _CU126, ("2.13", "cu130"): _TURING_TO_BLACKWELL_PTX,
}

# The CUDA flavour a plain `pip install torch==X.Y.*` takes from PyPI on Linux
# x86-64 when no index_url or +local tag says otherwise.  PyPI moved to CUDA
# 13.0 with torch 2.11 (the 2.11 release notes; dev-discuss "Transitioning PyPI
# CUDA wheels to CUDA 13.0 as the stable release (2.11)"); 2.8-2.10 were cu128.
PYPI_DEFAULT_FLAVOUR: dict[str, str] = {
    "2.0": "cu117", "2.1": "cu121", "2.2": "cu121", "2.3": "cu121", "2.4": "cu121",
    "2.5": "cu124", "2.6": "cu124", "2.7": "cu126", "2.8": "cu128", "2.9": "cu128",
    "2.10": "cu128", "2.11": "cu130", "2.12": "cu130", "2.13": "cu130",
}

_FLAVOUR_RE = re.compile(r"(cu\d{3}|cpu|rocm[\d.]+)")


def torch_flavour(version: Optional[str], index_url: Optional[str] = None) -> tuple[Optional[str], str]:
    """(flavour, how it was decided) for a torch pin: "cu124", "cpu", or None if unknown.

    A `+cu124` local tag decides first, then a download.pytorch.org/whl/<flavour>
    index, then PyPI's default for that torch minor.
    """
    if version and "+" in version:
        local = version.split("+", 1)[1]
        m = _FLAVOUR_RE.match(local)
        if m:
            return m[1], f"local version tag +{local}"
    if index_url:
        m = re.search(r"/whl/(?:nightly/|test/)?(cu\d{3}|cpu|rocm[\d.]+)/?$", index_url)
        if m:
            return m[1], f"index {index_url}"
    if version:
        m = re.match(r"^(\d+)\.(\d+)", version)
        if m and f"{m[1]}.{m[2]}" in PYPI_DEFAULT_FLAVOUR:
            return PYPI_DEFAULT_FLAVOUR[f"{m[1]}.{m[2]}"], f"PyPI's default build of torch {m[1]}.{m[2]}"
    return None, "unknown: no +local tag, no pytorch.org index and no recorded PyPI default"


def torch_minor(version: Optional[str]) -> Optional[str]:
    m = re.match(r"^(\d+)\.(\d+)", version or "")
    return f"{m[1]}.{m[2]}" if m else None


def published_arch_list(flavour: Optional[str], version: Optional[str] = None) -> Optional[list[str]]:
    """The arch list of torch `version`'s `flavour` wheel, or None where it is not recorded."""
    if flavour is None:
        return None
    if flavour == "cpu":
        return []
    minor = torch_minor(version)
    if minor and (minor, flavour) in PUBLISHED_ARCH_LISTS_BY_MINOR:
        return list(PUBLISHED_ARCH_LISTS_BY_MINOR[(minor, flavour)])
    if minor and tuple(int(x) for x in minor.split(".")) >= (2, 9):
        return None  # a newer torch than this table: probe the env rather than guess
    return PUBLISHED_ARCH_LISTS.get(flavour)


NO_KERNEL_IMAGE = "no kernel image is available"


def no_kernel_image_hint(error: Optional[str], capability, arch_list) -> Optional[str]:
    """What to do about torch's or an extension's "no kernel image is available" error.

    torch's own list decides which of the two it was: when the list covers the
    GPU, the kernel that failed came from an extension built for other targets.
    """
    if not error or NO_KERNEL_IMAGE not in error.lower() or capability is None:
        return None
    cap = parse_capability(capability) if isinstance(capability, str) else (int(capability[0]), int(capability[1]))
    name, dotted = sm_name(cap), f"{cap[0]}.{cap[1]}"
    match = gpu_runnable(cap, arch_list or [])
    if match.runnable:
        return (f"torch itself covers this GPU ({name} via {match.via}), so the kernel without an image comes "
                f"from an extension built for other targets: rebuild it with TORCH_CUDA_ARCH_LIST=\"{dotted}\" "
                f"(or {dotted}+PTX)")
    return (f"this torch build has no code for {name}: {match.reason}; install a torch whose arch list "
            f"covers {name} (envport doctor --env NAME shows what each flavour ships)")


# The oldest driver each CUDA major runs on under minor version compatibility,
# from NVIDIA's CUDA Toolkit Release Notes, table "CUDA Toolkit and Minimum
# Required Driver Version for CUDA Minor Version Compatibility" (Linux x86-64):
# 13.x >= 580, 12.x >= 525.60.13, 11.x >= 450.80.02.  Below it torch's CUDA
# build does not load: torch.cuda.is_available() is False with only a warning
# ("The NVIDIA driver on your system is too old (found version 12080)").  A
# cu130 wheel therefore needs an R580+ driver.
DRIVER_FLOORS: dict[int, str] = {13: "580", 12: "525.60.13", 11: "450.80.02"}


def version_tuple(text: Optional[str]) -> Optional[tuple[int, ...]]:
    try:
        return tuple(int(x) for x in (text or "").split("."))
    except ValueError:
        return None


def driver_check(driver: Optional[str], driver_cuda: Optional[str], torch_cuda: Optional[str]) -> dict:
    """The driver against torch's CUDA build: the floor it needs, named, and whether this one meets it."""
    out: dict = {"driver": driver, "driver_cuda": driver_cuda, "torch_cuda": torch_cuda, "floor": None,
                 "ok": None}
    build = version_tuple(torch_cuda)
    if not build:
        out["detail"] = "torch is a CPU build (or was not probed): no driver floor to meet"
        return out
    floor = DRIVER_FLOORS.get(build[0])
    out["floor"] = floor
    need = (f"torch's CUDA {torch_cuda} build needs an NVIDIA driver >= {floor} (R{floor.split('.')[0]}+, "
            f"NVIDIA's minor-version-compatibility table)" if floor else
            f"torch's CUDA {torch_cuda} build: no driver floor recorded for CUDA {build[0]}.x")
    have, have_cuda = version_tuple(driver), version_tuple(driver_cuda)
    if have is None and have_cuda is None:
        out["detail"] = f"{need}; this host's driver is unknown (no nvidia-smi answer)"
        return out
    too_old = bool((floor and have and have < version_tuple(floor))
                   or (have_cuda and have_cuda[:1] < build[:1]))
    out["ok"] = not too_old
    seen = f"this host's driver is {driver or '?'} (CUDA {driver_cuda or '?'})"
    if too_old:
        out["detail"] = (f"{need}; {seen}: torch.cuda.is_available() will be False. fix: upgrade the driver "
                         f"to {floor or 'a newer branch'}+, or pin a torch built for CUDA {driver_cuda or 'this driver'}")
    else:
        out["detail"] = f"{need}; {seen}: meets it"
    return out


def driver_finding(drv: dict) -> Finding:
    """driver_check's answer as a Finding: the one reading preflight (against the spec's torch pin) and
    doctor (against the torch it probes) give it. A too-old driver refuses with its fix; a driver that
    meets the floor is OK; one that could not be judged (a CPU build, no nvidia-smi answer) is a note."""
    if drv.get("ok") is False:
        evidence, _, fix = drv["detail"].partition(" fix: ")
        return Finding("driver_too_old", evidence, fix, check="driver")
    return Finding("", drv["detail"], check="driver", verdict=Verdict.OK if drv.get("ok") else None)


def flavour_cuda(flavour: Optional[str]) -> Optional[str]:
    """The CUDA version of a torch flavour: "cu130" -> "13.0", "cu118" -> "11.8"; None for cpu, rocm, unknown."""
    m = re.match(r"^cu(\d{2,3})$", flavour or "")
    return f"{m[1][:-1]}.{m[1][-1]}" if m else None

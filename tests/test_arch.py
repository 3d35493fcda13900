"""Arch compatibility: the cubin / PTX / arch-specific rules against torch's published lists."""

from __future__ import annotations

import pytest

from envport.core.arch import (
    PUBLISHED_ARCH_LISTS,
    PUBLISHED_ARCH_LISTS_BY_MINOR,
    capabilities_in_range,
    gpu_runnable,
    parse_arch,
    parse_arch_list,
    parse_capability,
    published_arch_list,
    range_verdict,
    torch_flavour,
)

CU124 = "sm_50 sm_60 sm_70 sm_75 sm_80 sm_86 sm_90"  # torch 2.4 cu124, as get_arch_list() prints it
CU128 = "sm_75 sm_80 sm_86 sm_90 sm_100 sm_120"  # cu128 builds add Blackwell
CU124_PTX = CU124 + " compute_90"
# torch 2.9/2.10 +cu130 and 2.12/2.13 +cu130 on x86-64: TORCH_CUDA_ARCH_LIST 7.5;8.0;8.6;9.0;10.0;12.0+PTX
# (pytorch .ci/manywheel/build_cuda.sh at v2.9.0 and v2.10.0; RELEASE.md's CUDA support matrix for 2.12/2.13).
CU130 = "sm_75 sm_80 sm_86 sm_90 sm_100 sm_120 compute_120"
# torch 2.11.0+cu130 and +cu128: the same list without PTX (build_cuda.sh at v2.11.0; a 2.11.0 wheel's
# torch.cuda.get_arch_list() prints exactly this).
CU130_211 = "sm_75 sm_80 sm_86 sm_90 sm_100 sm_120"
# torch 2.10.0+cu128 keeps Volta (build_cuda.sh at v2.10.0: 7.0;7.5;8.0;8.6;9.0;10.0;12.0, no PTX).
CU128_210 = "sm_70 sm_75 sm_80 sm_86 sm_90 sm_100 sm_120"

# (GPU capability, arch list, runnable, the entry that covers it, through PTX JIT)
TABLE = [
    ((8, 0), CU124, True, "sm_80", False),  # A100: exact cubin
    ((8, 6), CU124, True, "sm_86", False),  # A10/3090: exact cubin
    ((8, 9), CU124, True, "sm_86", False),  # L4/4090: same major, lower minor cubin
    ((9, 0), CU124, True, "sm_90", False),  # H100/H200
    ((7, 0), CU124, True, "sm_70", False),  # V100
    ((7, 5), CU124, True, "sm_75", False),  # T4
    ((6, 1), CU124, True, "sm_60", False),  # P40: sm_60 cubin runs on 6.1
    ((10, 0), CU124, False, None, False),  # B200 on a cu124 build: no sm_10x cubin, no PTX
    ((12, 0), CU124, False, None, False),  # RTX 50xx on cu124
    ((3, 7), CU124, False, None, False),  # K80: below every target
    ((10, 0), CU128, True, "sm_100", False),  # B200 on cu128
    ((12, 0), CU128, True, "sm_120", False),  # RTX 5090 on cu128
    ((12, 1), CU128, True, "sm_120", False),  # GB10 (sm_121): sm_120 cubin, higher minor
    ((10, 3), CU128, True, "sm_100", False),  # B300: same major
    ((7, 0), CU128, False, None, False),  # V100 dropped from cu128 lists
    ((10, 0), CU124_PTX, True, "compute_90", True),  # PTX compiles forward across majors
    ((12, 1), CU124_PTX, True, "compute_90", True),
    ((8, 6), CU124_PTX, True, "sm_86", False),  # a cubin wins over PTX
    ((8, 0), "compute_90", False, None, False),  # PTX never compiles backward
    ((9, 0), "sm_90a", True, "sm_90a", False),  # arch-specific: exactly 9.0 ...
    ((10, 0), "sm_90a", False, None, False),  # ... and nothing else
    ((10, 0), "compute_90a", False, None, False),  # arch-specific PTX does not move forward
    ((8, 6), "8.0+PTX", True, "8.0+PTX", False),  # TORCH_CUDA_ARCH_LIST spelling, cubin half
    ((9, 0), "8.0+PTX", True, "8.0+PTX", True),  # ... and its PTX half
    ((10, 3), "sm_100f", True, "sm_100f", False),  # family-specific: same major, higher minor
    ((12, 0), "sm_100f", False, None, False),
    ((8, 6), "", False, None, False),  # a CPU-only build
]


# The cases issue 12 lists, one test each (the lists come from the constants above).
def test_sm_90_on_cu130_runs_its_own_cubin():
    assert gpu_runnable((9, 0), CU130) == gpu_runnable((9, 0), CU130_211)
    m = gpu_runnable((9, 0), CU130)
    assert (m.runnable, m.via, m.jit) == (True, "sm_90", False)


def test_sm_121_on_cu130_runs_the_sm_120_cubin():
    m = gpu_runnable((12, 1), CU130)
    assert (m.runnable, m.via, m.jit) == (True, "sm_120", False)


def test_sm_103_runs_the_sm_100_cubin():
    m = gpu_runnable((10, 3), CU130)
    assert (m.runnable, m.via, m.jit) == (True, "sm_100", False)


def test_a_future_13_0_runs_only_through_ptx():
    m = gpu_runnable((13, 0), CU130)
    assert (m.runnable, m.via, m.jit) == (True, "compute_120", True)
    bare = gpu_runnable((13, 0), CU130_211)  # 2.11's list has no PTX: nothing compiles forward
    assert not bare.runnable and "no PTX at or below 13.0" in bare.reason


def test_sm_90a_only_build_runs_on_hopper_alone():
    assert gpu_runnable((9, 0), "sm_90a").runnable
    for cap in ((8, 0), (8, 9), (10, 0), (12, 0)):
        assert not gpu_runnable(cap, "sm_90a").runnable, cap


def test_sm_100_cannot_run_sm_90a_code():
    m = gpu_runnable((10, 0), "sm_90a compute_90a")
    assert not m.runnable and "arch- and family-specific code" in m.reason


def test_sm_103_runs_sm_100f_but_not_sm_100a():
    assert not gpu_runnable((10, 3), "sm_100a").runnable
    fam = gpu_runnable((10, 3), "sm_100f")
    assert (fam.runnable, fam.via) == (True, "sm_100f")


def test_sm_89_runs_the_sm_86_cubin():
    m = gpu_runnable((8, 9), "sm_80 sm_86")
    assert (m.runnable, m.via, m.jit) == (True, "sm_86", False)


def test_sm_80_cannot_run_an_sm_86_cubin():
    m = gpu_runnable((8, 0), "sm_86")
    assert not m.runnable and "no cubin of major 8 at or below minor 0" in m.reason


def test_sm_70_on_cu130_is_not_covered():
    # CUDA 13 dropped Maxwell, Pascal and Volta; 2.10's cu128 still had sm_70.
    assert not gpu_runnable((7, 0), CU130).runnable
    assert gpu_runnable((7, 0), CU128_210).via == "sm_70"
    assert not gpu_runnable((7, 0), CU130_211).runnable


def test_sm_120_cannot_jit_family_ptx_of_another_family():
    m = gpu_runnable((12, 0), "compute_100f")
    assert not m.runnable and "compute_100f" in m.reason
    assert gpu_runnable((10, 3), "compute_100f").jit  # inside its family it JIT-compiles


@pytest.mark.parametrize("version,flavour,expected", [
    ("2.9.1", "cu130", CU130), ("2.10.0", "cu130", CU130), ("2.11.0", "cu130", CU130_211),
    ("2.13.0", "cu130", CU130), ("2.10.0", "cu128", CU128_210), ("2.11.0", "cu128", CU130_211),
    ("2.4.1", "cu124", CU124), ("2.13.0", "cpu", ""),
])
def test_published_lists_by_torch_minor(version, flavour, expected):
    assert published_arch_list(flavour, version) == expected.split()


def test_a_torch_newer_than_the_table_is_unknown_not_guessed():
    assert published_arch_list("cu130", "2.14.0") is None
    assert published_arch_list("cu128", "2.12.0") is None  # 2.12 ships no cu128


@pytest.mark.parametrize("cap,arch_list,runnable,via,jit", TABLE,
                         ids=[f"sm_{c[0]}{c[1]}-{(a or 'cpu').split()[-1]}-{r}" for c, a, r, *_ in TABLE])
def test_compatibility_table(cap, arch_list, runnable, via, jit):
    match = gpu_runnable(cap, arch_list)
    assert match.runnable is runnable, match.reason
    assert match.via == via
    assert match.jit is jit
    if not runnable:
        assert match.reason


def test_the_table_is_big_enough():
    assert len(TABLE) >= 15


@pytest.mark.parametrize("text,cap", [("sm_86", (8, 6)), ("sm_90a", (9, 0)), ("sm_100", (10, 0)),
                                      ("sm_121", (12, 1)), ("8.6", (8, 6)), ("12.0", (12, 0))])
def test_parse_capability(text, cap):
    assert parse_capability(text) == cap


def test_parse_arch_kinds():
    (cubin,) = parse_arch("sm_90")
    (ptx,) = parse_arch("compute_90")
    (specific,) = parse_arch("sm_90a")
    assert (cubin.ptx, ptx.ptx, specific.suffix) == (False, True, "a")
    assert [t.ptx for t in parse_arch("8.6+PTX")] == [False, True]
    assert len(parse_arch_list("sm_80;sm_86, compute_90")) == 3
    with pytest.raises(ValueError):
        parse_arch("gfx90a")


def test_range_verdict_covered_and_not():
    ok = range_verdict(["sm_80", "sm_90"], CU124.split())
    assert ok.ok and "sm_80" in ok.detail and not ok.uncovered
    bad = range_verdict(["sm_80", "sm_120"], CU124.split())
    assert not bad.ok
    names = {f"sm_{m.capability[0]}{m.capability[1]}" for m in bad.uncovered}
    assert {"sm_100", "sm_120"} <= names and "sm_90" not in names
    jit = range_verdict(["sm_90", "sm_120"], CU124_PTX.split())
    assert jit.ok and "PTX" in jit.detail
    cpu = range_verdict(["sm_80", "sm_90"], [])
    assert not cpu.ok and "CPU-only" in cpu.detail


def test_range_includes_both_bounds():
    caps = capabilities_in_range(["sm_86", "sm_90"])
    assert caps[0] == (8, 6) and caps[-1] == (9, 0) and (8, 9) in caps


@pytest.mark.parametrize("version,index,flavour", [
    ("2.4.1", "https://download.pytorch.org/whl/cu124", "cu124"),
    ("2.7.0+cu128", None, "cu128"),
    ("2.13.0+cpu", None, "cpu"),
    ("2.6.0", None, "cu124"),
    ("2.10.0", None, "cu128"),  # PyPI's default moved to CUDA 13.0 with 2.11
    ("2.11.0", None, "cu130"),
    ("2.13.0", None, "cu130"),
    ("3.0.0", None, None),
])
def test_torch_flavour(version, index, flavour):
    assert torch_flavour(version, index)[0] == flavour


def test_published_lists_parse():
    for items in [*PUBLISHED_ARCH_LISTS.values(), *PUBLISHED_ARCH_LISTS_BY_MINOR.values()]:
        parse_arch_list(items)

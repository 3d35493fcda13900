"""Diagnosis rows that name facts from the log (issue 38, U12): pip's "No matching distribution" names the
requirement and the index that serves it (PyTorch's for a +cpu/+cuXYZ pin) and where pip looked; a FUSE
"Permission denied" is the host's FUSE, never the entrypoint-permission row that any "permission denied"
used to match."""

from __future__ import annotations

from envport.report.diagnosis import diagnose, first

from .test_diagnosis import SCENARIOS


def _lines(name: str) -> list[str]:
    path = next(p for p in SCENARIOS if p.name == name)
    return [ln for ln in path.read_text().splitlines() if not ln.startswith("#")]


def test_a_missing_local_version_names_pytorchs_index_and_where_pip_looked():
    d = first(_lines("pip_local_version.log"))
    assert d.row.id == "pip_local_version_missing"
    assert "pip found no file for torch==2.13.0+cpu" in d.row.wrong
    assert "pip looked only in: https://pypi.org/simple" in d.row.wrong
    assert d.finding.fix.startswith("add https://download.pytorch.org/whl/cpu where this build reads its "
                                    "sources: a container build the site profile's pip.extra_index_urls")
    assert "$" not in d.row.wrong + d.row.fix
    assert any("download.pytorch.org/whl/cpu" in ln for ln in d.lines())
    assert d.to_dict()["fix"] == d.finding.fix


def test_any_other_missing_distribution_names_the_requirement_and_the_indexes():
    d = first(_lines("pip_no_distribution.log"))
    assert d.row.id == "pip_no_distribution"
    assert d.row.wrong == ("no pip source this build used serves six==1.16.0 (pip looked in: https://pypi.org/simple, "
                           "file:///opt/pypi/simple, file:///opt/pypi-more/simple)")
    assert d.row.fix.startswith("add the index or find-links folder that serves six==1.16.0 where this build")


def test_a_log_without_the_index_line_says_so_instead_of_a_placeholder():
    d = first(["ERROR: No matching distribution found for torch==2.13.0+cu128"])
    assert d.row.id == "pip_local_version_missing"
    assert "https://download.pytorch.org/whl/cu128" in d.row.fix and "(not in the log)" in d.row.wrong


def test_a_fuse_permission_error_is_not_an_entrypoint_permission():
    found = [d.row.id for d in diagnose(_lines("fuse_permission.log"))]
    assert found == ["fuse_permission"]
    for line in ("fusermount3: failed to open /etc/fuse.conf: Permission denied",
                 "squashfuse: mount failed: Operation not permitted"):
        assert [d.row.id for d in diagnose([line])] == ["fuse_permission"], line
    # An entrypoint's own permission error is still that row.
    assert first(["/usr/local/bin/entrypoint.sh: line 3: /workspace/out/phase.done: Permission denied"]).row.id \
        == "entrypoint_permission"

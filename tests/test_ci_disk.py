"""CI's disk: what a run keeps, and what .ci/disk.sh says (tests/README.md "What stays between runs").

A CI run once failed its last tests `disk_low` because every test's tmp_path was kept (31 GB) beside 18 GB of
old registry pushes. These check the two settings that prevent it and the report that shows it.
"""

from __future__ import annotations

import subprocess
import tomllib

from .support import REPO


def test_pytest_keeps_only_a_failing_tests_tmp_path():
    ini = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert ini.get("tmp_path_retention_policy") == "failed"


def test_the_registry_starts_with_empty_storage():
    script = (REPO / ".ci" / "services" / "registry.sh").read_text().splitlines()
    wipe = script.index('rm -rf "$dir/storage"')
    # Emptied on a fresh start only: after the early exit for a registry that already answers.
    early_exit = next(i for i, line in enumerate(script) if line.strip() == "exit 0")
    assert early_exit < wipe < script.index('mkdir -p "$dir/storage"')


def test_disk_report_says_the_free_space_and_warns_when_short(tmp_path):
    # `after`: the report only (the `before` mode also prunes docker's dangling images and build cache).
    proc = subprocess.run(["bash", str(REPO / ".ci" / "disk.sh"), "after"], capture_output=True, text=True,
                          timeout=120, env={"PATH": "/usr/bin:/bin", "TMPDIR": str(tmp_path),
                                            "ENVPORT_CI_DISK_NEED_GB": "1000000"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0].split()[:2] == ["Filesystem", "Size"]
    assert f"under {tmp_path}; a full run needs about 1000000 GB" in proc.stderr

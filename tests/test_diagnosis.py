"""The diagnosis table (seed 004): each row's symptom reproduced for real where this machine can make it
happen, every scenario log in tests/diagnosis/ (`# expect: ROW LAYER` headers), and the docs list every row.

Real reproductions: a package using np.int under numpy >= 1.24; a --no-deps install that leaves a runtime
dependency out; a tool writing under a read-only weights mount (docker); a shared library that is built but
not on the loader path (gcc, then the fix proven by LD_LIBRARY_PATH); a #!/bin/bash script where only
/bin/sh exists (docker, bash removed); torch asked for CUDA on this CPU-only host.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from envport.report.diagnosis import LAYERS, diagnose, first, table

from .support import REPO, run_envport, torch_python

SCENARIOS = sorted((Path(__file__).parent / "diagnosis").glob("*.log"))
BASE = "envport/debian-bookworm:base"


def _expect(path: Path) -> tuple[str, str]:
    m = re.search(r"^# expect: (\S+)(?: (\S+))?$", path.read_text(), re.MULTILINE)
    assert m, f"{path.name}: no `# expect: ROW LAYER` header"
    return m.group(1), m.group(2) or ""


def _verdict(output: str):
    d = first(output.splitlines())
    assert d is not None, f"no diagnosis row matches:\n{output}"
    return d


# --- the table ------------------------------------------------------------------------


def test_every_row_is_complete_and_in_a_known_layer():
    rows = table()
    assert len(rows) >= 14
    for r in rows:
        assert r.layer in LAYERS and r.wrong and r.fix and r.symptom.pattern, r


def test_every_row_has_a_scenario_file_and_the_docs_list_every_row():
    expected = {_expect(p)[0] for p in SCENARIOS}
    ids = [r.id for r in table()]
    assert set(ids) <= expected, f"rows without a tests/diagnosis/*.log scenario: {sorted(set(ids) - expected)}"
    cli_doc = (REPO / "docs" / "cli.md").read_text()
    missing = [i for i in ids if f"`{i}`" not in cli_doc]
    assert not missing, f"docs/cli.md does not list: {missing}"


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_scenario_logs(path, tmp_path):
    row, layer = _expect(path)
    proc = run_envport("diagnose", str(path), "--json", root=tmp_path, timeout=60)
    import json

    found = json.loads(proc.stdout)["diagnoses"]
    if row == "none":
        assert proc.returncode == 1 and found == []
        return
    assert proc.returncode == 0, proc.stderr
    assert found[0]["id"] == row and found[0]["layer"] == layer, found
    assert found[0]["fix"]


def test_diagnose_reads_stdin_and_prints_layer_and_fix(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "envport", "diagnose", "-"], input="ModuleNotFoundError: "
                          "No module named 'six'\n", capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "diagnosis [module_not_in_spec] layer spec" in proc.stdout and "fix: " in proc.stdout


def test_a_missing_log_file_is_a_usage_error(tmp_path):
    proc = run_envport("diagnose", str(tmp_path / "nope.log"), root=tmp_path, timeout=60)
    assert proc.returncode == 2 and "nope.log" in proc.stderr


# --- real reproductions ---------------------------------------------------------------


def _run(argv, **kw) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, **kw)
    assert proc.returncode != 0, f"{argv} was expected to fail:\n{proc.stdout}{proc.stderr}"
    return proc.stdout + proc.stderr


def test_real_numpy_alias_removed():
    numpy = pytest.importorskip("numpy", reason="numpy is not installed in the test interpreter")
    major, minor = (int(x) for x in numpy.__version__.split(".")[:2])
    if (major, minor) < (1, 24):
        pytest.skip(f"numpy {numpy.__version__} still has the np.int alias (removed in 1.24)")
    out = _run([sys.executable, "-c", "import numpy as np\nmask = np.zeros(4, dtype=np.int)"])
    d = _verdict(out)
    assert (d.row.id, d.row.layer) == ("numpy_alias_removed", "spec") and "np.int" in d.row.fix


def test_real_no_deps_phase_leaves_a_runtime_dependency_out(tmp_path):
    # A venv without the host's packages, python-dateutil installed --no-deps: six (its dependency) is absent.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "v")], check=True, timeout=120)
    py = str(tmp_path / "v" / "bin" / "python")
    site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", site,
                          "python-dateutil==2.9.0.post0"], capture_output=True, text=True, timeout=300)
    if pip.returncode != 0:
        pytest.skip(f"python-dateutil could not be installed from the configured index: {pip.stderr[-300:]}")
    out = _run([py, "-c", "import dateutil.tz"])
    d = _verdict(out)
    assert (d.row.id, d.row.layer) == ("module_not_in_spec", "spec"), out
    assert "No module named 'six'" in d.line


def test_real_missing_shared_library_then_the_fix(tmp_path):
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        pytest.skip("no C compiler (gcc/cc) on PATH to build the library")
    (tmp_path / "demo.c").write_text("int demo_answer(void) { return 42; }\n")
    lib = tmp_path / "lib"
    lib.mkdir()
    subprocess.run([gcc, "-shared", "-fPIC", "-o", str(lib / "libenvportdemo.so"), str(tmp_path / "demo.c")],
                   check=True, timeout=120)
    probe = "import ctypes; print(ctypes.CDLL('libenvportdemo.so').demo_answer())"
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    out = _run([sys.executable, "-c", probe], env=env)
    d = _verdict(out)
    assert (d.row.id, d.row.layer) == ("shared_library_missing", "build"), out
    assert "LD_LIBRARY_PATH" in d.row.fix
    # The fix the row names works: the library's folder on the loader path.
    fixed = subprocess.run([sys.executable, "-c", probe], env={**env, "LD_LIBRARY_PATH": str(lib)},
                           capture_output=True, text=True, timeout=60)
    assert fixed.returncode == 0 and fixed.stdout.strip() == "42", fixed.stderr


def test_real_torch_asked_for_cuda_on_a_cpu_only_host():
    if shutil.which("nvidia-smi"):
        pytest.skip("this host has a GPU (nvidia-smi): the symptom needs a CPU-only host")
    out = _run([torch_python(), "-c", "import torch; torch.zeros(1).cuda()"])
    d = _verdict(out)
    assert (d.row.id, d.row.layer) == ("torch_cuda_on_cpu_host", "host") and d.row.host, out


def test_real_tool_writing_under_a_read_only_weights_mount(docker_client, base_image, tmp_path):
    weights = tmp_path / "weights"
    weights.mkdir()
    (weights / "model.bin").write_bytes(b"\0" * 16)
    tool = "open('/weights/hf/.lock', 'w').write('busy')"
    out = _run(["docker", "run", "--rm", "-v", f"{weights}:/weights/hf:ro", BASE, "python3.11", "-c", tool])
    d = _verdict(out)
    assert (d.row.id, d.row.layer) == ("read_only_cache", "weights"), out
    assert "Read-only file system" in d.line


def test_real_bash_script_where_only_sh_exists(docker_client, base_image):
    # The base image with bash removed (a minimal runtime): a wrapper starting #!/bin/bash never runs.
    script = textwrap.dedent("""\
        rm -f /bin/bash /usr/bin/bash
        printf '#!/bin/bash\\necho phase done > /tmp/marker\\n' > /run-phase.sh
        chmod +x /run-phase.sh
        /run-phase.sh
        """)
    out = _run(["docker", "run", "--rm", "--entrypoint", "/bin/sh", BASE, "-c", script])
    d = _verdict(out)
    assert (d.row.id, d.row.layer) == ("bash_missing", "exec"), out
    assert "#!/bin/sh" in d.row.fix


def test_every_match_is_kept_with_the_first_as_the_verdict():
    lines = ["ModuleNotFoundError: No module named 'x'", "OSError: [Errno 30] Read-only file system: '/w/a'"]
    found = diagnose(lines)
    # The table's order decides: the module row comes before the read-only row.
    assert [d.row.id for d in found] == ["module_not_in_spec", "read_only_cache"]

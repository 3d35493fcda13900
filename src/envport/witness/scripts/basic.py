"""Witness: the env's interpreter version, its imports, its CLI checks and its weights.

stdlib only, so it also proves envs without torch.  Each import is tried in a
fresh interpreter so one that aborts the process (a bad .so) cannot take the
other checks with it, and from a scratch cwd so nothing next to the caller
shadows the env's packages.

    python basic.py --python 3.11 --import torch --import numpy \
        --cli '{"cmd": "pip --version", "expect": "^pip "}' \
        --weight '{"name": "tiny", "env": "DEMO_WEIGHTS", "path": "/weights/tiny",
                   "files": [{"path": "tiny.f32", "size": 4096, "sha256": "..."}]}'

A weight is read the way the tool would find it: through its env var (the
spec's path when it declares none), every byte hashed; the record says whether
the folder is read-only there (a mount should be), and when it is not, why
(the launcher says so in $ENVPORT_WEIGHTS_WRITABLE: no working bwrap here).
"""

import argparse
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from envport_sentinel import emit, tail

_IMPORT_PROBE = r"""
import importlib, json, sys
name = sys.argv[1]
mod = importlib.import_module(name)
top = sys.modules.get(name.split(".")[0])
print(json.dumps({"version": str(getattr(mod, "__version__", getattr(top, "__version__", "")) or ""),
                  "file": str(getattr(mod, "__file__", "") or "")}))
"""


def run_bounded(argv, cwd, timeout, merge):
    """(returncode or None on timeout, stdout, stderr); a timeout kills the whole process group.

    subprocess.run alone would wait on grandchildren still holding the pipe
    (`sh -c "server &"`), so the command gets its own session and all of it goes.
    """
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT if merge else subprocess.PIPE,
                            stdin=subprocess.DEVNULL, universal_newlines=True,
                            errors="replace", start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out or "", err or ""
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        out, err = proc.communicate()
        return None, out or "", err or ""


def check_python(expected):
    got = "%d.%d.%d" % sys.version_info[:3]
    ok = expected is None or "%d.%d" % sys.version_info[:2] == expected
    emit({"check": "python", "name": "python", "ok": ok, "expected": expected, "got": got,
          "executable": sys.executable, "seconds": 0.0})
    return ok


def check_import(name, timeout, scratch):
    t = time.time()
    rec = {"check": "import", "name": name}
    rc, out, err = run_bounded([sys.executable, "-c", _IMPORT_PROBE, name], scratch, timeout, False)
    if rc is None:
        rec.update(ok=False, error="import did not finish within %ss" % timeout)
    elif rc == 0:
        rec.update(ok=True, **json.loads(out.strip().splitlines()[-1]))
    else:
        lines = tail(err, 12)
        rec.update(ok=False, returncode=rc, error=lines[-1] if lines else "exit %d" % rc, tail=lines)
    rec["seconds"] = round(time.time() - t, 3)
    emit(rec)
    return rec["ok"]


def check_cli(cmd, expect, timeout, scratch):
    # The spec writes these as shell lines ("tool --help | head"), so a shell runs them.
    t = time.time()
    rec = {"check": "cli", "name": cmd, "expect": expect}
    rc, out, _ = run_bounded(["/bin/sh", "-c", cmd], scratch, timeout, True)
    if rc is None:
        rec["error"] = "did not finish within %ss" % timeout
    match = re.search(expect, out, re.MULTILINE)
    # The regex decides, not the exit status: many tools print usage and exit 1 or 2.
    rec.update(ok=bool(match) and rc is not None, returncode=rc,
               matched=match.group(0)[:200] if match else None, tail=tail(out, 12),
               seconds=round(time.time() - t, 3))
    emit(rec)
    return rec["ok"]


def check_weight(spec):
    t = time.time()
    name = spec["name"]
    var = spec.get("env")
    folder = os.environ.get(var) if var else spec.get("path")
    rec = {"check": "weight", "name": name, "env": var, "folder": folder}
    problems = []
    if var and not folder:
        problems.append("%s is not set in the env" % var)
    elif not os.path.isdir(folder):
        problems.append("%s is not a folder here%s" % (folder, " (from $%s)" % var if var else ""))
    else:
        for f in spec.get("files") or []:
            path = os.path.join(folder, f["path"])
            try:
                h, size = hashlib.sha256(), 0
                with open(path, "rb") as fh:
                    for chunk in iter(lambda: fh.read(1 << 22), b""):
                        h.update(chunk)
                        size += len(chunk)
            except OSError as exc:
                problems.append("%s: %s" % (path, exc.strerror or exc))
                continue
            want_size, want_sha = f.get("size"), f.get("sha256")
            if (want_size is not None and size != want_size) or (want_sha and h.hexdigest() != want_sha):
                problems.append("%s: %d bytes, sha256 %s; the pin is %s bytes, sha256 %s"
                                % (path, size, h.hexdigest(), want_size, want_sha))
        # W_OK is false on a read-only mount even for root (EROFS), unlike a mode bit.
        rec["read_only"] = not os.access(folder, os.W_OK)
        if not rec["read_only"]:
            # Why the launcher could not mount it read-only here (local.WRITABLE_ENV), when it says.
            rec["writable_why"] = os.environ.get("ENVPORT_WEIGHTS_WRITABLE") or ""
        rec["files"] = len(spec.get("files") or [])
    rec.update(ok=not problems, problems=problems, seconds=round(time.time() - t, 3))
    emit(rec)
    return rec["ok"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", help="expected MAJOR.MINOR")
    ap.add_argument("--import", dest="imports", action="append", default=[])
    ap.add_argument("--cli", action="append", default=[], help='JSON {"cmd": ..., "expect": ...}')
    ap.add_argument("--weight", action="append", default=[],
                    help='JSON {"name", "env", "path", "files": [{"path", "size", "sha256"}]}')
    ap.add_argument("--timeout", type=float, default=120.0, help="per import / per command")
    args = ap.parse_args(argv)
    ok = check_python(args.python)
    with tempfile.TemporaryDirectory(prefix="envport-witness-") as scratch:
        for name in args.imports:
            ok = check_import(name, args.timeout, scratch) and ok
        for item in args.cli:
            spec = json.loads(item)
            ok = check_cli(spec["cmd"], spec["expect"], args.timeout, scratch) and ok
    for item in args.weight:
        ok = check_weight(json.loads(item)) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

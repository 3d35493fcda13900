"""The shell builder: run the rendered setup script locally or over SSH.

The script decides `present` itself (it compares the hash recorded inside the
env), so the same check works on a host envport cannot otherwise inspect.
Over SSH the script travels on stdin (`ssh HOST bash -s`), shim files inside
it.  An unreachable host is REFUSED within the connect timeout.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import subprocess
import time
from pathlib import Path

from envport.recipe.render import render_plan

from envport.spec.loader import Loaded
from envport.recipe.identity import Resolved, resolve
from envport.engines.ssh import is_unreachable, resolve_host, ssh_argv, unreachable
from envport.core.progress import Progress
from envport.core.verdict import StepResult, Verdict

FORWARDED_ENV = ("ENVPORT_ENVS_DIR", "ENVPORT_ROOT")
REFUSED_RE = re.compile(r"REFUSED \[(\w+)\]: (.*)$")
PREFIX_RE = re.compile(r"(?:ready|present \S+) at (\S.*)$")


def script_text(resolved: Resolved) -> str:
    fname = f"setup-{resolved.target}.sh"
    rendering = render_plan(resolved.plan, resolved.hash, ("shell",), site=resolved.identity.site)
    return rendering.files[fname][0].decode()


def build(loaded: Loaded, site, root: Path, *, flavour: str, host: str | None = None, rebuild: bool = False,
          progress: Progress) -> list[StepResult]:
    name = f"build {loaded.spec.name} ({flavour}{' on ' + host if host else ''})"
    resolved = resolve(loaded, site, flavour)
    env_pairs = {k: os.environ[k] for k in FORWARDED_ENV if k in os.environ}
    if rebuild:
        env_pairs["ENVPORT_REBUILD"] = "1"
    target_host = resolve_host(site, host)
    if target_host is None:
        argv = ["bash", "-s"]
        env = {**os.environ, **env_pairs}
    else:
        remote = " ".join(["env", *[f"{k}={shlex.quote(v)}" for k, v in sorted(env_pairs.items())], "bash", "-s"])
        argv = ssh_argv(target_host) + [remote]
        env = None
    start = time.monotonic()
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env)
    assert proc.stdin and proc.stdout
    # ssh may give up before reading the script (host unreachable): its exit code and output say why.
    with contextlib.suppress(BrokenPipeError):
        proc.stdin.write(script_text(resolved))
    with contextlib.suppress(BrokenPipeError):
        proc.stdin.close()
    lines: list[str] = []
    for line in proc.stdout:
        line = line.rstrip("\n")
        lines.append(line)
        if line.startswith("envport["):
            progress(line)
    rc = proc.wait()
    seconds = time.monotonic() - start
    prefix = next((m.group(1) for ln in reversed(lines) if (m := PREFIX_RE.search(ln))), None)
    detail = {"prefix": prefix, "ssh_host": host}
    if rc == 0:
        present = any(" present " in ln and ln.startswith("envport[") and "@" in ln for ln in lines[-3:])
        verdict = Verdict.PRESENT if present else Verdict.OK
        return [StepResult(name, verdict, f"{resolved.identity.ref} at {prefix}",
                           seconds=seconds,
                           data={k: v for k, v in detail.items() if v})]
    if rc == 3:
        m = next((REFUSED_RE.search(ln) for ln in reversed(lines) if REFUSED_RE.search(ln)), None)
        reason, why = (m.group(1), m.group(2)) if m else ("refused", lines[-1] if lines else "")
        return [StepResult(name, Verdict.REFUSED, why, reason=reason, seconds=seconds)]
    from envport.build.lock import hash_mismatches

    swapped = hash_mismatches(lines)
    if swapped:
        return [StepResult(name, Verdict.FAILED, f"{swapped[0]}; that phase installed nothing",
                           reason="hash_mismatch", lines=swapped, seconds=seconds)]
    last = "\n".join(lines[-3:])
    if target_host is not None and is_unreachable(rc, last):
        return [unreachable(name, host, last, seconds)]
    return [StepResult(name, Verdict.FAILED, f"setup script exited {rc}", lines=lines[-30:], seconds=seconds)]

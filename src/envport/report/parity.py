"""Cross-backend parity: the same spec built on every target this host can run, then compared.

envport.flow.parity builds and probes each target (through envport.targets);
this module holds the probe, the facts and their comparison.

For each target (docker image, the SIF built from the .def, venv here, venv on
each SSH site host, conda where a conda is on PATH) the env is built, or found `present`, and probed
from inside, the way a user would use it (`docker run IMAGE`, `. bin/activate`):

- `pip freeze --all`, names normalized (PEP 503), without the installer's own
  packages (pip, setuptools, wheel) and envport's (envport itself);
- the python version, compared at the precision the spec declares (`"3.11"`:
  major.minor; a Debian 3.11.2 and a pyenv 3.11.7 both satisfy it);
- the env vars the spec declares (its `env:` and the weight dirs' `env`) and
  ENVPORT_NAME; never PATH/HOME/HOSTNAME and friends, and not ENVPORT_HASH,
  which legitimately differs (a container build's hash includes the site).

Any difference is named (`package requests: venv 2.31.0, docker -, venv@test -`)
and fails the run (exit 1).  A target the host cannot run (no engine, host
unreachable, no conda) is skipped with its reason.

The SSH host may be this very machine (the test sshd): its envs then go to a
separate folder (`~/.envport/ssh-envs`, the SSH user's own home on the host) so
"venv over SSH" is really built a second time, not found present from the local
build.  Never a fixed shared path: another user who made it first would own the
env that the build runs (issue 21, F2).
"""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from envport.core.proc import run
from envport.spec.loader import Loaded
from envport.spec.model import canonical_name
from envport.engines.ssh import ssh_argv
from envport.core.verdict import StepResult, Verdict

# Installer and envport packages: they differ by how the env was made, not by what the spec asks.
EXCLUDED_PACKAGES = frozenset({"pip", "setuptools", "wheel", "distribute", "pkg-resources", "envport"})
# `~/` is the SSH user's home on the host (setup-venv.sh and engines/ssh prefix_expr expand it there).
SAME_MACHINE_SSH_ENVS_DIR = "~/.envport/ssh-envs"
PROBE_TIMEOUT_S = 180.0

# Runs inside each env (stdlib only): the interpreter, pip's view of the packages, the env vars asked for.
PROBE = r"""
import json, os, platform, subprocess, sys
names = sys.argv[1:]
p = subprocess.run([sys.executable, "-m", "pip", "freeze", "--all", "--disable-pip-version-check"],
                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
out = {"python": platform.python_version(), "executable": sys.executable, "freeze": p.stdout.splitlines(),
       "freeze_rc": p.returncode, "freeze_err": p.stderr[-2000:], "env": {k: os.environ.get(k) for k in names}}
try:
    import importlib.metadata as md
    out["versions"] = {d.metadata["Name"]: d.version for d in md.distributions() if d.metadata["Name"]}
except Exception:
    out["versions"] = {}
print("ENVPORT-PARITY " + json.dumps(out, sort_keys=True))
"""


def parse_freeze(lines: list[str], versions: Optional[dict] = None) -> dict[str, str]:
    """{normalized name: version} from `pip freeze` lines; `name @ url` lines get the installed version."""
    by_name = {canonical_name(k): v for k, v in (versions or {}).items()}
    out: dict[str, str] = {}
    for line in lines:
        line = line.strip()
        if not line or line.startswith("#") or line.startswith("-e "):
            continue
        if "==" in line:
            name, version = line.split("==", 1)
        elif " @ " in line:
            name = line.split(" @ ", 1)[0]
            version = by_name.get(canonical_name(name), "@ " + line.split(" @ ", 1)[1])
        else:
            name, version = line, by_name.get(canonical_name(line), "?")
        name = canonical_name(name.split("[")[0].strip())
        if name not in EXCLUDED_PACKAGES:
            out[name] = version.strip()
    return out


def env_names(loaded: Loaded) -> list[str]:
    """The variables a built env must carry: the spec's env, the weight dirs' env vars, ENVPORT_NAME."""
    spec = loaded.spec
    names = set(spec.env) | {w.env for w in spec.weight_dirs.values() if w.env} | {"ENVPORT_NAME"}
    return sorted(names)


def python_precision(declared: str, version: str) -> str:
    """`version` cut to as many parts as the spec declares ("3.11" -> "3.11" of "3.11.7")."""
    n = len(declared.split("."))
    return ".".join(version.split(".")[:n])


@dataclass
class TargetFacts:
    target: str  # docker | venv | venv@HOST | conda
    build: Optional[StepResult] = None
    skipped: str = ""  # why this target was not compared
    python: str = ""
    packages: dict[str, str] = field(default_factory=dict)
    env: dict[str, Optional[str]] = field(default_factory=dict)
    where: str = ""  # image tag or env prefix
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return {"target": self.target, "skipped": self.skipped, "python": self.python, "packages": self.packages,
                "env": self.env, "where": self.where, "seconds": round(self.seconds, 3),
                "build": self.build.to_dict() if self.build else None}


@dataclass
class Difference:
    kind: str  # python | package | env
    name: str
    values: dict[str, Optional[str]]  # target -> value (None: absent)

    def line(self) -> str:
        vals = ", ".join(f"{t} {v if v is not None else '-'}" for t, v in self.values.items())
        return f"{self.kind} {self.name}: {vals}"


# --- building -------------------------------------------------------------------


def run_probe(argv: list[str], stdin: Optional[str] = None, timeout: float = PROBE_TIMEOUT_S,
           env: Optional[dict] = None) -> tuple[Optional[int], str]:
    ran = run(argv, stdin=stdin, timeout=timeout, env=env)
    return ran.returncode, ran.text


def parse_probe(target: str, rc: Optional[int], out: str, facts: TargetFacts) -> Optional[str]:
    line = next((ln for ln in out.splitlines() if ln.startswith("ENVPORT-PARITY ")), None)
    if line is None:
        tail = " | ".join(out.strip().splitlines()[-3:])
        return f"probe in {target} exited {rc}: {tail or 'no output'}"
    data = json.loads(line[len("ENVPORT-PARITY "):])
    if data.get("freeze_rc"):
        return f"pip freeze in {target} exited {data['freeze_rc']}: {data.get('freeze_err', '').strip()[-300:]}"
    facts.python = data["python"]
    facts.packages = parse_freeze(data["freeze"], data.get("versions"))
    facts.env = data["env"]
    return None


def same_machine(host) -> bool:
    """True when the SSH host is this machine (same machine-id and hostname), e.g. the test sshd."""

    rc, out = run_probe(ssh_argv(host) + ["cat /etc/machine-id 2>/dev/null; hostname"], timeout=15)
    if rc != 0:
        return False
    try:
        local_id = Path("/etc/machine-id").read_text().strip()
    except OSError:
        local_id = ""
    lines = out.strip().splitlines()
    return lines[-1:] == [socket.gethostname()] and (not local_id or local_id in lines)


def compared(facts: list[TargetFacts]) -> list[TargetFacts]:
    return [f for f in facts if not f.skipped and f.build is not None and f.build.verdict.ok]


def differences(loaded: Loaded, facts: list[TargetFacts]) -> list[Difference]:
    """Every way the compared targets disagree: python (at the spec's precision), packages, env vars."""
    ok = compared(facts)
    diffs: list[Difference] = []
    if len(ok) < 2:
        return diffs
    pys = {f.target: python_precision(loaded.spec.python, f.python) for f in ok}
    if len(set(pys.values())) > 1:
        diffs.append(Difference("python", loaded.spec.python, {f.target: f.python for f in ok}))
    for name in sorted(set().union(*(f.packages for f in ok))):
        vals = {f.target: f.packages.get(name) for f in ok}
        if len(set(vals.values())) > 1:
            diffs.append(Difference("package", name, vals))
    for name in sorted(set().union(*(f.env for f in ok))):
        vals = {f.target: f.env.get(name) for f in ok}
        if len(set(vals.values())) > 1:
            diffs.append(Difference("env", name, vals))
    # Agreeing with each other is not enough when the spec has a lock: each must BE the lock.
    want = locked_packages(loaded)
    if want is not None:
        for name in sorted(set(want).union(*(f.packages for f in ok))):
            vals = {f.target: f.packages.get(name) for f in ok}
            if any(v != want.get(name) for v in vals.values()):
                diffs.append(Difference("lock", name, {"lock": want.get(name), **vals}))
    return diffs


def locked_packages(loaded: Loaded) -> Optional[dict[str, str]]:
    """{name: version} the spec's lock promises after every pass (None: no lock that fits the spec)."""
    from envport.plan.lock import current

    lock = current(loaded)
    if lock is None:
        return None
    return {n: d.version for n, d in lock.final().items() if n not in EXCLUDED_PACKAGES}


def table(loaded: Loaded, facts: list[TargetFacts], diffs: list[Difference], width: int = 24) -> list[str]:
    """The side-by-side table: one column per compared target, `!=` on each row that differs."""
    ok = compared(facts)
    if not ok:
        return []
    cols = [f.target for f in ok]
    diff_keys = {(d.kind, d.name) for d in diffs}
    values = [f.python for f in ok] + [v for f in ok for v in f.packages.values()] + \
             [v or "-" for f in ok for v in f.env.values()]
    w = min(max([len(c) for c in cols] + [len(v) for v in values] + [12]), width)

    def cell(v: Optional[str]) -> str:
        s = "-" if v is None else str(v)
        return s if len(s) <= w else s[: w - 1] + "~"

    lines = [f"   {'':<28} " + " ".join(f"{c:<{w}}" for c in cols)]

    def row(kind: str, name: str, label: str, vals: list[Optional[str]]) -> None:
        mark = "!=" if (kind, name) in diff_keys else "  "
        lines.append(f"{mark} {label:<28} " + " ".join(f"{cell(v):<{w}}" for v in vals))

    row("python", loaded.spec.python, f"python ({loaded.spec.python})", [f.python for f in ok])
    for name in sorted(set().union(*(f.packages for f in ok))):
        row("package", name, name, [f.packages.get(name) for f in ok])
    for name in sorted(set().union(*(f.env for f in ok))):
        row("env", name, f"${name}", [f.env.get(name) for f in ok])
    return lines


def judge(loaded: Loaded, facts: list[TargetFacts], diffs: list[Difference], seconds: float) -> StepResult:
    """The comparison's verdict: FAILED when a target broke or differs, REFUSED with fewer than two to compare."""
    ok_targets = compared(facts)
    broken = [f for f in facts if not f.skipped and (f.build is None or not f.build.verdict.ok)]
    if broken:
        line = "could not build or probe: " + ", ".join(f"{f.target} ({f.build.detail if f.build else '?'})"
                                                          for f in broken)
        return StepResult("parity", Verdict.FAILED, line, seconds=seconds)
    if len(ok_targets) < 2:
        line = (f"fewer than two targets could run here ({', '.join(f.target for f in ok_targets) or 'none'}); "
                "nothing to compare")
        return StepResult("parity", Verdict.REFUSED, line, reason="too_few_targets", seconds=seconds)
    if diffs:
        line = f"{len(diffs)} difference(s): " + "; ".join(d.line() for d in diffs[:5]) + \
               (f" (+{len(diffs) - 5} more)" if len(diffs) > 5 else "")
        return StepResult("parity", Verdict.FAILED, line, seconds=seconds)
    n_pkgs = len(ok_targets[0].packages)
    line = (f"{len(ok_targets)} targets agree ({', '.join(f.target for f in ok_targets)}): python "
            f"{loaded.spec.python}, {n_pkgs} packages, {len(ok_targets[0].env)} env vars"
            f"{', every freeze equal to the lock' if locked_packages(loaded) is not None else ''}")
    return StepResult("parity", Verdict.OK, line, seconds=seconds)

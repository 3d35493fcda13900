"""SSH: the one argv builder and the one "unreachable" classifier every SSH user shares.

A site host (`sites/<site>.yaml` hosts:) or a plain destination (an alias,
user@host, ssh://user@host:port) becomes `ssh -o BatchMode=yes …`; the ssh
client's own failures (exit 255 with one of its connection messages) mean
"cannot get there", never "the env is broken", and are REFUSED
`ssh_unreachable` with the fix.
"""

from __future__ import annotations

import shlex
from typing import Optional

from envport.core.errors import EnvportError
from envport.core.proc import run
from envport.core.verdict import EXIT_REFUSED, StepResult, Verdict

# The ssh client's own failures (exit 255) that mean "cannot get there".
UNREACHABLE_MARKERS = ("Connection refused", "Connection timed out", "No route to host",
                       "Could not resolve hostname", "Name or service not known", "Permission denied",
                       "Host key verification failed", "Connection closed", "Network is unreachable",
                       "Connection reset", "timed out")
UNREACHABLE_FIX = "fix: check the host and its sshd, and the site profile's ssh/ssh_config (sites/<site>.yaml hosts:)"


def resolve_host(site, host: Optional[str]):
    """`--host H`: a site host alias (a SshHost) or the destination string itself."""
    if host is None:
        return None
    return site.hosts.get(host, host) if site is not None else host


def host_label(host) -> str:
    return host.ssh if hasattr(host, "ssh") else str(host)


def ssh_argv(host, connect_timeout: Optional[int] = None) -> list[str]:
    """`ssh` with its options, `--`, then the destination; append the remote command.

    A destination starting with `-` is refused, not passed: after `--` ssh would take it as a host
    name, and before it as an option (`-oProxyCommand=...` runs a command here)."""
    dest = host_label(host)
    if dest.startswith("-") or not dest.strip():
        raise EnvportError(f"ssh destination {dest!r} {'starts with -' if dest else 'is empty'}: ssh would read "
                           "it as an option; name a Host alias or user@host (--host, or hosts: in the site "
                           "profile)", exit_code=EXIT_REFUSED)
    timeout = connect_timeout or getattr(host, "connect_timeout", None) or 5
    argv = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={timeout}"]
    if getattr(host, "ssh_config", None):
        argv += ["-F", str(host.ssh_config)]
    return argv + ["--", dest]


def is_unreachable(returncode: Optional[int], output: str) -> bool:
    return returncode == 255 and (not output.strip() or any(m in output for m in UNREACHABLE_MARKERS))


def unreachable(step: str, label: str, output: str, seconds: float = 0.0) -> StepResult:
    last = output.strip().splitlines()[-1] if output.strip() else "no answer"
    return StepResult(step, Verdict.REFUSED, f"cannot reach {label} over ssh: {last}", reason="ssh_unreachable",
                      lines=[UNREACHABLE_FIX], seconds=seconds)


def prefix_expr(env_name: str, prefix: Optional[str] = None, envs_dir: Optional[str] = None) -> str:
    """The env's remote prefix as a shell word: literal, or under $HOME like setup-venv.sh's default."""
    if prefix:
        return shlex.quote(prefix)
    if envs_dir and envs_dir.startswith("~/"):
        return '"$HOME"' + shlex.quote(f"/{envs_dir[2:].rstrip('/')}/{env_name}")
    if envs_dir:
        return shlex.quote(f"{envs_dir.rstrip('/')}/{env_name}")
    return '"$HOME"' + shlex.quote(f"/.envport/envs/{env_name}")


def probe_env(host, prefix_sh: str, connect_timeout: Optional[int] = None) -> tuple[Optional[int], str]:
    """(returncode, output) of one round trip: does the host answer, and does it hold the env?"""
    # `pwd -L`: a venv's name is a symlink to its current build (setup-venv.sh swaps it); report the name.
    check = f'P={prefix_sh}; if [ -x "$P/bin/python" ]; then echo "envport-ok $(cd "$P" && pwd -L)"; ' \
            f'else echo "envport-noenv $P"; fi'
    limit = (connect_timeout or getattr(host, "connect_timeout", 5) or 5) + 5
    proc = run(ssh_argv(host, connect_timeout) + [check], timeout=limit)
    if proc.timed_out:
        return None, f"no answer within {limit:.0f}s"
    if proc.returncode is None:
        return None, f"no ssh client on PATH ({proc.why})"
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def env_preflight(host, env_name: str, prefix_sh: str, *, label: Optional[str] = None,
                  connect_timeout: Optional[int] = None) -> tuple[Optional[StepResult], Optional[str]]:
    """(problem, resolved remote prefix): REFUSED when unreachable or the env is missing there."""
    label = label or host_label(host)
    try:
        rc, out = probe_env(host, prefix_sh, connect_timeout)
    except EnvportError as exc:  # a destination ssh would take as an option
        return StepResult("launcher", Verdict.REFUSED, str(exc), reason="ssh_bad_destination"), None
    last = out.splitlines()[-1] if out else ""
    if rc is None or rc == 255 or is_unreachable(rc, out):
        return unreachable("launcher", label, out), None
    if "envport-noenv" in out:
        where = last.split(" ", 1)[-1]
        return StepResult("launcher", Verdict.REFUSED, f"no env at {label}:{where}", reason="env_missing",
                          lines=[f"fix: envport build {env_name} --target venv --host {label}"]), None
    if rc != 0 or "envport-ok" not in out:
        return StepResult("launcher", Verdict.FAILED, f"ssh {label} exited {rc}", lines=out.splitlines()[-10:]), None
    return None, last.split(" ", 1)[-1]

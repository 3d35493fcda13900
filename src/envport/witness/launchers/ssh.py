"""Run witnesses in a venv/conda env on a site host, over SSH.

The env lives on the remote host (built there by `envport build NAME --target
venv --host H`), so its interpreter and `.envport/env.sh` are remote paths.
This launcher wraps a LocalLauncher aimed at those remote paths and sends the
whole thing as one `ssh HOST bash -c SCRIPT`:

- the witness scripts travel inside the command (a base64 tar, ~15 kB) and are
  unpacked into a fresh `mktemp -d` that an EXIT trap removes, so nothing of
  envport stays on the host;
- the env's `.envport/env.sh` is sourced first (the spec's env vars and the
  hash, exactly what activating the env does), then its bin/ goes first on PATH;
- the witness runs under `setsid` with its pid written next to the scripts, so
  a deadline or Ctrl-C here can kill the remote process group by that pid
  (killing the ssh client alone leaves remote processes running: no tty, no
  SIGHUP);
- the weights folders (`weight_env`, under `~/.envport/weights` there) are
  bound read-only with bubblewrap where `bwrap --dev-bind / / true` works on
  the host (local.read_only_argv); elsewhere the witness runs as it is and is
  told why they stay writable.

An unreachable host is REFUSED by `preflight` within the connect timeout.
"""

from __future__ import annotations

import base64
import functools
import io
import os
import shlex
import tarfile
import uuid
from pathlib import Path
from typing import Mapping, Optional, Sequence

from envport.core.verdict import StepResult
from envport.engines.ssh import env_preflight, prefix_expr, resolve_host, ssh_argv
from envport.witness.launchers.base import WITNESS_DIR, Invocation, Launcher
from envport.witness.launchers.local import BWRAP_FIX, WRITABLE_ENV, LocalLauncher, read_only_argv

# Placeholders the remote script defines: the env prefix, the scripts' temp dir, the host's weights root.
_P, _D, _W = "$P", "$D", "$W"


@functools.lru_cache(maxsize=4)
def witness_payload(witness_dir: str) -> str:
    """The witness folder's *.py as a base64 tar.gz (deterministic: sorted, no mtimes)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for path in sorted(Path(witness_dir).glob("*.py")):
            data = path.read_bytes()
            info = tarfile.TarInfo(path.name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return base64.b64encode(buf.getvalue()).decode("ascii")


def remote_word(word: str) -> str:
    """Quote one argv word for the remote shell, expanding only a leading $P/, $D/ or $W/."""
    for var in (_P, _D, _W):
        if word == var:
            return f'"{var}"'
        if word.startswith(var + "/"):
            return f'"{var}"' + shlex.quote(word[len(var):])
    return shlex.quote(word)


class SshLauncher(Launcher):
    """A LocalLauncher on a remote host: its interpreter and witness folder are remote paths."""

    name = "ssh"
    spawns_ranks = True

    def __init__(self, host, env_name: str, *, prefix: Optional[str] = None, envs_dir: Optional[str] = None,
                 witness_dir: Path = WITNESS_DIR, connect_timeout: Optional[int] = None,
                 host_label: Optional[str] = None, weight_env: Optional[Mapping[str, str]] = None):
        self.host = host
        self.host_label = host_label or (host.ssh if hasattr(host, "ssh") else str(host))
        self.env_name = env_name
        # envs_dir None: this process's ENVPORT_ENVS_DIR, which `envport build --host` forwards too.
        envs_dir = envs_dir if envs_dir is not None else os.environ.get("ENVPORT_ENVS_DIR")
        self.prefix_sh = prefix_expr(env_name, prefix, envs_dir)
        self.witness_dir = Path(witness_dir)
        self.connect_timeout = connect_timeout
        # The wrapped launcher: the env's python and the unpacked scripts, both on the remote host.
        self.inner = LocalLauncher(f"{_P}/bin/python", witness_dir=Path(_D), base_env={})
        # VAR -> folder under the host's weights root (`envport weights stage --host` copies them there).
        self.weight_env = dict(weight_env or {})

    def witness_path(self, script: str) -> str:
        return self.inner.witness_path(script)

    def ssh_argv(self, remote_script: str) -> list[str]:
        # The remote login shell parses the command line: hand it one quoted `bash -c`.
        return ssh_argv(self.host, self.connect_timeout) + [f"bash -c {shlex.quote(remote_script)}"]

    def _tmp_glob(self, token: str) -> str:
        return f'"${{TMPDIR:-/tmp}}"/envport-witness-{token}.*'

    def remote_script(self, script: str, args: Sequence[str], env: Mapping[str, str], token: str) -> str:
        inv = self.inner.invocation(script, args, env)
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted((inv.env or {}).items()))
        command = " ".join(remote_word(w) for w in inv.argv)
        lines = [
            f"P={self.prefix_sh}",
            'if [ ! -x "$P/bin/python" ]; then echo "envport-ssh: no env at $P (no bin/python); '
            'build it: envport build NAME --target venv --host HOST" >&2; exit 3; fi',
            f'D=$(mktemp -d "${{TMPDIR:-/tmp}}/envport-witness-{token}.XXXXXX") || exit 1',
            "trap 'rm -rf \"$D\"' EXIT",
            f"printf %s {witness_payload(str(self.witness_dir))} | base64 -d | tar -xzf - -C \"$D\" || exit 1",
            # What activating the env does: its env block (spec env + hash), then its bin/ first.
            'if [ -f "$P/.envport/env.sh" ]; then . "$P/.envport/env.sh"; fi',
            'export VIRTUAL_ENV="$P" PATH="$P/bin:$PATH"',
        ]
        lines.append('W="$HOME/.envport/weights"')
        for var, rel in sorted(self.weight_env.items()):
            lines.append(f'export {var}="$W"/{shlex.quote(rel)}')
        if exports:
            lines.append(f"export {exports}")
        if self.weight_env:
            dirs = [f"{_W}/{rel}" for rel in sorted(set(self.weight_env.values()))]
            bound = " ".join(remote_word(w) for w in read_only_argv(dirs, inv.argv))
            lines += [
                "why=",
                f'if ! command -v bwrap >/dev/null 2>&1; then why="no bwrap on $(uname -n) ({BWRAP_FIX})"',
                'elif ! said="$(bwrap --dev-bind / / true 2>&1)"; then why="bwrap does not work on $(uname -n): '
                '$(printf "%s\\n" "$said" | tail -n 1) (unprivileged user namespaces off?)"',
                "fi",
                f'if [ -z "$why" ]; then setsid {bound} &',
                f'else export {WRITABLE_ENV}="$why"; setsid {command} &',
                "fi",
            ]
        else:
            lines.append(f"setsid {command} &")
        lines += [
            'echo "$!" > "$D/pid"',
            'wait "$!"',
        ]
        return "\n".join(lines) + "\n"

    def invocation(self, script: str, args: Sequence[str], env: Mapping[str, str]) -> Invocation:
        token = uuid.uuid4().hex[:12]
        argv = self.ssh_argv(self.remote_script(script, args, env, token))
        # After a deadline or Ctrl-C: end the remote group (TERM lets dist.py dump stacks), then the files.
        glob = self._tmp_glob(token)
        kill = (f"for f in {glob}/pid; do [ -f \"$f\" ] || continue; pid=$(cat \"$f\"); "
                f"kill -TERM -- -\"$pid\" 2>/dev/null; sleep 2; kill -KILL -- -\"$pid\" 2>/dev/null; done; "
                f"rm -rf {glob}")
        cleanup = [ssh_argv(self.host, self.connect_timeout) + [f"bash -c {shlex.quote(kill)}"]]
        return Invocation(argv, env=None, cleanup=cleanup, label=f"{self.host_label}:{token}")

    def preflight(self) -> Optional[StepResult]:
        problem, _ = env_preflight(self.host, self.env_name, self.prefix_sh, label=self.host_label,
                                   connect_timeout=self.connect_timeout)
        return problem

    def describe(self) -> str:
        return f"ssh {self.host_label} {self.prefix_sh.replace(chr(34), '')}/bin/python"


def launcher_for_host(site, host: str, env_name: str, **kwargs) -> SshLauncher:
    """An SshLauncher for `--host H`: a site host alias (sites/<site>.yaml hosts:) or an ssh destination."""
    target = resolve_host(site, host)
    return SshLauncher(target, env_name, host_label=host, **kwargs)

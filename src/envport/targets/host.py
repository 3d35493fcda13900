"""What the host targets (venv, conda) share: the rendered setup script run here or on an SSH host (--host)."""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import ClassVar

from envport.targets import needs
from envport.targets.base import BuildRequest, Need, NeedsRequest, Target, VerifyRequest


class HostTarget(Target):
    recipe = "shell"
    hosts = True
    replaces_in_place = True
    # The probe's clean environment (a fresh login): the caller's VIRTUAL_ENV or PYTHONPATH must not leak in.
    probe_env_keys: ClassVar[tuple[str, ...]] = ("PATH", "HOME", "LANG", "TMPDIR")

    def needs(self, req: NeedsRequest) -> list[Need]:
        from envport.builders.preflight import check_compiler, check_runtime

        if req.host is not None:
            return [needs.ssh_need(req)]
        ctx = needs.preflight_context(req, self)
        have = self.runtime_what(req.loaded.spec)
        return [*(needs.findings(have, check_runtime, ctx) or [Need(have, True, "on PATH")]),
                *needs.findings("C compiler", check_compiler, ctx)]

    def runtime_what(self, spec) -> str:
        raise NotImplementedError

    def build(self, req: BuildRequest):
        from envport.builders import shell

        return shell.build(req.loaded, req.site, req.root, flavour=self.name, host=req.host, rebuild=req.rebuild,
                           check=req.check, install_system_pkgs=req.install_system_pkgs, progress=req.progress)

    def present(self, req: BuildRequest):
        from envport.builders import shell

        return shell.build(req.loaded, req.site, req.root, flavour=self.name, host=req.host, check=True,
                           progress=req.progress)[-1]

    def built_dists(self, result):
        from envport.renderers import envcheck

        prefix = result.data.get("prefix")
        if not prefix or result.data.get("ssh_host"):
            return None  # on another host: the lock, when there is one, says what it holds
        try:
            text = (Path(prefix) / ".envport" / "dists").read_text(encoding="utf-8")
        except OSError:
            return None
        return envcheck.load(text)

    def verify(self, req: VerifyRequest):
        from envport.verify.backends import verify_env

        return verify_env(req.loaded, req.site, req.root, host=req.host, junit=req.junit, flavour=self.name,
                          progress=req.progress)

    def probe_script(self, prefix: str) -> str:
        """Bash that enters the env at PREFIX the way a user does and runs the probe on stdin."""
        raise NotImplementedError

    def probe(self, run, where, names, site=None, host=None):
        script = self.probe_script(shlex.quote(where))
        if host is None:
            env = {k: os.environ[k] for k in self.probe_env_keys if k in os.environ}
            return run(["bash", "-c", script, "envport-parity", *names], env=env)
        from envport.engines.ssh import resolve_host, ssh_argv

        remote = f"bash -c {shlex.quote(script)} envport-parity {' '.join(shlex.quote(n) for n in names)}"
        return run(ssh_argv(resolve_host(site, host)) + [remote])

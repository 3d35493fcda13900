"""Verify a venv/conda env built by the shell target: here (testinfra `local://`) or on an SSH site host
(`ssh://HOST` with the site's ssh_config).

The same spec checks and pytest plugin as the docker backend (verify/docker.py),
with what differs for an env that lives in a folder on a host:

- the interpreter and pip are `<prefix>/bin/python`, `<prefix>/bin/pip`;
- the env vars are what the env's `.envport/env.sh` exports (what activating it
  does), not the login shell's;
- shim files sit under `$ENVPORT_ROOT` (default `<prefix>/root`, see
  setup-venv.sh) and weights under the weights root (`<root>/<env>/<weight>`,
  envport.builders.weights), so their paths are rebased there, and each weight's
  variable is expected to point at its folder, as the launchers set it;
- the hash is the one the setup script wrote to `<prefix>/.envport/hash`
  (there is no image label), checked against the spec's content hash.

An unreachable host is REFUSED (`ssh_unreachable`) by one ssh round trip with
the site's connect timeout, before pytest starts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import shlex
import tempfile
import time
from functools import cached_property
from pathlib import Path
from typing import Optional

from envport.builders import weights
from envport.core import layout
from envport.engines.ssh import env_preflight, prefix_expr, resolve_host, ssh_argv
from envport.recipe.identity import identify
from envport.spec.loader import Loaded
from envport.core.progress import Progress
from envport.core.verdict import StepResult, Verdict
from envport.verify.checks import CheckFailed, Facts, parse_env0, shell_path, spec_checks
from envport.verify.docker import default_junit, pytest_args
from envport.verify.plugin import VerifyPlugin
from envport.core.files import shown_path
from envport.verify.report import outcome, progress_line

TARGET = "venv"


class EnvFacts(Facts):
    """Facts of a folder env: env vars come from sourcing its env block, not from the login shell,
    with each weight's variable pointed at its folder as the launchers do (a bare host has no mount)."""

    weight_env: dict = {}

    @cached_property
    def env(self) -> dict[bytes, bytes]:
        p = shlex.quote(self.venv)
        exports = "".join(f" && export {k}={shell_path(v)}" for k, v in sorted(self.weight_env.items()))
        script = '. "$1/.envport/env.sh"' + exports + " && env -0"
        out = self._run(f"bash -c {shlex.quote(script)} envport-verify {p}")
        if out.rc != 0:
            raise CheckFailed(f"sourcing {self.venv}/.envport/env.sh failed: {out.stderr.strip()[-300:]}")
        return parse_env0(out.stdout_bytes)


def rebase(checks, root: str, weights_at: Optional[dict] = None, weight_env: Optional[dict] = None):
    """Shim files live under ENVPORT_ROOT in a folder env, weights under the weights root (no mount on a
    bare host: `weights_at` maps each spec path to its folder, `weight_env` each variable); ids stay the spec's."""
    weights_at, weight_env = weights_at or {}, weight_env or {}

    def one(c):
        if c.kind == "file":
            return dataclasses.replace(c, key=root.rstrip("/") + c.key)
        if c.kind in ("weight", "weight-dir"):
            for spec_path, host in weights_at.items():
                if c.key == spec_path or c.key.startswith(spec_path + "/"):
                    return dataclasses.replace(c, key=host + c.key[len(spec_path):])
        if c.kind == "env" and c.key in weight_env:
            return dataclasses.replace(c, expected=weight_env[c.key])
        return c
    return [one(c) for c in checks]


def _testinfra_target(ssh_host) -> tuple[str, dict, list[str]]:
    """(url, get_host kwargs, pytest args) for a site SshHost or a plain destination."""
    dest = ssh_host.ssh if hasattr(ssh_host, "ssh") else str(ssh_host)
    url = dest if dest.startswith("ssh://") else f"ssh://{dest}"
    kwargs: dict = {"timeout": getattr(ssh_host, "connect_timeout", 5) or 5}
    args = [f"--hosts={url}"]
    cfg = getattr(ssh_host, "ssh_config", None)
    if cfg:
        kwargs["ssh_config"] = str(cfg)
        args.append(f"--ssh-config={cfg}")  # testinfra drops --ssh-extra-args: the config carries the rest
    return url, kwargs, args


def _close_master(ssh_host, controlpath: str) -> None:
    """End the ssh control master testinfra started (it would linger for ControlPersist seconds)."""
    from envport.core.proc import run

    argv = ssh_argv(ssh_host)
    argv[1:1] = ["-o", f"ControlPath={controlpath}", "-O", "exit"]
    run(argv, timeout=15)  # best effort: Ran carries a failure, never raises it


def verify_env(loaded: Loaded, site, root: Path, *, host: Optional[str] = None, prefix: Optional[str] = None,
               envs_dir: Optional[str] = None, junit: Optional[Path] = None, flavour: str = "venv",
               progress: Progress) -> StepResult:
    """Run the spec's checks (and tests/images/) against the env here or on `host`; one StepResult."""
    import pytest
    import testinfra

    start = time.monotonic()
    spec = loaded.spec
    hash_ = identify(loaded, site).hash
    where = f" on {host}" if host else ""
    step = f"verify {spec.name}@{hash_[:12]} ({flavour}{where})"

    if host:
        ssh_host = resolve_host(site, host)
        prefix_sh = prefix_expr(spec.name, prefix, envs_dir or os.environ.get(layout.ENVS_DIR_VAR))
        problem, env_prefix = env_preflight(ssh_host, spec.name, prefix_sh, label=host)
        if problem is not None:
            return dataclasses.replace(problem, step=step, seconds=time.monotonic() - start)
        url, kwargs, host_args = _testinfra_target(ssh_host)
    else:
        env_prefix = prefix or str(layout.env_prefix(spec.name, envs_dir))
        if not os.access(Path(env_prefix) / "bin" / "python", os.X_OK):
            return StepResult(step, Verdict.REFUSED, f"no env at {env_prefix}", reason="env_missing",
                              lines=[f"fix: envport build {spec.name} --target {flavour}"],
                              seconds=time.monotonic() - start)
        url, kwargs, host_args = "local://", {}, ["--hosts=local://"]

    control: dict = {}  # set inside the temp dir below: one ssh master for every check (~0.6 s per connection)

    def make_facts() -> Facts:
        h = testinfra.get_host(url, **kwargs, **control)
        got = h.run(f"cat {shlex.quote(env_prefix + '/.envport/hash')}")
        labels = {"envport.hash": got.stdout.strip()} if got.rc == 0 else {}
        facts = EnvFacts(h, labels=labels, venv=env_prefix)
        facts.weight_env = weight_env
        return facts

    # The weights root: this host's, or `~/.envport/weights` on an SSH host (`envport weights stage`).
    wroot = "~/.envport/weights" if host else str(weights.weights_root())
    weights_at = {w.path: f"{wroot}/{spec.name}/{n}" for n, w in spec.weight_dirs.items()}
    weight_env = {w.env: weights_at[w.path] for w in spec.weight_dirs.values() if w.env}
    checks = rebase(spec_checks(loaded, hash_), f"{env_prefix}/root", weights_at, weight_env)
    junit = Path(junit) if junit else default_junit(root, spec.name)
    junit.parent.mkdir(parents=True, exist_ok=True)

    say = progress_line(progress)

    plugin = VerifyPlugin(spec=spec, spec_path=loaded.path, checks=checks, make_facts=make_facts, on_result=say)
    out = io.StringIO()
    progress(f"envport: [verify] {flavour} at {url if host else ''}{env_prefix}")
    with tempfile.TemporaryDirectory(prefix="envport-verify-") as tmp:
        if host:
            control["controlpath"] = f"{tmp}/cm"
        try:
            with contextlib.redirect_stdout(out):
                code = pytest.main(pytest_args(root, loaded.path, host_args, junit, Path(tmp)), plugins=[plugin])
        finally:
            if host and os.path.exists(control["controlpath"]):
                _close_master(ssh_host, control["controlpath"])
    seconds = time.monotonic() - start
    results = plugin.results
    verdict, lines, summary = outcome(code, results, out.getvalue())
    junit_shown = shown_path(junit, root)
    data = {"prefix": env_prefix, "junit": junit_shown, "checks": results, **({"ssh_host": host} if host else {})}
    return StepResult(step, verdict, f"{summary}; junit {junit_shown}", lines=lines, seconds=seconds, data=data)

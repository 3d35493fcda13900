"""venv: the rendered setup-venv.sh run here, or on an SSH host (--host): a venv under ~/.envport/envs/<name>."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from envport.targets.base import WitnessRequest
from envport.targets.host import HostTarget


class Venv(HostTarget):
    name = "venv"
    summary = ("a venv under ~/.envport/envs/<name> (or $ENVPORT_ENVS_DIR) from images/<name>/setup-venv.sh, "
               "here or on an SSH host (--host)")
    ssh_row = "ssh"

    def runtime_what(self, spec) -> str:
        return f"python{spec.python}"

    def env_disk(self, spec, project_root):
        from envport.core.layout import env_prefix

        return env_prefix(spec.name).parent

    def runtime_findings(self, ctx) -> list:
        from envport.builders.preflight import Finding

        if ctx.host:
            return []  # the remote setup script refuses with its own reason (no_python)
        py = f"python{ctx.spec.python}"
        if shutil.which(py) is None:
            return [Finding("runtime_missing", f"{py} is not on PATH (the venv target makes the env with it)",
                            f"install it (Debian: apt-get install {py}-venv), or use --target docker")]
        from envport.spec.venv_needs import host_venv_missing

        why = host_venv_missing(ctx.spec.python)
        return [Finding("runtime_missing", why, f"install {py}-venv (Debian/Ubuntu: apt-get install {py}-venv), "
                        "or use --target docker")] if why else []

    def probe_script(self, prefix: str) -> str:
        # Activates the venv the way a user does (bin/activate sources .envport/env.sh).
        return f"P={prefix}; . \"$P/bin/activate\" && exec python - \"$@\""

    def weights_interpreter(self, name, host):
        from envport.core.layout import env_prefix

        bin_dir = env_prefix(name) / "bin"
        return bin_dir if host is None and (bin_dir / "python").exists() else None

    def slurm_wrap(self, req):
        from envport.witness import slurm_job

        return {"prefix": req.prefix or slurm_job.default_prefix(req.loaded.spec.name, req.profile)}

    def launcher(self, req: WitnessRequest):
        from envport.builders import weights

        spec = req.loaded.spec
        if req.host:
            from envport.witness.launchers.ssh import launcher_for_host

            launcher = launcher_for_host(req.site, req.host, spec.name,
                                         prefix=req.python and str(Path(req.python).parent.parent),
                                         weight_env=weights.remote_env(spec))
            return launcher, {"ssh_host": req.host}
        from envport.core.layout import env_prefix
        from envport.witness.launchers.local import LocalLauncher, activated_env

        python = Path(req.python).expanduser() if req.python else env_prefix(spec.name) / "bin" / "python"
        # What activating the env would do (CLI checks run `python`, `tool --help`);
        # an interpreter outside an envport env still gets the spec's env vars.
        env = activated_env(python.parent.parent, os.environ)
        if not (python.parent.parent / ".envport" / "env.sh").is_file():
            env.update(spec.env)
        # Each weight's variable points at its folder under the weights root, bound read-only where bwrap works.
        env.update(weights.runtime_env(spec, weights.weights_root()))
        launcher = LocalLauncher(python, base_env=env,
                                 missing_fix=f"envport build {spec.name} --target venv, or pass --python PATH",
                                 read_only=[h for h, _ in weights.existing_mounts(spec, weights.weights_root())])
        return launcher, {"prefix": str(python.parent.parent)}


TARGET = Venv()

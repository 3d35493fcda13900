"""venv: the rendered setup-venv.sh run here, or on an SSH host (--host): a venv under ~/.envport/envs/<name>."""

from __future__ import annotations

import os
import re
import shlex
import shutil
from pathlib import Path

from envport.targets.base import PUSH, Artefact, GcRequest, WitnessRequest
from envport.targets.host import HostTarget


class Venv(HostTarget):
    name = "venv"
    summary = ("a venv under ~/.envport/envs/<name> (or $ENVPORT_ENVS_DIR) from images/<name>/setup-venv.sh, "
               "here or on an SSH host (--host)")
    unsupported = {
        PUSH: "a venv is a folder of this host, not an image or SIF a registry holds (push --target docker, "
              "podman or apptainer)",
    }
    ssh_row = "ssh"

    def runtime_what(self, spec) -> str:
        return f"python{spec.python}"

    def env_disk(self, spec, project_root):
        from envport.core.layout import env_prefix

        return env_prefix(spec.name).parent

    def runtime_findings(self, ctx) -> list:
        from envport.core.finding import Finding

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

    def sbom(self, req):
        from envport.targets.sbom import from_venv

        return from_venv(req.loaded, req.identity, req.lock, req.fmt)

    def slurm_wrap(self, req):
        from envport.witness import slurm_job

        return {"prefix": req.prefix or slurm_job.default_prefix(req.loaded.spec.name, req.profile)}

    def slurm_task(self, job):
        from envport.builders import weights
        from envport.witness.launchers.local import LocalLauncher
        from envport.witness.launchers.srun import venv_prelude
        from envport.witness.slurm_job import TaskEnv

        # Each weight's variable at its folder under the weights root, which the nodes share with this host
        # (the docs level's commands read them, as the CLI witnesses' do on a venv here).
        found = weights.runtime_env(job.loaded.spec)
        exports = [f"export {k}={shlex.quote(v)}" for k, v in sorted(found.items())]
        return TaskEnv(LocalLauncher(f"{job.prefix}/bin/python", witness_dir=job.witness_dir, base_env={}),
                       prelude=tuple(venv_prelude(job.prefix)) + tuple(exports))

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
        env.update(weights.runtime_env(spec))
        launcher = LocalLauncher(python, base_env=env,
                                 missing_fix=f"envport build {spec.name} --target venv, or pass --python PATH",
                                 read_only=[h for h, _ in weights.existing_mounts(spec)])
        return launcher, {"prefix": str(python.parent.parent)}


    def artefacts(self, req: GcRequest):
        """This host's env (the link `<envs>/<name>` and the build it names) and every other build under
        `<envs>/.<name>.builds` (killed, or replaced and not yet cleared by the next build)."""
        from envport.core.layout import env_prefix
        from envport.core.files import tree_bytes

        prefix = env_prefix(req.name)
        builds = prefix.parent / f".{req.name}.builds"
        lock = prefix.parent / f".{req.name}.lock"
        out, current = [], None
        if prefix.is_symlink():
            target = os.readlink(prefix)
            if os.path.realpath(os.path.dirname(os.path.join(prefix.parent, target))) != os.path.realpath(builds):
                out.append(Artefact(self.name, req.name, "", str(prefix), 0, 0.0,
                                    foreign=f"a link to {target}, outside envport's {builds}"))
            else:
                current = os.path.basename(target)
        elif prefix.exists():
            out.append(Artefact(self.name, req.name, "", str(prefix), 0, 0.0,
                                foreign="a folder, not the link envport's setup script makes"))
        try:
            entries = sorted(os.scandir(builds), key=lambda e: e.name)
        except (FileNotFoundError, NotADirectoryError):
            entries = []
        if builds.is_symlink():
            entries = []  # a builds folder that is a link leads outside the envs dir: nothing in it is looked at
        busy = _locked_by_a_build(lock) if entries else ""
        for e in entries:
            m = BUILD_NAME.fullmatch(e.name)
            if m is None:
                continue
            is_dir = e.is_dir(follow_symlinks=False)
            st = e.stat(follow_symlinks=False)
            handle = {"path": e.path, "dir": is_dir, "lock": str(lock), "link": None}
            if e.name != current:
                out.append(Artefact(self.name, req.name, m.group(1) or "", e.path,
                                    tree_bytes(e.path) if is_dir else 0, st.st_mtime, handle=handle,
                                    unfinished=True, busy=busy))
                continue
            hash_file = os.path.join(e.path, ".envport", "hash")
            try:
                with open(hash_file, encoding="utf-8", errors="replace") as fh:
                    recorded = fh.read(200).strip()
            except OSError:
                recorded = ""
            foreign = "" if is_dir and recorded.startswith(m.group(1) or "-") else \
                f"the env's build {e.name} has no .envport/hash of {m.group(1)}: not a finished envport build"
            out.append(Artefact(self.name, req.name, m.group(1), str(prefix), tree_bytes(e.path),
                                os.lstat(hash_file).st_mtime if recorded else st.st_mtime,
                                handle={**handle, "link": str(prefix)}, foreign=foreign, busy=busy))
        return out

    def remove(self, art):
        import fcntl

        h = art.handle
        try:
            fd = os.open(h["lock"], os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except FileNotFoundError:
            return 0, "already gone"  # the envs dir itself
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return 0, f"a build of {art.name} holds {h['lock']} now"
            if h["link"] is not None:
                # The env goes first (one unlink: gone, never half there), then the build it named.
                if not os.path.islink(h["link"]) or os.path.basename(os.readlink(h["link"])) != \
                        os.path.basename(h["path"]):
                    return 0, f"{h['link']} changed since gc looked: left"
                os.unlink(h["link"])
            if h["dir"]:
                shutil.rmtree(h["path"])  # fd-based: a symlink inside is removed, never followed
            else:
                os.unlink(h["path"])
        except FileNotFoundError:
            return 0, "already gone"
        finally:
            os.close(fd)
        return art.bytes, ""


# What the setup script makes under <envs>/.<name>.builds: <hash12>-<pid> builds, a moved-aside old folder,
# the link it renames over the env.
BUILD_NAME = re.compile(r"([0-9a-f]{12})-[0-9]+|\.replaced-[0-9]+|\.link-[0-9]+")


def _locked_by_a_build(lock: Path) -> str:
    """Why the env's builds cannot be touched now (a build holds its lock), or ''."""
    import fcntl

    try:
        fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return ""
    except OSError as exc:
        return f"its lock {lock} cannot be opened ({exc.strerror})"
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return f"a build holds {lock} now"
    finally:
        os.close(fd)
    return ""

TARGET = Venv()

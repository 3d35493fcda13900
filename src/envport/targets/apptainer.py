"""apptainer: the rendered .def built into <sif_dir>/<name>-<hash12>.sif (apptainer, else envport's own .def builder)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from envport.targets import needs
from envport.targets.base import (PRESENT, Artefact, BuildRequest, GcRequest, Need, NeedsRequest, Target, VerifyRequest,
                                  WitnessRequest)


class Apptainer(Target):
    name = "apptainer"
    recipe = "apptainer"
    signs = True
    summary = ("<sif_dir>/<name>-<hash12>.sif from images/<name>/<name>.def: apptainer where installed, else "
               "envport's own .def builder; run with apptainer exec, else ch-run")
    unsupported = {
        PRESENT: "an apptainer build checks the SIF's recorded hash itself and reports present",
    }

    def env_disk(self, spec, project_root):
        return Path(project_root or Path.cwd()) / ".cache"

    def runtime_findings(self, ctx) -> list:
        from envport.core.finding import Finding

        if shutil.which("apptainer") or shutil.which("singularity"):
            return []
        missing = [b for b in ("mksquashfs", "docker") if shutil.which(b) is None]
        if missing:
            return [Finding("runtime_missing", f"no apptainer on PATH, and envport's own .def builder needs "
                            f"{' and '.join(missing)}", "install apptainer, or squashfs-tools and docker")]
        return []

    def needs(self, req: NeedsRequest) -> list[Need]:
        from envport.builders.apptainer.binary import apptainer_binary
        from envport.builders.apptainer.builder import builder_missing
        from envport.sif import run as sif_run
        from envport.targets.docker import TARGET as docker

        out = []
        binary = apptainer_binary()
        if binary and os.environ.get("ENVPORT_SIF_BUILDER") != "envport":
            out.append(Need("SIF builder", True, f"apptainer ({binary})"))
        else:
            missing = builder_missing()
            if missing:
                reason, detail, fix = missing
                out.append(Need("SIF builder", False, f"no apptainer, and {detail}", reason, fix))
            else:
                out.append(Need("SIF builder", True, "envport's .def builder (root, mksquashfs, bwrap)"))
        base = needs.base_of(req.loaded, req.site, self.name)
        if base.bootstrap in ("docker-daemon", "docker") and not (binary and base.bootstrap == "docker"):
            out.extend(needs.engine_need(req, docker, "answers (the base rootfs comes from it)"))
        out.append(needs.base_need(req.loaded, req.site, self.name, req.probes, local_images=True))
        kind = sif_run.runtime()
        absent = sif_run.missing_tools(kind)
        out.append(Need("SIF runtime", not absent, kind if not absent else f"{', '.join(absent)} not found "
                        "(verify and witness run inside the SIF with apptainer, else ch-run on squashfuse)",
                        "" if not absent else "missing_tool",
                        "" if not absent else "apt-get install charliecloud-runtime squashfuse fuse3, or install "
                        "apptainer"))
        return out

    def build(self, req: BuildRequest):
        from envport.builders.apptainer import builder
        from envport.builders.present_cache import remember

        results = builder.build(req.loaded, req.site, req.root, rebuild=req.rebuild, from_docker=req.from_docker,
                                progress=req.progress)
        if results[-1].verdict.ok and req.remember and results[-1].data.get("sif"):
            remember(req.root, req.loaded.spec.name, req.site_name, builder.TARGET, req.identity.hash,
                     os.path.abspath(results[-1].data["sif"]))  # the path as the full path prints it
        return results

    def verify(self, req: VerifyRequest):
        from envport.verify.sif import verify

        return verify(req.loaded, req.site, req.root, sif=req.sif, junit=req.junit, progress=req.progress,
                      identity=req.identity)

    def built_file(self, site, root, identity):
        from envport.builders.apptainer.builder import sif_path

        return sif_path(site, root, identity)

    def embedded(self, where, name, root):
        from envport.sif.embedded import embedded

        return embedded(Path(where), name, root)

    def difference(self, where, loaded, spec_hash):
        from envport.sif.embedded import difference

        return difference(Path(where), loaded, spec_hash)

    def launcher(self, req: WitnessRequest):
        from envport.builders import weights
        from envport.builders.apptainer.builder import sif_path
        from envport.witness.launchers.sif import SifLauncher

        spec = req.loaded.spec
        sif = Path(req.sif) if req.sif else sif_path(req.site, req.loaded.root, req.identity)
        launcher = SifLauncher(sif, python=req.python or "python3", gpus=req.gpus,
                               mounts=weights.existing_mounts(spec),
                               missing_fix="the file you named does not exist: check the path given to --sif"
                               if req.sif else f"envport build {spec.name} --target apptainer, or pass --sif FILE")
        return launcher, {"sif": str(sif)}

    def push(self, req):
        from envport.builders.apptainer.builder import sif_path
        from envport.targets.push import push_sif

        sif = req.sif or sif_path(req.site, req.root, req.identity)
        return push_sif(sif, req.ref, list(req.named), req.site.registry_ca, req.loaded.spec.name,
                        given=req.sif is not None)

    def sbom(self, req):
        from envport.builders.apptainer.builder import sif_path
        from envport.targets.sbom import from_built_sif

        return from_built_sif(req, sif_path(req.site, req.root, req.identity))

    def slurm_wrap(self, req):
        from envport.builders.apptainer.builder import sif_path

        return {"sif": str(Path(req.sif).resolve()) if req.sif else str(sif_path(req.site, req.loaded.root,
                                                                                  req.identity))}

    def slurm_task(self, job):
        from envport.builders import weights
        from envport.witness.launchers.sif import SifLauncher
        from envport.witness.slurm_job import TaskEnv, wants_gpus

        # The profile names the runtime its nodes have; where it is not apptainer, Charliecloud runs the SIF.
        runtime = "apptainer" if job.profile.container_runtime == "apptainer" else "ch-run"
        # The weights bound at their paths in the SIF, from the weights root the nodes share with this host.
        return TaskEnv(SifLauncher(Path(job.sif), python=job.python, witness_dir=job.witness_dir,
                                   gpus=wants_gpus(job.profile), runtime=runtime,
                                   mounts=weights.existing_mounts(job.loaded.spec)))

    def probe(self, run, where, names, site=None, host=None):
        """Inside the SIF: apptainer exec --cleanenv, else ch-run on the SIF mounted for the probe."""
        from envport.sif import run as sif_run
        from envport.sif.gate import gate

        gated = gate(Path(where))  # SifError, TrustRefused: the parity step says why
        if sif_run.runtime() == "apptainer":
            return run(sif_run.apptainer_argv(gated, ["python3", "-", *names]))
        missing = sif_run.missing_tools("ch-run")
        if missing:
            return None, f"{', '.join(missing)} not found: the SIF is probed with ch-run where apptainer is absent"
        with sif_run.mounted(gated) as mnt:
            return run(sif_run.ch_run_argv(str(mnt), ["python3", "-", *names]), env=sif_run.ch_run_env())

    def artefacts(self, req: GcRequest):
        """`<sif_dir>/<name>-<hash12>.sif` files: this user's, and envport's by this machine's build record
        or the SIF's own labels (a file in a shared sif_dir is another user's, or a copy: left)."""
        import re

        sif_dir = req.site.apptainer.sif_path(req.root)
        pattern = re.compile(re.escape(req.name) + r"-([0-9a-f]{12})\.sif")
        try:
            entries = sorted(os.scandir(sif_dir), key=lambda e: e.name)
        except (FileNotFoundError, NotADirectoryError):
            return []
        out = []
        for entry in entries:
            m = pattern.fullmatch(entry.name)
            if m is None:
                continue
            st = entry.stat(follow_symlinks=False)
            out.append(Artefact(self.name, req.name, m.group(1), entry.path, st.st_blocks * 512, st.st_mtime,
                                handle=entry.path, foreign=_not_envports(entry.path, st, req.name, m.group(1))))
        return out

    def remove(self, art):
        from envport.sif import record as sif_record

        try:
            os.unlink(art.handle)  # a name in sif_dir: never a link followed, never a folder
        except FileNotFoundError:
            return 0, "already gone"
        sif_record.forget(art.handle)
        return art.bytes, ""


def _not_envports(path: str, st: os.stat_result, name: str, hash12: str) -> str:
    """'' when PATH is a SIF envport built of NAME@HASH12 for this user, else why it is not."""
    import stat

    from envport.sif import record as sif_record

    if not stat.S_ISREG(st.st_mode):
        return "not a regular file (a link or a folder named like a SIF)"
    if st.st_uid != os.getuid():
        return f"owned by uid {st.st_uid}, not this user: another user's SIF in a shared sif_dir"
    rec = sif_record.read(path)
    if rec is not None and rec["hash"].startswith(hash12):
        return ""
    from envport.sif.format import SifError, read_sif, sif_labels

    try:
        labels = sif_labels(read_sif(path))
    except SifError as exc:
        return f"not a SIF envport can read ({exc.reason})"
    except OSError as exc:
        return f"unreadable ({exc.strerror})"
    if labels.get("envport.name") != name or not labels.get("envport.hash", "").startswith(hash12):
        return (f"its labels say envport.name={labels.get('envport.name', '(none)')}, envport.hash="
                f"{labels.get('envport.hash', '(none)')[:12]}: no envport build of {name}@{hash12}")
    return ""

TARGET = Apptainer()

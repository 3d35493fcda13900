"""apptainer: the rendered .def built into <sif_dir>/<name>-<hash12>.sif (apptainer, else envport's own .def builder)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from envport.targets import needs
from envport.targets.base import PRESENT, BuildRequest, Need, NeedsRequest, Target, VerifyRequest, WitnessRequest


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
        from envport.builders.preflight import Finding

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
        from envport.engines import sif_run
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

    def embedded(self, where, name, root):
        from envport.builders.apptainer.sif_spec import embedded

        return embedded(Path(where), name, root)

    def difference(self, where, loaded, spec_hash):
        from envport.builders.apptainer.sif_spec import difference

        return difference(Path(where), loaded, spec_hash)

    def launcher(self, req: WitnessRequest):
        from envport.builders import weights
        from envport.builders.apptainer.builder import sif_path
        from envport.witness.launchers.sif import SifLauncher

        spec = req.loaded.spec
        sif = Path(req.sif) if req.sif else sif_path(req.site, req.loaded.root, req.identity)
        launcher = SifLauncher(sif, python=req.python or "python3", gpus=req.gpus,
                               mounts=weights.existing_mounts(spec, weights.weights_root()),
                               missing_fix=f"envport build {spec.name} --target apptainer, or pass --sif FILE")
        return launcher, {"sif": str(sif)}

    def slurm_wrap(self, req):
        from envport.builders.apptainer.builder import sif_path

        return {"sif": str(Path(req.sif).resolve()) if req.sif else str(sif_path(req.site, req.loaded.root,
                                                                                  req.identity))}

    def probe(self, run, where, names, site=None, host=None):
        """Inside the SIF: apptainer exec --cleanenv, else ch-run on the SIF mounted for the probe."""
        from envport.engines import sif_run

        if sif_run.runtime() == "apptainer":
            return run(sif_run.apptainer_argv(where, ["python3", "-", *names]))
        missing = sif_run.missing_tools("ch-run")
        if missing:
            return None, f"{', '.join(missing)} not found: the SIF is probed with ch-run where apptainer is absent"
        with sif_run.mounted(Path(where)) as mnt:
            return run(sif_run.ch_run_argv(str(mnt), ["python3", "-", *names]), env=sif_run.ch_run_env())


TARGET = Apptainer()

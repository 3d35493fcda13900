"""`envport build NAME --target apptainer`: the SIF `<name>-<hash12>.sif`, by one of three routes.

1. apptainer (or singularity) on PATH: `apptainer build` of the rendered .def
   (binary.py), or of `docker-daemon://<image>` with `--from-docker`; the
   SBOM is read from the partition apptainer wrote (mounted) and appended
   before the rename (sif/sbom.embed_sbom).
2. otherwise envport's own .def builder, which EXECUTES the rendered .def:
   the base rootfs as its `Bootstrap:` asks (bootstrap.py), `/.singularity.d`
   laid down (singularity_d.prepare_rootfs), `%files` copied and `%post` run
   under `/bin/sh -ex` in a bwrap sandbox that dies with envport
   (post_runner.py), the metadata written after %post (finish_rootfs),
   the squashfs written by envport's own writer (sif/squashfs_writer.py: gzip,
   apptainer's default, or zstd, no fragments, the blocks of files an earlier
   build compressed reused from the phase cache's packs, sif/squash_blocks.py),
   or by mksquashfs for another compressor a site chooses (lz4, xz, lzo, lzma), and the SIF assembled (engines/sif.write_sif):
   Def.FILE, JSON.Generic `inspect-metadata.json` read back from the finished
   tree, JSON.Generic `envport-spec.json` (the resolved spec, so `envport
   inspect` can diff it), the primary squashfs partition, and the SBOM object
   (sif/sbom.embed_sbom, of the rootfs, before the SIF gets its name).
3. `--from-docker` without apptainer: the same SIF layout from the built docker
   image's rootfs (no %post: the image is already built).

`present` only for the very file this machine's build wrote (its stat as
recorded in the state dir, sif_record.py), or one whose content was checked
(sif_content.content_matches: the partition's own labels, python and
distributions, no set-id files or device nodes): never on a label alone, which
anyone can write into a SIF dropped into a shared sif_dir.  The builder leaves
no set-id bit and no device node in the image (`_defang`): apptainer and ch-run
never honour them, and a root mount without nosuid would.  Nothing is ever left under the final name by a build
that did not finish: the SIF is written under a hidden partial name and
renamed; the rootfs lives in a work directory named by this process's pid,
and a later run deletes work directories whose process is gone (never one
with a mount under it) instead of reusing them.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Optional

from envport import __version__
from envport.builders.apptainer import bootstrap as boot
from envport.builders.apptainer.deffile import DefError, DefFile, parse_def
from envport.builders.apptainer.phase_cache import CacheSettingError, PhaseCache
from envport.builders.apptainer.phases import keys as keys_of
from envport.builders.apptainer.phases import later_files, owner, split
from envport.builders.apptainer.post_runner import PostResult, RunnerError, copy_files, remove_rootfs, run_post
from envport.builders.apptainer.singularity_d import finish_rootfs, inspect_metadata_for_root, prepare_rootfs
from envport.core.proc import run
from envport.core.progress import Progress, tail
from envport.core.progress import human_size as _size
from envport.core.verdict import StepResult, Verdict
from envport.sif.format import SPEC_OBJECT, SifError, host_arch, read_json_object, read_sif, write_sif
from envport.plan.site import Site
from envport.recipe.identity import resolve
from envport.recipe.render import WHEELHOUSE_CONTEXT_NAME, render_plan
from envport.sif import squashfs_writer
from envport.sif.sbom import embed_sbom
from envport.sif.squash_blocks import BlockStore, write_pack
from envport.builders.spec_object import spec_object
from envport.spec.loader import Loaded

TARGET = "apptainer"
WORK_PREFIX = "envport-sif-"
# /dev/shm unpacks and squashes a rootfs several times faster than disk here (the test fixture
# measured 7 s against 80 s); used only when it leaves this much room after the build.
SHM = Path("/dev/shm")
SHM_MIN_FREE = 8 << 30
# The default build time (source_date): 2001-01-01 plus up to 30 years, from the env hash.
SPEC_EPOCH_START = 978307200
SPEC_EPOCH_SPAN = 30 * 365 * 86400
VOLATILE = ("var/log/apt/*.log", "var/log/apt/eipp.log.xz", "var/log/dpkg.log", "var/log/alternatives.log",
            "var/cache/ldconfig/aux-cache", "var/cache/debconf/*-old", "var/lib/dpkg/*-old")
DEBIAN_PACKAGES = {"bwrap": "bubblewrap", "mksquashfs": "squashfs-tools", "unsquashfs": "squashfs-tools"}


def sif_path(site: Site, root: Path, identity) -> Path:
    return site.apptainer.sif_path(root) / identity.sif_name


def present(sif: Path, hash_: str, resolved=None, python: str = "") -> Optional[dict]:
    """{sif, size} when SIF is the file this machine's build of HASH_ wrote (one stat), or, given RESOLVED
    (its plan) and PYTHON, its content was checked to be that env; None otherwise."""
    from envport.sif import content as sif_content
    from envport.sif import record as sif_record

    if sif_record.unchanged(str(sif), hash_):
        return {"sif": str(sif), "size": os.stat(sif).st_size, "checked": "build record"}
    if resolved is None or not sif.is_file():
        return None
    ok, why = sif_content.content_matches(str(sif), hash_, resolved.plan, python)
    if not ok:
        return {"sif": str(sif), "rejected": why}
    _record(sif, hash_)
    return {"sif": str(sif), "size": os.stat(sif).st_size, "checked": "content"}


def _record(sif: Path, hash_: str) -> None:
    """This machine now vouches for SIF: its stat, partition sha256 and layout in the state dir."""
    from envport.sif import content as sif_content
    from envport.sif import record as sif_record
    from envport.sif.format import primary_partition

    info = read_sif(sif)
    part = primary_partition(info)
    sif_record.write(str(sif), hash_, sif_content.partition_sha256(info, part), sif_content.layout(info))


def build(loaded: Loaded, site: Site, root: Path, *, rebuild: bool = False, from_docker: bool = False,
          progress: Progress) -> list[StepResult]:
    """Build (or find) the env's SIF; each step's StepResult, stopping at the first not ok."""
    from envport.builders.apptainer import binary

    resolved = resolve(loaded, site, TARGET)
    sif = sif_path(site, root, resolved.identity)
    step = f"sif {sif.name}"
    t0 = time.monotonic()
    if not rebuild:
        hit = present(sif, resolved.hash, resolved, loaded.spec.python)
        if hit is not None and "rejected" not in hit:
            data = {"sif": hit["sif"], "size": hit["size"], "route": "present", "checked": hit["checked"]}
            return [StepResult(step, Verdict.PRESENT, f"{sif} ({_size(hit['size'])})",
                               seconds=time.monotonic() - t0, data=data)]
        if sif.exists():
            from envport.core.untrusted import shown

            why = hit["rejected"] if hit else "this machine's build did not write it"
            progress(f"envport: [apptainer] {sif} exists but is not taken as envport.hash={resolved.hash[:12]}"
                     f"...: {shown(why)}; rebuilding")  # WHY may quote the file: escaped
    if binary.apptainer_binary() and os.environ.get("ENVPORT_SIF_BUILDER") != "envport":
        results = binary.build(loaded, site, root, sif, from_docker=from_docker, progress=progress)
        if results and results[-1].verdict is Verdict.OK and sif.is_file():
            try:
                _record(sif, resolved.hash)
            except SifError as exc:  # apptainer wrote it; without a record the next build checks its content
                progress(f"envport: [apptainer] {sif} not recorded: {exc.message}")
        return results
    return SifBuild(loaded, site, root, resolved, sif, progress).run(from_docker)


def builder_missing(from_docker: bool = False) -> Optional[tuple[str, str, str]]:
    """(reason, detail, fix) when this host cannot run envport's own .def builder; None when it can."""
    if os.geteuid() != 0:
        return ("not_root", "envport's .def builder runs %post as root, the way apptainer's own root builds do, "
                "and no apptainer is on PATH for a --fakeroot build", "run as root, or build where apptainer is "
                "installed")
    needed = ["mksquashfs"] + ([] if from_docker else ["bwrap"])
    absent = [t for t in needed if shutil.which(t) is None]
    if absent:
        pkgs = " ".join(sorted({DEBIAN_PACKAGES[t] for t in absent}))
        return ("missing_tool", f"{', '.join(absent)} not found: envport's .def builder needs them where "
                "apptainer is absent", f"apt-get install {pkgs}")
    return None


class SifBuild:
    """envport's own builder: one run, one work directory, removed at the end whatever happens."""

    def __init__(self, loaded: Loaded, site: Site, root: Path, resolved, sif: Path, progress: Progress):
        self.loaded, self.site, self.root, self.resolved, self.sif = loaded, site, root, resolved, sif
        self.progress = progress
        self.step = f"sif {sif.name}"
        self.timings: dict[str, float] = {}
        self.squashed: dict = {}  # the squashfs writer's counts, for the step's data
        try:
            self.created, self.created_from = source_date(resolved.hash)
        except SifError as exc:
            self.created, self.created_from = 0, exc.message

    def say(self, line: str) -> None:
        self.progress(f"envport: [apptainer] {line}")

    def refused(self, reason: str, detail: str, fix: str = "") -> list[StepResult]:
        return [StepResult(self.step, Verdict.REFUSED, detail, reason=reason, lines=[f"fix: {fix}"] if fix else [])]

    def run(self, from_docker: bool) -> list[StepResult]:
        start = time.monotonic()
        if not self.created:
            return [StepResult(self.step, Verdict.REFUSED, self.created_from, reason="bad_source_date")]
        missing = self._missing_tools(from_docker)
        if missing:
            return missing
        results: list[StepResult] = []
        if not from_docker:
            try:
                self.deffile = self._render_def()
                boot.check(self.deffile, self.site)
            except DefError as exc:
                return [StepResult(self.step, Verdict.FAILED, f"the rendered .def does not parse: {exc}")]
            except boot.BootstrapRefused as exc:
                return [StepResult(self.step, Verdict.REFUSED, exc.message, reason=exc.reason)]
        if not from_docker:
            from envport.builders.wheelhouse import wheelhouse_for

            made = wheelhouse_for(self.loaded, self.site, self.root, self.resolved.plan, self.progress)
            if made is not None:
                results.append(made)
                if not made.verdict.ok:
                    return results
        if not from_docker and any(s.kind == "pip" and s.installer == "uv" for s in self.resolved.plan.steps):
            from envport.builders.tools import ensure_uv

            _, failed = ensure_uv(self.root, self.progress)
            if failed is not None:
                return results + [failed]
        work = self._work_dir()
        try:
            result = self._from_docker(work) if from_docker else self._from_def(work)
        finally:
            self._cleanup(work)
        result.seconds = time.monotonic() - start
        if result.verdict.ok:
            result.data["timings"] = {k: round(v, 3) for k, v in self.timings.items()}
            if self.squashed:
                result.data["squashfs"] = self.squashed
            result.data["work_dir"] = str(work.parent)
        return results + [result]

    # --- host checks and work directory -----------------------------------------

    def _missing_tools(self, from_docker: bool) -> list[StepResult]:
        missing = builder_missing(from_docker)
        return self.refused(*missing) if missing else []

    def _work_base(self) -> Path:
        if self.site.apptainer.build_dir:
            return Path(self.site.apptainer.build_dir).expanduser()
        try:
            st = os.statvfs(SHM)
            if st.f_bavail * st.f_frsize >= SHM_MIN_FREE:
                return SHM
        except OSError:
            pass
        return self.sif.parent / ".build"

    def _work_dir(self) -> Path:
        base = self._work_base()
        base.mkdir(parents=True, exist_ok=True)
        for stale in base.glob(f"{WORK_PREFIX}*"):
            pid = stale.name.rsplit(".", 1)[-1]
            if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                self.say(f"removing {stale} (left by a build that did not finish; never reused)")
                try:
                    remove_rootfs(stale)
                except RunnerError as exc:
                    self.say(f"cannot remove it: {exc}")
        work = base / f"{WORK_PREFIX}{self.resolved.identity.name}-{self.resolved.identity.hash12}.{os.getpid()}"
        if work.exists():
            remove_rootfs(work)
        work.mkdir(mode=0o700)
        return work

    def _cleanup(self, work: Path) -> None:
        try:
            remove_rootfs(work)
        except RunnerError as exc:
            self.say(f"left {work}: {exc}")

    # --- the .def route ---------------------------------------------------------

    def _render_def(self) -> DefFile:
        self.rendering = render_plan(self.resolved.plan, self.resolved.hash, (TARGET,), site=self.site.name)
        def_name = f"{self.loaded.spec.name}.def"
        return parse_def(self.rendering.files[def_name][0].decode("utf-8"), def_name)

    def _context(self, work: Path) -> Path:
        """The rendered .def and the files its %files copy, as `apptainer build` would find them."""
        plan = self.resolved.plan
        context = work / "context"
        for rel, (data, mode) in self.rendering.files.items():
            path = context / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            os.chmod(path, mode)
        if any(s.kind == "pip" and s.uses_wheelhouse for s in plan.steps):
            src = self.site.wheelhouse_path(self.root, self.loaded.spec.name)
            dest = context / WHEELHOUSE_CONTEXT_NAME
            dest.mkdir()
            for wheel in sorted(src.iterdir()):
                if wheel.is_file() and not wheel.name.startswith("."):
                    _link_or_copy(wheel, dest / wheel.name)
        if any(s.kind == "pip" and s.installer == "uv" for s in plan.steps):
            from envport.builders.tools import uv_path

            (context / "tools").mkdir(exist_ok=True)
            _link_or_copy(uv_path(self.root), context / "tools" / "uv")  # fetched by build() beforehand
        return context

    def _from_def(self, work: Path) -> StepResult:
        t = time.monotonic()
        deffile = self.deffile
        context = self._context(work)
        rootfs = work / "rootfs"
        phases = split(deffile)
        cache, keys = self._phase_keys(phases, context)
        start, base = self._restore(cache, phases, keys, rootfs, context)
        if base is None:
            rootfs.mkdir()
            try:
                base = boot.bootstrap(deffile, rootfs, self.site, progress=self.progress)
            except boot.BootstrapRefused as exc:
                return StepResult(self.step, Verdict.REFUSED, exc.message, reason=exc.reason)
            if not (rootfs / ".singularity.d" / "env").is_dir():
                prepare_rootfs(rootfs, image_env=base.env, image_labels=_not_envport(base.labels),
                               entrypoint=base.entrypoint, cmd=base.cmd)
            else:
                _drop_base_identity(rootfs)
        self.timings["bootstrap"] = time.monotonic() - t
        t = time.monotonic()
        try:
            if start == 0:
                self._copy_files(deffile, rootfs, context)
            post = self._run_steps(phases, start, rootfs, cache, keys, base)
        except RunnerError as exc:
            verdict = Verdict.REFUSED if exc.reason in ("not_root", "missing_tool") else Verdict.FAILED
            return StepResult(self.step, verdict, exc.message, reason=exc.reason if verdict is Verdict.REFUSED else "")
        self.timings["post"] = time.monotonic() - t
        if not post.ok:
            where = f"step {post.step.n}/{post.step.total} {post.step.title}" if post.step else "%post"
            how = "timed out" if post.timed_out else f"exited {post.rc}"
            return StepResult(self.step, Verdict.FAILED, f"%post {how} in {where}; no SIF was written",
                              lines=list(post.tail)[-30:],
                              data={"failed_step": post.step.marker if post.step else None})
        _remove_volatile(rootfs)
        pin = self._pin_check(rootfs)
        if pin is not None:
            return pin
        return self._assemble(work, rootfs, deffile, base)

    # --- %post step by step, through the phase cache ------------------------------------------------

    def _phase_keys(self, phases, context: Path) -> tuple[Optional[PhaseCache], dict[int, str]]:
        """The phase cache and each kept step's key; (None, {}) when this build is not cached (said why)."""
        cache = PhaseCache.for_site(self.site, self.root, self.say)
        if cache is None or not phases.kept():
            return None, {}
        if phases.why_whole:
            self.say(f"phase cache: not used: {phases.why_whole}")
            return None, {}
        base_id = boot.base_identity(self.deffile)
        if base_id is None:
            self.say("phase cache: not used: nothing names the base's content before it is unpacked")
            return None, {}
        cache.sweep()
        return cache, keys_of(self.deffile, phases, base_id, context)

    def _restore(self, cache, phases, keys: dict[int, str], rootfs: Path, context: Path):
        """(the step whose tree ROOTFS now holds, its Base) from the latest kept step with a good entry;
        (0, None) when none: the build starts from the base."""
        if cache is None:
            return 0, None
        for n in sorted(phases.kept(), reverse=True):
            entry = cache.find(keys[n])
            if entry is None or not cache.restore(entry, rootfs):
                continue
            for rel in entry.meta.get("later", []):
                _remove_in_root(rootfs, rel)
            self._landed = {}
            self._copy_files(later_files(self.deffile, phases, n), rootfs, context)
            self.say(f"phase cache: steps 1-{n} from entry {keys[n][:12]} (after step {n} {entry.meta['marker']})")
            self.timings["restored_step"] = n
            return n, boot.Base(source=entry.meta["base"])
        return 0, None

    def _copy_files(self, deffile: DefFile, rootfs: Path, context: Path) -> None:
        """%files, one entry at a time: where each landed is what a cached tree must drop on restore."""
        self._landed = getattr(self, "_landed", {})
        count = 0
        for item in deffile.files:
            landed = copy_files(replace(deffile, files=(item,)), rootfs, context)
            self._landed[item] = landed
            count += len(landed)
        self.say(f"%files: {count} cop{'y' if count == 1 else 'ies'}")

    def _run_steps(self, phases, start: int, rootfs: Path, cache, keys: dict[int, str], base) -> PostResult:
        # SOURCE_DATE_EPOCH: python writes hash-checked .pyc files (no source mtime in them).
        env = {"SOURCE_DATE_EPOCH": str(self.created)}
        if phases.why_whole:
            return run_post(self.deffile, rootfs, on_line=self._post_line, extra_env=env)
        post = PostResult(rc=0, tail=(), step=None, seconds=0.0)
        for step in phases.steps[start:]:
            post = run_post(self.deffile, rootfs, on_line=self._post_line, script=phases.script(step.n),
                            extra_env=env)
            if not post.ok:
                return post
            if cache is not None and step.n in keys and step.n in phases.kept():
                later = sorted(p for item, ps in self._landed.items() if not 0 < owner(item, phases) <= step.n
                               for p in ps)
                cache.store(keys[step.n], rootfs, {"step": step.n, "marker": step.marker, "base": base.source,
                                                   "name": self.loaded.spec.name, "later": later})
        return post

    def _pin_check(self, rootfs: Path) -> Optional[StepResult]:
        """FAILED [pin_mismatch] when a package the spec pins is not what %post left (builders/pins.py), run
        with the env's python inside the rootfs, in the same sandbox as %post."""
        from envport.builders import pins
        from envport.builders.apptainer.post_runner import bwrap_argv
        from envport.plan.steps import CONTAINER_VENV

        plan = self.resolved.plan
        if not pins.pins(plan):
            return None
        t = time.monotonic()
        argv = bwrap_argv(shutil.which("bwrap") or "bwrap", rootfs.absolute())[:-3] + \
            pins.probe_argv(f"{CONTAINER_VENV}/bin/python")
        proc = run(argv, cwd="/", timeout=600)
        self.timings["pin_check"] = time.monotonic() - t
        if not proc.ok:
            return StepResult(self.step, Verdict.FAILED, f"the pin check could not run in the rootfs (exit "
                              f"{proc.returncode}); no SIF was written", reason="pin_check_failed",
                              lines=tail(proc.text, 20))
        try:
            installed = pins.parse_probe(proc.stdout)
        except ValueError as exc:
            return StepResult(self.step, Verdict.FAILED, str(exc), reason="pin_check_failed")
        return pins.result(self.step, plan, installed)

    def _post_line(self, line: str) -> None:
        from envport.builders.apptainer.deffile import match_step

        found = match_step(line)
        if found:
            self.say(f"%post step {found[0]}/{found[1]} {found[2]}")

    # --- the --from-docker route ------------------------------------------------

    def _from_docker(self, work: Path) -> StepResult:
        tag = self.resolved.identity.image_tag
        text = f"Bootstrap: docker-daemon\nFrom: {tag}\n"
        deffile = parse_def(text, f"docker-daemon:{tag}")
        rootfs = work / "rootfs"
        rootfs.mkdir()
        t = time.monotonic()
        try:
            base = boot.bootstrap(deffile, rootfs, self.site, progress=self.progress)
        except boot.BootstrapRefused as exc:
            if exc.reason == "base_image_missing":
                return StepResult(self.step, Verdict.REFUSED, f"--from-docker: image {tag} is not in the docker "
                                  "engine", reason="image_missing",
                                  lines=[f"fix: envport build {self.loaded.spec.name} --target docker"])
            return StepResult(self.step, Verdict.REFUSED, exc.message, reason=exc.reason)
        self.timings["bootstrap"] = time.monotonic() - t
        prepare_rootfs(rootfs, image_env=base.env, image_labels=base.labels, entrypoint=base.entrypoint,
                       cmd=base.cmd)
        return self._assemble(work, rootfs, deffile, base)

    # --- metadata, squashfs, SIF ------------------------------------------------

    def _assemble(self, work: Path, rootfs: Path, deffile: DefFile, base: boot.Base) -> StepResult:
        hash_ = self.resolved.hash
        finished = finish_rootfs(rootfs, deffile, created=self.created, arch=host_arch(),
                                 extra_labels=self._reproducibility_labels())
        if finished.labels.get("envport.hash") != hash_:
            return StepResult(self.step, Verdict.FAILED, f"the finished image's labels carry envport.hash="
                              f"{finished.labels.get('envport.hash')!r}, not {hash_[:12]}...; no SIF was written")
        metadata = inspect_metadata_for_root(rootfs)
        cleared, removed = _defang(rootfs)
        if cleared or removed:
            self.say(f"cleared the set-id bits of {cleared} files and removed {removed} device nodes "
                     "(apptainer and ch-run never honour them; a mount without nosuid would)")
        squashfs = work / "rootfs.sqfs"
        comp = self.site.apptainer.compression
        failed = self._squash(rootfs, squashfs, comp)
        if failed is not None:
            return failed
        t = time.monotonic()
        from envport.sif import content as sif_content
        from envport.sif import record as sif_record
        from envport.sif.handle import SifFile

        sqfs_size = squashfs.stat().st_size
        with SifFile.open(squashfs) as image:  # any regular file: the squashfs on its own
            digest = image.digest(0, sqfs_size)
        # The SBOM goes in before the SIF gets its name (a build cut short leaves no SIF without one) and
        # before any signature (`build --sign` signs after this step): the signature covers it.
        sbom_count: list[int] = []  # set by the finish step, on the partial
        info = write_sif(self.sif, deffile=deffile.text.encode("utf-8"), inspect_metadata=metadata,
                         squashfs_path=squashfs, created=self.created,
                         uuid=hashlib.sha256(f"{hash_}:{digest}".encode()).digest()[:16],  # of the content
                         arch=host_arch(), extra_json=((SPEC_OBJECT, self._spec_json(base, digest, sqfs_size)),),
                         finish=lambda partial: sbom_count.append(embed_sbom(
                             partial, self.loaded, self.site, hash_, self.created, self.say, rootfs)))
        packages = sbom_count[0]
        sif_record.write(str(self.sif), hash_, digest, sif_content.layout(info))
        self.timings["assemble"] = time.monotonic() - t
        return StepResult(self.step, Verdict.OK, f"{self.sif} ({_size(info.file_size)}, squashfs {comp})",
                          data={"sif": str(self.sif), "size": info.file_size, "route": "envport",
                                "compression": comp, "base": base.source, "partition_sha256": digest,
                                "setid_cleared": cleared, "devices_removed": removed, "sbom_components": packages,
                                "ignored_labels": list(finished.ignored_labels)})

    def _squash(self, rootfs: Path, squashfs: Path, comp: str) -> Optional[StepResult]:
        """ROOTFS as the squashfs SQUASHFS: envport's writer for gzip and zstd (blocks of files an earlier
        build compressed are reused), mksquashfs for a compressor the writer does not write; a FAILED result
        or None."""
        t = time.monotonic()
        if comp not in squashfs_writer.COMPRESSORS:
            self.say(f"mksquashfs -noappend -comp {comp} ({_tree_size(rootfs)}; envport's own writer, which "
                     f"reuses unchanged files' blocks, writes {' and '.join(squashfs_writer.COMPRESSORS)} only)")
            from envport.builders.apptainer.squash_progress import run_mksquashfs

            # Every time in the image is the build's (-all-time: files, -mkfs-time: the superblock), so the
            # same tree gives the same bytes; mksquashfs >= 4.4 orders everything else reproducibly by default.
            code, out = run_mksquashfs(["mksquashfs", str(rootfs), str(squashfs), "-noappend", "-comp", comp,
                                        "-all-time", str(self.created), "-mkfs-time", str(self.created),
                                        "-progress", "-quiet"], self.say)
            self.timings["squashfs"] = time.monotonic() - t
            if code != 0:
                return StepResult(self.step, Verdict.FAILED, f"mksquashfs exited {code}; no SIF was written",
                                  lines=tail(out))
            return None
        cache = store = None
        try:
            codec = squashfs_writer.codec(comp)
            cache, store = self._block_store(codec.params())
            self.say(f"squashfs: envport's writer, {codec.describe()}, no fragments ({_tree_size(rootfs)}; "
                     f"{len(store.index) if store else 0} files' blocks kept by earlier builds)")
            result = squashfs_writer.write_image(rootfs, squashfs, compressor=comp, mtime=self.created,
                                                 mkfs_time=self.created, store=store, say=self.say)
        except (squashfs_writer.WriterError, OSError) as exc:
            return StepResult(self.step, Verdict.FAILED, f"the squashfs of {rootfs} could not be written: {exc}; "
                              "no SIF was written")
        finally:
            if store is not None:
                store.close()
        self.timings["squashfs"] = time.monotonic() - t
        self.squashed = {"writer": "envport", "blocks_compressed": result.blocks_compressed,
                         "blocks_reused": result.blocks_reused, "files_reused": result.files_reused}
        self.say(f"squashfs: {result.blocks_compressed} blocks compressed, {result.blocks_reused} reused "
                 f"({result.files_reused} files) in {self.timings['squashfs']:.1f}s")
        if result.xattrs_dropped:
            self.say("squashfs: extended attributes not kept (apptainer and ch-run mount nosuid, where they "
                     "would not apply): " + ", ".join(f"{k} ({n})" for k, n in result.xattrs_dropped.items()))
        if cache is not None:
            t = time.monotonic()
            for folder in store.bad:  # a cache always comes with its store (_block_store)
                cache.remove(folder.name)
            cache.store_pack(self.loaded.spec.name, lambda folder: write_pack(folder, squashfs, result))
            self.timings["squashfs_pack"] = time.monotonic() - t
        return None

    def _block_store(self, params: dict):
        """(the phase cache, a store of its block packs made with PARAMS), or (None, None) when the cache is
        off."""
        try:
            cache = PhaseCache.for_site(self.site, self.root, self.say)
        except CacheSettingError as exc:
            self.say(f"squashfs: no blocks reused: {exc}")
            return None, None
        if cache is None:
            return None, None
        return cache, BlockStore(cache.packs(), params, self.say)

    def _reproducibility_labels(self) -> dict[str, str]:
        """Where the image's times come from and which writer wrote its squashfs (another writer or version
        writes other bytes from the same tree): what a rebuild needs to give the same SIF."""
        return {"envport.source_date_epoch": f"{self.created} ({self.created_from})",
                "envport.squashfs": squashfs_writer_label(self.site.apptainer.compression)}

    def _spec_json(self, base: boot.Base, digest: str, size: int) -> bytes:
        # The partition's sha256 lets `inspect` tell a damaged copy from its build (a forger can rewrite it
        # too: only a signature says who built it).
        doc = spec_object(self.loaded, self.resolved, self.site.name, base.source,
                          partition={"sha256": digest, "size": size})
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode("utf-8")


def spec_epoch(hash_: str) -> int:
    """The default build time: a second in 2001-2030 taken from the env's hash, so the same spec, lock and
    site give the same SIF wherever and whenever it is built."""
    return SPEC_EPOCH_START + int(hash_[:12], 16) % SPEC_EPOCH_SPAN


def source_date(hash_: str) -> tuple[int, str]:
    """(the build's time, where it came from): SOURCE_DATE_EPOCH when set, else spec_epoch."""
    given = os.environ.get("SOURCE_DATE_EPOCH", "").strip()
    if given:
        if not given.isdigit():
            raise SifError("bad_source_date", f"SOURCE_DATE_EPOCH={given!r}: expected seconds since 1970 "
                                              "(an integer), e.g. $(git log -1 --format=%ct)")
        return int(given), "SOURCE_DATE_EPOCH"
    return spec_epoch(hash_), "derived from the env hash"


def squashfs_writer_label(comp: str) -> str:
    """Which writer and version makes the partition of a build with compressor COMP."""
    if comp in squashfs_writer.COMPRESSORS:
        try:
            words = squashfs_writer.codec(comp).describe()
        except squashfs_writer.WriterError as exc:
            words = f"{comp}: {exc}"  # never in a SIF: the squashfs step fails on the same error
        return (f"envport {__version__} squashfs_writer ({words}, {squashfs_writer.BLOCK_SIZE >> 10} KiB blocks, "
                "no fragments)")
    return f"mksquashfs {mksquashfs_version()} (-comp {comp})"


def mksquashfs_version() -> str:
    proc = run(["mksquashfs", "-version"], timeout=60)
    m = re.search(r"mksquashfs version (\S+)", proc.stdout)
    return m.group(1) if m else "unknown"


def _remove_in_root(rootfs: Path, rel: str) -> None:
    """Remove ROOTFS/REL (a path %files copied, as copy_files reported it), its links resolved inside ROOTFS:
    a step may have made a directory on the way a link, and a link must never lead the removal out."""
    from envport.builders.apptainer.post_runner import resolve_in_root

    path = resolve_in_root(rootfs, os.path.dirname(rel)) / os.path.basename(rel)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def _remove_volatile(rootfs: Path) -> None:
    """Logs and caches %post's tools leave with the time in them (apt, dpkg, ldconfig): never part of the env,
    and they would make two builds of the same spec differ."""
    for rel in VOLATILE:
        for path in sorted(rootfs.glob(rel)):
            if path.is_file() or path.is_symlink():
                path.unlink()


def _defang(rootfs: Path) -> tuple[int, int]:
    """Clear every set-id bit of a non-directory and remove every device node under ROOTFS (never following
    a link): (files cleared, nodes removed).  A set-gid directory only passes its group on: left alone."""
    import stat as st_mod

    cleared = removed = 0
    for top, _dirs, files in os.walk(rootfs):  # a link to a directory is in _dirs: never followed, no bits
        for name in files:
            path = os.path.join(top, name)
            mode = os.lstat(path).st_mode
            if st_mod.S_ISCHR(mode) or st_mod.S_ISBLK(mode):
                os.unlink(path)
                removed += 1
            elif st_mod.S_ISREG(mode) and mode & (st_mod.S_ISUID | st_mod.S_ISGID):
                os.chmod(path, st_mod.S_IMODE(mode) & ~(st_mod.S_ISUID | st_mod.S_ISGID))
                cleared += 1
    return cleared, removed


def _not_envport(labels: dict) -> dict:
    """A base's labels without its envport.* identity: an image built FROM an envport env is another env,
    and a base label would win over the .def's %labels (apptainer keeps labels the image already has)."""
    return {k: v for k, v in labels.items() if not k.startswith("envport.")}


def _drop_base_identity(rootfs: Path) -> None:
    path = rootfs / ".singularity.d" / "labels.json"
    if path.is_file():
        from envport.builders.apptainer.singularity_d import go_json_indent

        path.write_text(go_json_indent(_not_envport(json.loads(path.read_text(encoding="utf-8")))),
                        encoding="utf-8")


def _link_or_copy(src: Path, dest: Path) -> None:
    try:
        os.link(src, dest)
    except OSError:
        shutil.copy2(src, dest)


def _tree_size(root: Path) -> str:
    proc = run(["du", "-sx", "--block-size=1", str(root)], timeout=600)  # a size for the progress line only
    m = re.match(r"(\d+)", proc.stdout)
    return _size(int(m.group(1))) if m else "size unknown"


def embedded_spec(sif: Path) -> Optional[dict]:
    """The resolved spec envport embedded in SIF, or None (a SIF apptainer built has none)."""
    return read_json_object(read_sif(sif), SPEC_OBJECT)


def can_build() -> bool:
    """This host can build a SIF (apptainer, or envport's own builder with root and its tools)."""
    from envport.builders.apptainer.binary import apptainer_binary

    return bool(apptainer_binary()) or builder_missing() is None

"""The docker engine: the only module that talks to it.

Three ways in, each where it is the right tool: the docker SDK for inspect,
run and labels; the docker CLI for BuildKit builds (the SDK only drives the
legacy builder); and a raw request on the engine's unix socket for the fast
`present` probe, which must not pay for importing the SDK.  An engine that
does not answer is REFUSED `docker_unreachable`; an envport installed without
its `build` extra (no docker SDK) is REFUSED `missing_extra` with the pip
command, never mistaken for a stopped engine.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import threading
from pathlib import Path
from typing import Callable, Optional

from envport.core.finding import Finding
from envport.core.proc import run as proc_run
from envport.core.proc import spawn, stream_lines
from envport.core.verdict import StepResult, Verdict


def missing_extra(step: str, module: str) -> StepResult:
    from envport.core.extras import refusal

    return refusal(step, (module,)) or StepResult(step, Verdict.REFUSED, f"{module!r} did not import",
                                                   reason="missing_extra")


# Clients that may run BuildKit, in order; ENVPORT_DOCKER_CLI overrides (tests use it to
# pick a client without BuildKit and see the legacy path).
CLI_CANDIDATES = ("/usr/bin/docker", "docker")


# What the docker CLI needs to find and talk to the engine; nothing else of the host's
# environment is passed, so no secret can reach the build by accident.
CLI_ENV_KEEP = ("PATH", "HOME", "DOCKER_HOST", "DOCKER_CONFIG", "DOCKER_CERT_PATH", "DOCKER_TLS_VERIFY",
                "DOCKER_CONTEXT", "DOCKER_API_VERSION", "TMPDIR")


DOCKER_UNREACHABLE_FIX = ("start the engine (`bash .ci/services/dockerd.sh`, or `dockerd &`), "
                          "or point DOCKER_HOST at one that runs")


NO_BUILDKIT_FIX = ("install a docker client that runs BuildKit (Debian's docker.io: /usr/bin/docker with "
                   "DOCKER_BUILDKIT=1, or docker-buildx), or build with a site profile that has "
                   "`wheelhouse: false`")


_buildkit_cli: dict[str, Optional[str]] = {}


def docker_host() -> str:
    return os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")


def connect(step: str, timeout: int = 60, ping_timeout: int = 10):
    """(client, None) when the engine answers a ping within ping_timeout, else (None, the REFUSED result)."""
    try:
        import docker
    except ModuleNotFoundError:
        return None, missing_extra(step, "docker")
    try:
        client = docker.from_env(timeout=ping_timeout)
        client.ping()
    except Exception as exc:  # DockerException, requests/urllib3 and socket errors alike
        return None, unreachable(step, f"{type(exc).__name__}: {str(exc)[:300]}")
    client.api.timeout = timeout  # streamed builds pass no timeout of their own and wait as long as they run
    return client, None


def unreachable(step: str, why: str) -> StepResult:
    return StepResult(step, Verdict.REFUSED,
                      f"the docker engine at {docker_host()} does not answer ({why}); {DOCKER_UNREACHABLE_FIX}",
                      reason="docker_unreachable")


def get_image(client, ref: str):
    import docker

    try:
        return client.images.get(ref)
    except docker.errors.ImageNotFound:
        return None


def buildkit_cli() -> Optional[str]:
    """The first docker client that runs BuildKit without buildx (`DOCKER_BUILDKIT=1`), probed once."""
    override = os.environ.get("ENVPORT_DOCKER_CLI")
    candidates = (override,) if override else CLI_CANDIDATES
    key = ":".join(candidates)
    if key not in _buildkit_cli:
        _buildkit_cli[key] = None
        for cand in candidates:
            path = shutil.which(cand)
            if not path:
                continue
            # The 28.x client without buildx fails `build --help` with "buildx component is missing".
            proc = proc_run([path, "build", "--help"], env={**cli_env(), "DOCKER_BUILDKIT": "1"}, timeout=30)
            if proc.ok and "--iidfile" in proc.stdout and "--secret" in proc.stdout:
                _buildkit_cli[key] = path
                break
    return _buildkit_cli[key]


def cli_env() -> dict[str, str]:
    return {k: os.environ[k] for k in CLI_ENV_KEEP if k in os.environ}


class Interrupted(KeyboardInterrupt):
    pass


def run_buildkit(argv: list[str], cwd: Path, on_line: Callable[[str], None]) -> int:
    """Run the BuildKit client; a SIGTERM/SIGINT to envport stops it (and with it the build)."""
    env = {**cli_env(), "DOCKER_BUILDKIT": "1"}
    # If envport itself is killed, the docker client must not keep building on its own.
    proc = spawn(argv, cwd=cwd, env=env, text=True, errors="replace", dies_with=signal.SIGTERM)
    previous = None
    if threading.current_thread() is threading.main_thread():
        def _stop(signum, frame):
            raise Interrupted(signum)
        previous = signal.signal(signal.SIGTERM, _stop)
    try:
        return stream_lines(proc, on_line)  # an interrupt: SIGINT, the client cancels the build in the engine
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


# The fast `present` probe's one request lives in engines/docker_socket.py (_socket + the C json scanner).
from envport.engines.docker_socket import image_labels  # noqa: E402,F401


def engine_problem(docker: str = "docker", timeout: float = 15) -> Optional[str]:
    """None when a docker engine answers, else the reason in one line."""
    out = proc_run([docker, "version", "--format", "{{.Server.Version}}"], timeout=timeout)
    if out.returncode is None:
        return out.why
    if out.returncode != 0 or not out.stdout.strip():
        text = (out.stderr or out.stdout).strip().splitlines()
        return text[-1] if text else f"exit {out.returncode}"
    return None


def engine_finding(client: Optional[str], problem: Optional[str]) -> Finding:
    """The docker client (its path, None: not on PATH) and engine_problem's answer judged: the one reading
    the docker target's preflight and `envport doctor` give them."""
    if client is None:
        return Finding("runtime_missing", "no docker client on PATH",
                       "install docker (Debian: apt-get install docker.io) and start dockerd, or use --target venv",
                       check="docker")
    if problem:
        return Finding("docker_unreachable", f"the docker engine does not answer: {problem}",
                       "start dockerd, or check DOCKER_HOST", check="docker")
    return Finding("", "the docker engine answers", check="docker", verdict=Verdict.OK)


def image_exists(image: str, docker: str = "docker") -> bool:
    return proc_run([docker, "image", "inspect", "--format", "{{.Id}}", image], timeout=30).ok


class ExportError(Exception):
    """An image could not be read out of the engine; the message says why and what to do."""


def image_config(image: str, docker: str = "docker", timeout: float = 30) -> Optional[dict]:
    """The image's config (Env, Labels, Entrypoint, Cmd, Id), or None when the engine lacks it."""
    out = proc_run([docker, "image", "inspect", "--format", "{{json .Config}}\t{{.Id}}", image], timeout=timeout,
                   env=cli_env())
    if not out.ok:
        return None
    raw, _, image_id = out.stdout.strip().rpartition("\t")
    config = json.loads(raw) or {}
    return {"env": config.get("Env") or [], "labels": config.get("Labels") or {},
            "entrypoint": config.get("Entrypoint") or [], "cmd": config.get("Cmd") or [], "id": image_id}


@contextlib.contextmanager
def _created(image: str, docker: str, env: dict):
    """The id of a container of IMAGE, created and never started, removed whatever happens."""
    created = proc_run([docker, "create", image, "true"], env=env, timeout=120)
    if not created.ok:
        raise ExportError(f"docker create {image} failed: {(created.stderr or created.why).strip()[-300:]}")
    cid = created.stdout.strip()
    try:
        yield cid
    finally:
        proc_run([docker, "rm", "-f", cid], env=env, timeout=120)


@contextlib.contextmanager
def _exported(image: str, docker: str, env: dict):
    """`docker export` of a created container of IMAGE, as a byte stream: the whole filesystem, as a tar."""
    with _created(image, docker, env) as cid:
        export = spawn([docker, "export", cid], stderr=subprocess.PIPE, env=env, dies_with=signal.SIGTERM)
        failed = True
        try:
            yield export.stdout
            failed = False
        finally:
            export.stdout.close()
            err = export.stderr.read().decode("utf-8", "replace")
            export.stderr.close()
            # After the reader's own failure the closed pipe is why export stopped: that one is raised.
            if export.wait() != 0 and not failed:
                raise ExportError(f"docker export of {image} failed: {err.strip()[-300:]}")


def export_rootfs(image: str, dest: Path, docker: str = "docker", env: Optional[dict] = None) -> None:
    """IMAGE's filesystem unpacked into DEST (`docker create` + `docker export | tar -x`).

    The container is never started and is removed whatever happens; the engine's
    /.dockerenv marker is dropped, since the tree is no longer a docker container."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    env = cli_env() if env is None else env  # podman's client passes its own
    with _exported(image, docker, env) as stream:
        # No timeout: the image's size bounds the copy, not envport.
        untar = proc_run(["tar", "-x", "--numeric-owner", "-p", "-f", "-", "-C", str(dest)], timeout=None,
                         stdin_from=stream, dies_with=signal.SIGTERM)
    if not untar.ok:
        raise ExportError(f"unpacking {image} into {dest} failed: {(untar.stderr or untar.why).strip()[-300:]}")
    (dest / ".dockerenv").unlink(missing_ok=True)


def export_files(image: str, dest: Path, keep: Callable[[str], bool], docker: str = "docker",
                 env: Optional[dict] = None) -> int:
    """Only the regular files of IMAGE whose path KEEP accepts (relative, '/'-separated: `var/lib/dpkg/status`)
    written under DEST, with their mode bits and mtimes; the number written.  The engine still streams the
    whole filesystem (`docker export`), but nothing else is written: no symlink, device or directory entry is
    made (a path under a symlink is never in the stream, so a reader that follows no symlink reads the same
    from DEST as from the whole tree).  A kept path that the stream holds as a hard link to a file it did not
    keep (tar stores a file's bytes once, under the first of its names) costs a second pass for those."""
    dest = Path(dest)
    env = cli_env() if env is None else env
    written, links = _export_pass(image, dest, keep, docker, env)
    missed = {name: target for name, target in links.items() if target not in written}
    if missed:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="envport-links-", dir=dest) as tmp:
            targets = set(missed.values())
            _export_pass(image, Path(tmp), targets.__contains__, docker, env)
            for name, target in missed.items():
                if (Path(tmp) / target).is_file():
                    (dest / name).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(Path(tmp) / target, dest / name)
                    written.add(name)
    for name, target in links.items():
        if target in written and name not in written:
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(dest / target, dest / name)
            written.add(name)
    return len(written)


def _export_pass(image: str, dest: Path, keep: Callable[[str], bool], docker: str,
                 env: dict) -> tuple[set[str], dict[str, str]]:
    """One streamed `docker export` of IMAGE: the regular files KEEP accepts written under DEST (their names),
    and {name: the name it links to} of each hard link KEEP accepts, not written."""
    import tarfile

    def clean(name: str) -> str:
        return name.lstrip("/").removeprefix("./")

    written: set[str] = set()
    links: dict[str, str] = {}
    with _exported(image, docker, env) as stream, tarfile.open(fileobj=stream, mode="r|") as tar:
        for member in tar:
            name = clean(member.name)
            if ".." in name.split("/") or not keep(name):
                continue
            if member.islnk() and ".." not in clean(member.linkname).split("/"):
                links[name] = clean(member.linkname)
            if not member.isreg():
                continue
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            with tar.extractfile(member) as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out)
            os.chmod(target, member.mode & 0o755)
            os.utime(target, (member.mtime, member.mtime))
            written.add(name)
        while stream.read(1 << 20):  # what follows the archive's end marker: export must write it all to exit 0
            pass
    return written, links


def layers_mountable(graph: Optional[dict]) -> Optional[list[str]]:
    """The overlay2 layer folders of an image (GRAPH: its inspect's GraphDriver), top first, when this process
    can mount them itself: root, the engine on this machine's socket, its overlay2 driver, the folders here.
    None otherwise (a rootless or remote engine, another driver: the caller streams an export instead)."""
    if not graph or graph.get("Name") != "overlay2" or os.geteuid() != 0 or not docker_host().startswith("unix://"):
        return None
    data = graph.get("Data") or {}
    layers = [data.get("UpperDir") or "", *(data.get("LowerDir") or "").split(":")]
    layers = [d for d in layers if d]
    if not layers or not all(os.path.isdir(d) for d in layers):
        return None
    return layers


# Holds one read-only overlay mount for as long as envport lives: a SIGTERM (envport's own end, or its death
# through PR_SET_PDEATHSIG, even a SIGKILL) unmounts it, so no image's layers stay mounted behind a killed run.
OVERLAY_HOLDER = r"""set -u
pid= mnt=$2
stop() {
  [ -z "$pid" ] || kill "$pid" 2>/dev/null
  umount "$mnt" 2>/dev/null || umount -l "$mnt"
  rmdir "$mnt" "${mnt%/*}" 2>/dev/null
  exit 0
}
trap stop TERM INT HUP
mount -t overlay overlay -o "$1" "$mnt" || exit 3
echo mounted
sleep infinity &
pid=$!
wait "$pid"
stop
"""


@contextlib.contextmanager
def mounted_layers(layers: list[str]):
    """LAYERS (layers_mountable) mounted as one read-only overlay (nosuid, nodev) on a private tmp folder: the
    image's filesystem as the engine's containers see it, every file read where it lies, nothing copied.
    Yields None when the kernel refuses the mount (one layer alone, a lowerdir list past the page size).
    The mount is held by a child that unmounts it when envport ends, however it ends (OVERLAY_HOLDER)."""
    import tempfile

    where = Path(tempfile.mkdtemp(prefix="envport-layers-"))  # 0700: nobody else walks the mounted tree
    tree = where / "rootfs"
    tree.mkdir()
    opts = "ro,nosuid,nodev,lowerdir=" + ":".join(layers)
    holder = spawn(["bash", "-c", OVERLAY_HOLDER, "envport-layers", opts, str(tree)], text=True,
                   stderr=subprocess.DEVNULL, dies_with=signal.SIGTERM)
    try:
        yield tree if holder.stdout.readline().strip() == "mounted" else None
    finally:
        holder.terminate()
        try:
            holder.wait(timeout=60)
        finally:
            holder.stdout.close()
            # Never a recursive removal: were the mount still there, it would walk into the image's layers.
            for folder in (tree, where):
                with contextlib.suppress(OSError):
                    folder.rmdir()


@contextlib.contextmanager
def image_files(image: str, keep: Callable[[str], bool], graph: Optional[dict] = None, docker: str = "docker",
                env: Optional[dict] = None):
    """(tree, how): IMAGE's files as a folder a reader opens only the files it needs from, at the cost of what
    it reads.  `mounted`: the engine's overlay2 layers mounted read-only (mounted_layers; ~10 ms whatever the
    image's size), where this process may; else `streamed`: `docker export` filtered to the files KEEP
    accepts (export_files; the engine's stream of the whole filesystem, ~1 GB with torch, is paid, but no
    file is written but those).  GRAPH: the image's GraphDriver when the caller has it (else inspected; {}:
    not docker's overlay2, always streamed).  DOCKER, ENV: the engine's CLI (docker or podman) and its
    environment."""
    import tempfile

    env = cli_env() if env is None else env
    if graph is None:
        out = proc_run([docker, "image", "inspect", "--format", "{{json .GraphDriver}}", image], timeout=30,
                       env=env)
        graph = json.loads(out.stdout) if out.ok and out.stdout.strip() else None
    layers = layers_mountable(graph)
    if layers is not None:
        with mounted_layers(layers) as tree:
            if tree is not None:
                yield tree, "mounted"
                return
    with tempfile.TemporaryDirectory(prefix="envport-files-") as tmp:
        tree = Path(tmp) / "rootfs"
        tree.mkdir()
        export_files(image, tree, keep, docker=docker, env=env)
        yield tree, "streamed"


def run_in_image(client, image: str, argv: list[str], timeout: float = 120) -> tuple[int, str]:
    """Run ARGV in a throwaway container of IMAGE (no network): (exit code, output)."""
    container = client.containers.create(image, argv, network_disabled=True, entrypoint=[])
    try:
        container.start()
        rc = container.wait(timeout=timeout).get("StatusCode", 1)
        return rc, container.logs(stdout=True, stderr=True).decode("utf-8", "replace")
    finally:
        with contextlib.suppress(Exception):
            container.remove(force=True)


def repo_images(client, repo: str, cache: dict) -> list[dict]:
    """Every image with a tag REPO:*, as envport gc reads it: {id, tags, labels, created (epoch s), bytes (what
    the engine counts as its own, not shared with another image), containers (every container of it, stopped
    too)}. The engine's usage and container lists are asked once per CACHE; a removal clears them."""
    if "images" not in cache:
        cache["images"] = {i["Id"]: i for i in client.df().get("Images") or []}
        users: dict[str, list[str]] = {}
        for c in client.api.containers(all=True):
            users.setdefault(c.get("ImageID", ""), []).append(((c.get("Names") or ["?"])[0]).lstrip("/"))
        cache["containers"] = users
    out = []
    for img in client.api.images(name=repo):
        usage = cache["images"].get(img["Id"], img)
        own = int(usage.get("Size") or 0) - max(int(usage.get("SharedSize") or 0), 0)
        out.append({"id": img["Id"], "tags": list(img.get("RepoTags") or []), "labels": img.get("Labels") or {},
                    "created": float(img.get("Created") or 0), "bytes": max(own, 0),
                    "containers": sorted(cache["containers"].get(img["Id"], []))})
    return out


def layers_size(client) -> int:
    """The bytes the engine's image layers take, all images together (`docker system df`)."""
    return int(client.df().get("LayersSize") or 0)


def untag(client, tag: str) -> str:
    """Remove the tag TAG (the image and its layers too when nothing else holds them); '' or why not."""
    import docker

    try:
        client.images.remove(tag)
    except docker.errors.ImageNotFound:
        return ""
    except docker.errors.APIError as exc:
        return str(exc.explanation or exc)[:300]
    return ""


def image_tags(client, image_id: str) -> Optional[list[str]]:
    """IMAGE_ID's tags now, or None when the engine no longer has it."""
    image = get_image(client, image_id)
    return None if image is None else list(image.tags)

"""The podman engine, rootless: the only module that runs the `podman` CLI.

envport runs podman as the user who runs envport; that user's own storage and
runroot hold the images (`podman info` says where).  Rootless podman needs a
subordinate uid/gid range (/etc/subuid, /etc/subgid) for everything but uid 0
in a container.  Without one podman falls back to its single-uid mode: `podman
info` still answers, but an image whose files belong to another uid cannot
even be stored (measured with Debian's podman 4.3.1 and the Debian base image:
`podman load` fails with "potentially insufficient UIDs or GIDs available in
user namespace (requested 0:42 for /etc/gshadow)").  So a single-uid mapping
is REFUSED `podman_single_uid` before anything is built, with the fix.

Answering is not starting: as root on a host whose limits rootful podman cannot raise, `podman info` answers
and every `podman run` (and every RUN of a build) fails with runc's "error setting rlimit type 7: operation not
permitted" (measured: Debian's podman 4.3.1 as root in a container; rootless podman on the same host starts
fine). So the engine is judged by starting one container: the host's own `true` in a throwaway rootfs of that
binary and the libraries it loads, nothing pulled (`podman_cannot_start`, with podman's words and the fix).
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import signal
import tempfile
from pathlib import Path
from typing import Callable, Optional, Sequence

from envport.core.proc import run, spawn, stream_lines
from envport.core.verdict import StepResult, Verdict

# What podman needs to find its storage, config and runroot; nothing else of the host's environment reaches
# it, so no secret reaches a build by accident.
CLI_ENV_KEEP = ("PATH", "HOME", "USER", "LOGNAME", "XDG_RUNTIME_DIR", "XDG_DATA_HOME", "XDG_CONFIG_HOME",
                "CONTAINERS_CONF", "CONTAINERS_STORAGE_CONF", "CONTAINERS_REGISTRIES_CONF", "CONTAINER_HOST",
                "TMPDIR")

MISSING_FIX = "install podman for rootless use (Debian: apt-get install podman uidmap slirp4netns " \
              "fuse-overlayfs catatonit)"


def podman() -> str:
    """The podman client; ENVPORT_PODMAN overrides (a test points it at a missing one)."""
    return os.environ.get("ENVPORT_PODMAN", "podman")


def cli_env() -> dict[str, str]:
    return {k: os.environ[k] for k in CLI_ENV_KEEP if k in os.environ}


def _podman(*args: str, timeout: float = 60, stdin: Optional[str] = None):
    return run([podman(), *args], timeout=timeout, stdin=stdin, env=cli_env())


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if "level=warning" not in ln]
    return lines[-1][:300] if lines else "no output"


def info(timeout: float = 30) -> tuple[Optional[dict], str]:
    """(`podman info` as data, '') when podman answers, else (None, why in one line)."""
    ran = _podman("info", "--format", "json", timeout=timeout)
    if ran.returncode is None:
        return None, ran.why
    if not ran.ok:
        return None, _last_line(ran.stderr or ran.stdout)
    return json.loads(ran.stdout), ""


def mapped_ids(data: dict) -> int:
    """How many uids the user namespace maps (1: podman's single-uid mode)."""
    return sum(int(m.get("size", 0)) for m in (data.get("host", {}).get("idMappings", {}).get("uidmap") or []))


def single_uid_fix(user: str) -> str:
    return (f"give {user} a subordinate id range: `usermod --add-subuids 100000-165535 --add-subgids "
            f"100000-165535 {user}` (as root; any range no other user has), then `podman system migrate` "
            f"as {user}")


def problem(step: str, starts: bool = True) -> Optional[StepResult]:
    """None when podman answers with a usable id mapping (and, with STARTS, can start a container: build, verify,
    witness, parity and the matrix need that; gc and push only read and write its storage), else the REFUSED
    result naming the fix."""
    data, why = info()
    if data is None:
        missing = why.endswith("not found")
        return StepResult(step, Verdict.REFUSED, f"podman does not answer ({why}); " +
                          (MISSING_FIX if missing else "run `podman info` as this user to see why"),
                          reason="podman_missing" if missing else "podman_unreachable")
    rootless = bool(data.get("host", {}).get("security", {}).get("rootless"))
    if rootless and mapped_ids(data) < 2:
        user = os.environ.get("USER") or str(os.getuid())
        return StepResult(step, Verdict.REFUSED,
                          f"rootless podman maps only one uid for {user} (no range in /etc/subuid, "
                          f"/etc/subgid): no Debian image can be stored; {single_uid_fix(user)}",
                          reason="podman_single_uid")
    why = cannot_start(podman(), tuple(sorted(cli_env().items()))) if starts else ""
    if why:
        fix = ("run envport as an unprivileged user with a subordinate id range (rootless podman)" if not rootless
               else "run `podman run --rm --rootfs DIR true` as this user to see why")
        return StepResult(step, Verdict.REFUSED, f"podman answers ({mode(data)}) but cannot start a "
                          f"container: {why}; {fix}", reason="podman_cannot_start")
    return None


@functools.cache
def cannot_start(client: str, env: tuple) -> str:
    """'' when CLIENT starts a container here, else podman's last words. Asked once per process (and per client
    and environment: a test points podman elsewhere), since every command of one run asks the same engine."""
    with tempfile.TemporaryDirectory(prefix="envport-podman-probe-") as rootfs:
        true = _true_rootfs(Path(rootfs))
        if true is None:
            return ""  # no `true` and ldd to copy: not judged here, the build says what fails
        ran = run([client, "run", "--rm", "--network=none", "--rootfs", rootfs, true], timeout=60, env=dict(env))
    if ran.returncode is None:
        return ran.why
    return "" if ran.ok else _last_line(ran.stderr or ran.stdout)


def _true_rootfs(dest: Path) -> Optional[str]:
    """Copy the host's `true` and what `ldd` says it loads under DEST; the binary's path there, or None."""
    true = shutil.which("true")
    if true is None or shutil.which("ldd") is None:
        return None
    true = os.path.realpath(true)
    ldd = run(["ldd", true], timeout=30)
    for path in [true, *re.findall(r"(/\S+) \(0x", ldd.stdout if ldd.ok else "")]:
        inside = dest / path.lstrip("/")
        inside.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, inside)  # the file a symlink names, under the name the loader asks for
    return true


def mode(data: dict) -> str:
    """Rootless or rootful, and where this user's images live: `podman info` in one line."""
    s = data.get("store", {})
    rootless = data.get("host", {}).get("security", {}).get("rootless")
    return (f"{'rootless' if rootless else 'rootful'}, {s.get('graphDriverName', '?')} storage "
            f"{s.get('graphRoot', '?')}, runroot {s.get('runRoot', '?')}")


def image(ref: str) -> Optional[dict]:
    """{'id', 'labels', 'size', 'tags', 'created'} of REF in this user's storage, or None when it has none."""
    ran = _podman("image", "inspect", ref, timeout=30)
    if not ran.ok:
        return None
    (img,) = json.loads(ran.stdout)
    return {"id": img.get("Id", ""), "labels": img.get("Labels") or {}, "size": int(img.get("Size") or 0),
            "tags": [short_name(t) for t in img.get("RepoTags") or []], "created": img.get("Created") or ""}


def short_name(tag: str) -> str:
    """podman stores an unqualified name under localhost/: give it back as the Dockerfile and users write it."""
    return tag.removeprefix("localhost/")


def tag(image_id: str, *refs: str) -> None:
    for ref in refs:
        ran = _podman("tag", image_id, ref)
        if not ran.ok:
            raise RuntimeError(f"podman tag {image_id[:12]} {ref} failed: {_last_line(ran.text)}")


def remove_image(image_id: str) -> None:
    """Drop an image this rebuild left untagged; one that a container still uses stays."""
    _podman("rmi", image_id, timeout=120)


def build(argv: Sequence[str], cwd: Path, on_line: Callable[[str], None]) -> int:
    """`podman build ARGV`, its output line by line; a killed envport takes the build along."""
    proc = spawn([podman(), "build", *argv], cwd=cwd, env=cli_env(), text=True, errors="replace",
                 dies_with=signal.SIGTERM)
    return stream_lines(proc, on_line)


def run_in_image(image_ref: str, argv: Sequence[str], timeout: float = 120, stdin: Optional[str] = None):
    """ARGV in a throwaway container of IMAGE_REF with no network: core.proc's Ran."""
    return _podman("run", "--rm", "-i", "--network", "none", "--entrypoint", argv[0], image_ref, *argv[1:],
                   timeout=timeout, stdin=stdin if stdin is not None else "")


def start(image_ref: str, name: str, network: str, mounts: Sequence[tuple[str, str]] = (),
          labels: Optional[dict] = None):
    """A detached `sleep infinity` container NAME of IMAGE_REF, for testinfra's podman:// backend."""
    args = ["run", "-d", "--name", name, "--network", network, "--entrypoint", "sleep"]
    for host_path, path in mounts:
        args += ["-v", f"{host_path}:{path}:ro"]
    for k, v in sorted((labels or {}).items()):
        args += ["--label", f"{k}={v}"]
    return _podman(*args, image_ref, "infinity", timeout=120)


def remove_container(name: str) -> None:
    _podman("rm", "-f", "-t", "0", name, timeout=60)


def repo_images(repo: str, cache: dict) -> list[dict]:
    """Every image with a tag REPO:* in this user's storage, in engines/docker.py's repo_images shape (tags
    as users write them, without podman's localhost/)."""
    if "containers" not in cache:
        ran = _podman("ps", "-a", "--format", "json", timeout=60)
        users: dict[str, list[str]] = {}
        for c in json.loads(ran.stdout or "[]") if ran.ok else []:
            users.setdefault(c.get("ImageID", ""), []).append((c.get("Names") or ["?"])[0])
        cache["containers"] = users
    ran = _podman("images", "--format", "json", "--filter", f"reference={repo}", timeout=60)
    if not ran.ok:
        raise RuntimeError(f"podman images failed: {_last_line(ran.text)}")
    out = []
    for img in json.loads(ran.stdout or "[]"):
        own = int(img.get("Size") or 0) - max(int(img.get("SharedSize") or 0), 0)
        out.append({"id": img["Id"], "tags": [short_name(t) for t in img.get("Names") or []],
                    "labels": img.get("Labels") or {}, "created": float(img.get("Created") or 0),
                    "bytes": max(own, 0), "containers": sorted(cache["containers"].get(img["Id"], []))})
    return out


def untag(ref: str) -> str:
    """Remove the tag REF (the image too when it was its last); '' or why not."""
    ran = _podman("rmi", ref, timeout=120)
    return "" if ran.ok or "image not known" in ran.text else _last_line(ran.text)


def image_tags(image_id: str) -> Optional[list[str]]:
    found = image(image_id)
    return None if found is None else found["tags"]


def push_options(work: Path, host: str, ca: Optional[Path]) -> list[str]:
    """`podman push` options for registry HOST, files in WORK (a private tmp dir that outlives the push).

    TLS: the site's registry_ca as a --cert-dir holding it (podman reads *.crt there), else the system's
    CAs. Credentials: ENVPORT_REGISTRY_USER/PASSWORD, else the docker config (engines/registry.credentials),
    written to an --authfile in WORK: never on the command line. The manifest digest goes to --digestfile."""
    import base64
    import json
    import shutil as _shutil

    from envport.engines.registry import credentials

    out = ["--tls-verify=true", "--digestfile", str(work / "digest")]
    if ca is not None:
        certs = work / "certs"
        certs.mkdir(mode=0o700)
        _shutil.copyfile(ca, certs / "ca.crt")
        out += ["--cert-dir", str(certs)]
    creds = credentials(host)
    if creds is not None:
        auth = work / "auth.json"
        token = base64.b64encode(f"{creds[0]}:{creds[1]}".encode()).decode()
        fd = os.open(auth, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump({"auths": {host: {"auth": token}}}, fh)
        out += ["--authfile", str(auth)]
    return out


def has_image(ref: str) -> bool:
    return image(ref) is not None

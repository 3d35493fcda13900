"""`envport push` / `envport pull` through a real registry: Debian's docker-registry over TLS on loopback
(.ci/services/registry.sh), a SIF built by envport, the docker engine for image pushes.

What is checked without envport: the manifest and its media types are read back over the registry's own
HTTP API (urllib), and the pulled bytes are compared with the built file.
Interruptions are real: a TCP relay between pull and the registry (below) stops passing bytes after
the first MiBs, and the pull is killed (SIGKILL) or interrupted (SIGINT) in the middle of the layer.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from envport.engines import registry as reg_engine

from .registry_fixture import SITE, SMALL, registry, small_project, small_sif  # noqa: F401 (fixtures)
from .support import as_json, fail_with, run_envport, unique, write_spec
from .test_pull_hostile import make_sif

SIF_CONFIG = "application/vnd.sylabs.sif.config.v1+json"
SIF_LAYER = "application/vnd.sylabs.sif.layer.v1.sif"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def _manifest(registry, repo: str, tag: str) -> dict:
    status, headers, body = registry.get(f"/v2/{repo}/manifests/{tag}", accept=OCI_MANIFEST)
    assert status == 200, (status, body[:300])
    return json.loads(body)


def test_push_then_pull_is_byte_identical_and_the_manifest_is_apptainers(registry, small_sif, tmp_path):
    repo = f"envport/{unique('rt')}"
    proc = run_envport("push", SMALL, "--site", SITE, "--to", registry.url(repo), "--tag", "v1", "--json",
                       root=small_sif.root, timeout=600)
    assert proc.returncode == 0, fail_with(proc, "envport push")
    step = as_json(proc)["steps"][0]
    hash12 = small_sif.hash[:12]
    assert step["verdict"] == "OK" and step["data"]["tags"] == [hash12, "v1"], step

    # The registry's own answer, not envport's: both tags, one manifest in apptainer's layout.
    status, _, body = registry.get(f"/v2/{repo}/tags/list")
    assert status == 200 and sorted(json.loads(body)["tags"]) == sorted([hash12, "v1"]), body
    manifest = _manifest(registry, repo, hash12)
    assert manifest == _manifest(registry, repo, "v1")
    assert manifest["mediaType"] == OCI_MANIFEST and manifest["schemaVersion"] == 2
    assert manifest["config"]["mediaType"] == SIF_CONFIG and manifest["config"]["size"] == 2
    status, _, config = registry.get(f"/v2/{repo}/blobs/{manifest['config']['digest']}")
    assert status == 200 and config == b"{}"
    [layer] = manifest["layers"]
    assert layer["mediaType"] == SIF_LAYER and layer["size"] == small_sif.path.stat().st_size
    assert layer["annotations"] == {"org.opencontainers.image.title": small_sif.path.name}
    assert "org.opencontainers.image.created" in manifest["annotations"]

    out = tmp_path / "pulled"
    proc = run_envport("pull", registry.url(repo, "v1"), "--site", SITE, "-o", str(out), "--json",
                       root=small_sif.root, timeout=600)
    assert proc.returncode == 0, fail_with(proc, "envport pull")
    pulled = f"{repo.rsplit('/', 1)[-1]}_v1.sif"  # named as `apptainer pull` names it, not by the title
    assert sorted(p.name for p in out.iterdir()) == [pulled]
    assert (out / pulled).read_bytes() == small_sif.path.read_bytes()
    assert as_json(proc)["steps"][0]["data"]["digest"] == layer["digest"]


def test_pull_without_the_ca_is_refused_tls(registry, small_sif, tmp_path):
    # The local site has no registry_ca: the system's CAs do not know the test CA.
    repo = f"envport/{unique('tls')}"
    run_envport("push", SMALL, "--site", SITE, "--to", registry.url(repo), root=small_sif.root, check=True,
                timeout=600)
    proc = run_envport("pull", registry.url(repo, small_sif.hash[:12]), "-o", str(tmp_path), "--json",
                       root=small_sif.root, timeout=120)
    assert proc.returncode == 3, fail_with(proc, "pull without the CA")
    step = as_json(proc)["steps"][0]
    assert step["reason"] == "tls_failed" and "registry_ca" in step["detail"], step
    assert list(tmp_path.iterdir()) == []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("verb", ["push", "pull"])
def test_a_registry_that_is_down_is_refused_naming_the_address(small_project, tmp_path, verb):
    host = f"127.0.0.1:{_free_port()}"  # nothing listens there
    args = (["push", SMALL, "--site", SITE, "--to", f"oras://{host}/envport/x:1", "--sif", str(tmp_path / "x.sif")]
            if verb == "push" else ["pull", f"oras://{host}/envport/x:1", "-o", str(tmp_path / "out")])
    if verb == "push":
        make_sif(tmp_path / "x.sif", {"envport.name": SMALL})  # no envport.hash label: under the tag named only
    start = time.monotonic()
    proc = run_envport(*args, "--json", root=small_project, timeout=120)
    assert proc.returncode == 3, fail_with(proc, f"{verb} to a registry that is down")
    step = as_json(proc)["steps"][0]
    assert step["verdict"] == "REFUSED" and step["reason"] == "registry_unreachable", step
    assert host in step["detail"] and "registry.sh" in step["detail"], step
    assert time.monotonic() - start < 60  # a bound on the wait, not a timing claim: oras alone retries ~2 min
    assert not (tmp_path / "out").exists()


class StallingRelay:
    """A TCP relay to the registry that passes the first LIMIT bytes of its answers, then holds the
    connection open and passes nothing more (a registry or network that stalls mid-layer). `uploaded`:
    the bytes the client sent through it."""

    def __init__(self, target: str, limit: int):
        host, port = target.rsplit(":", 1)
        self.target, self.limit, self.sent, self.uploaded = (host, int(port)), limit, 0, 0
        self.stalled = threading.Event()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.host = f"127.0.0.1:{self.server.getsockname()[1]}"
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self.conns += [client, upstream]
            threading.Thread(target=self._pipe, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, True), daemon=True).start()

    def _pipe(self, src, dst, counted):
        try:
            while data := src.recv(1 << 16):
                if counted:
                    room = self.limit - self.sent
                    if room <= 0:
                        self.stalled.set()
                        continue  # read and drop: the client waits forever for these bytes
                    data = data[:room]
                    self.sent += len(data)
                else:
                    self.uploaded += len(data)
                dst.sendall(data)
        except OSError:
            pass

    def close(self):
        self.server.close()
        for c in self.conns:
            c.close()


def _partial_bytes(out: Path, final: Path) -> int:
    """Bytes in the pull's partial file (0: none yet); the pull is then mid-layer."""
    return sum(p.stat().st_size for p in out.glob(f".{final.name}.partial-*")) if out.is_dir() else 0


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGINT], ids=["SIGKILL", "SIGINT"])
def test_an_interrupted_pull_leaves_nothing_under_the_final_name(registry, small_sif, tmp_path, how):
    repo = f"envport/{unique('int')}"
    tag = small_sif.hash[:12]
    run_envport("push", SMALL, "--site", SITE, "--to", registry.url(repo), root=small_sif.root, check=True,
                timeout=600)
    relay = StallingRelay(registry.host, limit=8 << 20)  # the SIF is ~100 MB: this stops mid-layer
    out = tmp_path / "out"
    final = out / f"{repo.rsplit('/', 1)[-1]}_{tag}.sif"
    try:
        pull = subprocess.Popen([sys.executable, "-m", "envport", "-C", str(small_sif.root), "pull",
                                 f"oras://{relay.host}/{repo}:{tag}", "--site", SITE, "-o", str(out)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        assert relay.stalled.wait(120), "the pull never reached the stall point"
        deadline = time.monotonic() + 60
        while not _partial_bytes(out, final) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _partial_bytes(out, final), sorted(p.name for p in out.iterdir()) if out.exists() else "no dir"
        pull.send_signal(how)
        _, err = pull.communicate(timeout=60)
    finally:
        relay.close()
    assert not final.exists(), sorted(p.name for p in out.iterdir())
    if how == signal.SIGINT:
        assert pull.returncode == 130 and "interrupted" in err, (pull.returncode, err)
        assert list(out.iterdir()) == []  # the partial is removed too
    else:
        assert pull.returncode == -signal.SIGKILL
    # The next pull (straight to the registry) completes, and removes the killed pull's partial.
    proc = run_envport("pull", registry.url(repo, tag), "--site", SITE, "-o", str(out), root=small_sif.root,
                       timeout=600)
    assert proc.returncode == 0, fail_with(proc, "pull after the interrupted one")
    assert sorted(p.name for p in out.iterdir()) == [final.name]
    assert final.read_bytes() == small_sif.path.read_bytes()


def test_push_says_its_progress_and_does_not_send_a_layer_the_repository_has(registry, small_sif):
    repo = f"envport/{unique('again')}"
    proc = run_envport("push", SMALL, "--site", SITE, "--to", registry.url(repo), root=small_sif.root, timeout=600)
    assert proc.returncode == 0, fail_with(proc, "envport push")
    mib = small_sif.path.stat().st_size >> 20
    said = [line for line in proc.stderr.splitlines() if line.startswith(f"push {small_sif.path.name}: ")]
    assert len(said) >= 5 and said[-1].endswith(f"{mib} of {mib} MiB"), proc.stderr
    relay = StallingRelay(registry.host, limit=1 << 40)  # passes everything; counts what push sends
    try:
        proc = run_envport("push", SMALL, "--site", SITE, "--to", f"oras://{relay.host}/{repo}:again",
                           root=small_sif.root, timeout=600)
    finally:
        relay.close()
    assert proc.returncode == 0, fail_with(proc, "the second push")
    assert 0 < relay.uploaded < 1 << 20, f"{relay.uploaded} bytes sent for a {mib} MiB layer the registry has"
    status, _, body = registry.get(f"/v2/{repo}/tags/list")
    assert status == 200 and "again" in json.loads(body)["tags"], body


def _peak_rss_mib(*args: str, root: Path) -> int:
    """`envport ARGS` run under a fresh python parent, so that RUSAGE_CHILDREN is that one process's peak."""
    probe = ("import resource, subprocess, sys; "
             "rc = subprocess.run([sys.executable, '-m', 'envport', *sys.argv[1:]]).returncode; "
             "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss >> 10); sys.exit(rc)")
    proc = subprocess.run([sys.executable, "-c", probe, "-C", str(root), *args], capture_output=True, text=True,
                          timeout=600, cwd=root)
    assert proc.returncode == 0, fail_with(proc, f"envport {' '.join(args)}")
    return int(proc.stdout.split()[-1])


def test_push_streams_the_layer_instead_of_holding_it_in_memory(registry, small_sif, tmp_path):
    """The push of a ~100 MB SIF peaks within a few blocks of the push of a few-KB SIF (oras's own upload
    read the whole layer into memory: +100 MB)."""
    # A SIF of a few KB: push checks the file it sends (the trust gate, inspect's content checks) first.
    tiny = make_sif(tmp_path / "tiny.sif", {"envport.name": SMALL})
    base = _peak_rss_mib("push", SMALL, "--site", SITE, "--sif", str(tiny), "--to",
                         registry.url(f"envport/{unique('rss')}", "tiny"), root=small_sif.root)
    peak = _peak_rss_mib("push", SMALL, "--site", SITE, "--to", registry.url(f"envport/{unique('rss')}"),
                         root=small_sif.root)
    size_mib = small_sif.path.stat().st_size >> 20
    assert size_mib >= 64, size_mib
    assert peak - base < 24, f"push of a {size_mib} MiB layer peaked at {peak} MiB, {peak - base} over a few-KB push"


def test_a_tampered_layer_is_refused_and_leaves_nothing(registry, small_sif, tmp_path):
    """A registry answering other bytes than its manifest's digest (here: a manifest pushed by hand over the
    HTTP API naming another blob's digest with this layer's size) is FAILED digest_mismatch, no file."""
    repo = f"envport/{unique('bad')}"
    tag = small_sif.hash[:12]
    run_envport("push", SMALL, "--site", SITE, "--to", registry.url(repo), root=small_sif.root, check=True,
                timeout=600)
    manifest = _manifest(registry, repo, tag)
    manifest["layers"][0]["size"] -= 1  # the registry serves the whole blob: one byte more than promised
    client = reg_engine.Client(registry.host, str(registry.ca))
    ref = reg_engine.Ref(registry.host, repo, "bad")
    client.registry.upload_manifest(manifest, client.container(ref)).raise_for_status()
    proc = run_envport("pull", registry.url(repo, "bad"), "--site", SITE, "-o", str(tmp_path), "--json",
                       root=small_sif.root, timeout=600)
    assert proc.returncode == 1, fail_with(proc, "pull of a manifest whose size lies")
    step = as_json(proc)["steps"][0]
    assert step["reason"] == "digest_mismatch", step
    assert list(tmp_path.iterdir()) == []


def test_docker_target_pushes_the_image_through_the_engine(registry, small_project, docker_client, base_image,
                                                           throwaway_images):
    name = "tiny-push"  # its own name: throwaway_images removes every image of a name afterwards
    write_spec(small_project, name, env={"TINY_GREETING": "pushed"})
    throwaway_images.append(name)
    built = run_envport("build", name, "--target", "docker", "--site", SITE, "--json", root=small_project,
                        timeout=900)
    assert built.returncode == 0, fail_with(built, "envport build --target docker")
    tag = as_json(built)["steps"][-1]["data"]["image"]
    repo = f"envport/{unique('img')}"
    proc = run_envport("push", name, "--target", "docker", "--site", SITE, "--to", registry.url(repo), "--json",
                       root=small_project, timeout=900)
    assert proc.returncode == 0, fail_with(proc, "envport push --target docker")
    hash12 = tag.rsplit(":", 1)[1]
    status, _, body = registry.get(f"/v2/{repo}/manifests/{hash12}",
                                   accept="application/vnd.docker.distribution.manifest.v2+json")
    assert status == 200, body[:300]
    # The config blob the registry holds is the image's own config: its digest is the engine's image id.
    assert json.loads(body)["config"]["digest"] == docker_client.images.get(tag).id
    for pushed in as_json(proc)["steps"][0]["data"]["pushed"]:
        docker_client.images.remove(pushed)


def test_credentials_come_from_the_environment_then_the_docker_config(tmp_path):
    # No registry here checks a password (docker-registry runs without htpasswd in the tests): what is
    # tested is which source is read, and that the push argv never carries them.
    import base64

    config = tmp_path / "config.json"
    config.write_text(json.dumps({"auths": {"reg.example:5000": {
        "auth": base64.b64encode(b"alice:from-config").decode()}}}))
    env = {"DOCKER_CONFIG": str(tmp_path)}
    assert reg_engine.credentials("reg.example:5000", env) == ("alice", "from-config")
    assert reg_engine.credentials("other.example", env) is None
    env.update(ENVPORT_REGISTRY_USER="bob", ENVPORT_REGISTRY_PASSWORD="from-env")
    assert reg_engine.credentials("reg.example:5000", env) == ("bob", "from-env")


@pytest.mark.parametrize("text", ["oras:/h/r", "docker://h/r:t", "oras://h/Upper:t", "oras://h/r:bad tag",
                                  "oras://h/", "oras://h/r:" + "t" * 129])
def test_bad_references_are_usage_errors(small_project, text):
    proc = run_envport("pull", text, root=small_project, timeout=60)
    assert proc.returncode == 2 and "oras://HOST[:PORT]/REPO[:TAG]" in proc.stderr, fail_with(proc, "pull")


def test_a_tag_the_registry_lacks_is_refused_not_found(registry, small_project, tmp_path):
    proc = run_envport("pull", registry.url(f"envport/{unique('none')}", "v0"), "--site", SITE, "-o", str(tmp_path),
                       "--json", root=small_project, timeout=120)
    assert proc.returncode == 3, fail_with(proc, "pull of a tag that is not there")
    step = as_json(proc)["steps"][0]
    assert step["reason"] == "not_found" and "check the repository and tag" in step["detail"], step
    assert proc.stderr == "" and list(tmp_path.iterdir()) == []  # oras's own error print is silenced

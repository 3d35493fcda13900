"""The admin's round trip on real parts: demo-cpu's SIF (built once a session, tests/sif_fixtures.py
``demo_sif``), signed by envport, pushed to the real registry (Debian's docker-registry over TLS), pulled into
an empty folder with only the public key, inspected, and run with `witness` under a site that requires it
signed; its SBOM compared with `pip list` and `dpkg-query -W` run inside it.

The pull runs as another user (uid/gid 65534, `setpriv --reuid --regid --clear-groups`). Where this
interpreter lives under a home that user cannot enter (pyenv under a 0700 /root), the pull runs in a private
mount namespace (`unshare --mount --propagation private`) whose view of that home is a 0755 tmpfs holding only
the interpreter's folder, bound back at its own path: this test changes no host state (the namespace and its
mounts end with the process). Only where neither works (not root, no setpriv) the pull runs as this user with
an empty HOME and DOCKER_CONFIG, and the test says which in its `pull_user` property and on stdout.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from .registry_fixture import registry  # noqa: F401
from .sif_fixtures import SIF_TIMEOUT, sif_env
from .support import ENV_NAME, as_json, fail_with, run_envport, unique, write_site
from .test_registry import OCI_MANIFEST, SIF_CONFIG, SIF_LAYER, _manifest
from .test_sbom import DPKG_QUERY, PIP_LIST, _components, _dpkg, _pip, _validate
from .test_sif_sign import flip, new_key

pytest_plugins = ["tests.sif_fixtures"]
OTHER_UID = 65534


# Run by root in the private namespace: $1 the home the other user cannot enter, $2 the interpreter's folder
# in it, $3 an empty staging dir; then the command. The folder is bound aside, a 0755 tmpfs covers the home, and
# the folder is bound back at its own path, so the interpreter, its libpython and its .pth paths are unchanged.
_REVEAL = ('set -e; home=$1; dir=$2; stage=$3; shift 3; mount --bind "$home/$dir" "$stage"; '
           'mount -t tmpfs -o mode=0755 envport-test-home "$home"; mkdir "$home/$dir"; '
           'mount --bind "$stage" "$home/$dir"; exec "$@"')


def _closed_ancestor(path: Path) -> tuple[Path, str] | None:
    """(the first ancestor of PATH others cannot enter, the name of its child on the way to PATH)."""
    for parent in reversed(path.parents):
        if parent != Path("/") and not parent.stat().st_mode & 0o001:
            return parent, path.relative_to(parent).parts[0]
    return None


def _other_user_argv(stage: Path) -> list[str]:
    """An argv prefix that runs this interpreter as OTHER_UID (ends with the interpreter), else []."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return []
    become = ["setpriv", f"--reuid={OTHER_UID}", f"--regid={OTHER_UID}", "--clear-groups", sys.executable]
    tries = [become]
    closed = _closed_ancestor(Path(sys.executable).resolve())
    if closed and shutil.which("unshare"):
        tries.append(["unshare", "--mount", "--propagation", "private", "sh", "-c", _REVEAL, "envport-reveal",
                      str(closed[0]), closed[1], str(stage), *become])
    for argv in tries:
        probe = subprocess.run([*argv, "-c", "import envport.cli, oras"], capture_output=True, timeout=60, cwd="/")
        if probe.returncode == 0:
            return argv
    return []


# demo-cpu's SIF (mksquashfs of ~1.1 GB) is built in this test's setup when no test before it built it.
@pytest.mark.timeout(2400)
def test_signed_pushed_pulled_inspected_and_run_under_require_signed(demo_sif, registry, tmp_path,
                                                                     record_property):
    from envport.sif.format import primary_partition, read_sif
    from envport.sif.gate import gate
    from envport.sif.run import ch_run_argv, ch_run_env, mounted
    from envport.sif.sbom import SBOM_DATATYPE

    priv, pub = new_key(tmp_path, "ed25519")
    signed = tmp_path / "signed" / demo_sif.path.name
    signed.parent.mkdir()
    shutil.copyfile(demo_sif.path, signed)
    run_envport("sign", str(signed), "--key", str(priv), root=demo_sif.root, check=True, timeout=600)
    cleanup: list[Path] = []
    site = write_site(demo_sif.root, f"roundtrip-{tmp_path.name}"[:60], registry_ca=str(registry.ca),
                      trust={"keys": [str(pub)], "require_signed": True})
    try:
        repo = f"envport/{unique('roundtrip')}"
        run_envport("push", ENV_NAME, "--sif", str(signed), "--site", site, "--to", registry.url(repo, "v1"),
                    root=demo_sif.root, check=True, timeout=900)
        # The registry's own answer over its HTTP API: apptainer's media types.
        manifest = _manifest(registry, repo, "v1")
        assert manifest["mediaType"] == OCI_MANIFEST and manifest["config"]["mediaType"] == SIF_CONFIG
        [layer] = manifest["layers"]
        assert layer["mediaType"] == SIF_LAYER and layer["size"] == signed.stat().st_size

        # Pull into an empty folder with only the public key (no private key, no project, empty HOME).
        # In /tmp, not under pytest's 0700 basetemp: the other user must reach it.
        alone = Path(tempfile.mkdtemp(prefix="envport-admin-"))
        cleanup.append(alone)
        (alone / "home").mkdir()
        (alone / "pulled").mkdir()
        shutil.copyfile(pub, alone / "pub.pem")
        (alone / "ca.crt").write_bytes(registry.ca.read_bytes())
        (alone / "sites").mkdir()
        (alone / "specs").mkdir()
        write_site(alone, "admin", registry_ca=str(alone / "ca.crt"), trust={"keys": ["../pub.pem"]})
        (alone / "stage").mkdir()
        as_other = _other_user_argv(alone / "stage")
        if as_other:
            for path in (alone, *alone.rglob("*")):
                os.chown(path, OTHER_UID, OTHER_UID)
        record_property("pull_user", OTHER_UID if as_other else os.geteuid())
        print(f"pull as uid {OTHER_UID if as_other else os.geteuid()}")
        env = {**sif_env(), "HOME": str(alone / "home"), "DOCKER_CONFIG": str(alone / "home" / ".docker")}
        proc = subprocess.run([*(as_other or [sys.executable]), "-m", "envport", "-C", str(alone), "pull",
                               registry.url(repo, "v1"), "--site", "admin", "-o", str(alone / "pulled"),
                               "--json"], capture_output=True, text=True, env=env, cwd=alone, timeout=900)
        assert proc.returncode == 0, fail_with(proc, "envport pull as the admin")
        # named after the reference (REPO's last part, the tag), as apptainer pull names it
        pulled = alone / "pulled" / f"{repo.rsplit('/', 1)[-1]}_v1.sif"
        assert sorted(p.name for p in (alone / "pulled").iterdir()) == [pulled.name]
        assert pulled.read_bytes() == signed.read_bytes()
        assert "signatures verified against pub.pem" in as_json(proc)["steps"][0]["detail"]
        if as_other:
            assert pulled.stat().st_uid == OTHER_UID
            # root does not run a file another user can rewrite after the check (issue 35, G2): refused by
            # name before anything is mounted; root runs its own copy.
            proc = run_envport("witness", ENV_NAME, "--target", "apptainer", "--sif", str(pulled), "--site",
                               site, root=demo_sif.root, env=sif_env(), timeout=SIF_TIMEOUT)
            assert proc.returncode == 3 and "[sif_unsafe]" in proc.stdout + proc.stderr, \
                fail_with(proc, "witness of another user's file")
            assert f"owned by uid {OTHER_UID}" in proc.stdout + proc.stderr
            mine = tmp_path / "mine" / pulled.name
            mine.parent.mkdir()
            shutil.copyfile(pulled, mine)
            pulled = mine

        # inspect: signed by that key, and the signature covers the SBOM.
        proc = run_envport("inspect", str(pulled), "--key", str(alone / "pub.pem"), "--json", root=demo_sif.root,
                           timeout=600)
        data = as_json(proc)
        step = next(s for s in data["steps"] if s["step"].startswith("signatures "))
        assert step["verdict"] == "OK" and str(alone / "pub.pem") in step["detail"], step
        sbom_id = next(d.id for d in read_sif(pulled).descriptors if d.datatype == SBOM_DATATYPE)
        assert sbom_id in data["signatures"]["signatures"][0]["objects"]

        # The SBOM inside lists exactly what pip and dpkg show inside, and is schema-valid.
        dumped = subprocess.run(["siftool", "dump", str(sbom_id), str(pulled)], capture_output=True, timeout=60)
        assert dumped.returncode == 0, dumped
        doc = _validate(dumped.stdout.decode())
        with mounted(gate(pulled)) as mnt:
            inside = {name: subprocess.run(ch_run_argv(str(mnt), argv), capture_output=True, text=True,
                                           env=ch_run_env(), timeout=300)
                      for name, argv in (("pip", PIP_LIST), ("dpkg", DPKG_QUERY))}
        assert _components(doc, "pypi") == _pip(inside["pip"].stdout)
        assert _components(doc, "deb") == _dpkg(inside["dpkg"].stdout)
        assert any(name == "torch" for name, _ in _components(doc, "pypi"))

        # witness under require_signed: the pulled file runs; a tampered copy is refused before any mount.
        tmp = tmp_path / "tmp"
        tmp.mkdir()
        proc = run_envport("witness", ENV_NAME, "--target", "apptainer", "--sif", str(pulled), "--site", site,
                           root=demo_sif.root, env=sif_env(TMPDIR=str(tmp)), timeout=SIF_TIMEOUT)
        assert proc.returncode == 0, fail_with(proc, "witness of the pulled SIF")
        # A fresh TMPDIR for the refused run: the admitted one left torch's own cache dir in the first.
        tmp = tmp_path / "tmp-refused"
        tmp.mkdir()
        tampered = tmp_path / "tampered.sif"
        shutil.copyfile(pulled, tampered)
        flip(tampered, primary_partition(read_sif(tampered)).offset + 4096)
        proc = run_envport("witness", ENV_NAME, "--target", "apptainer", "--sif", str(tampered), "--site", site,
                           root=demo_sif.root, env=sif_env(TMPDIR=str(tmp)), timeout=SIF_TIMEOUT)
        assert proc.returncode == 3 and "[bad_signature]" in proc.stderr, fail_with(proc, "witness of a tampered SIF")
        assert list(tmp.iterdir()) == [], "a mount directory was made for a refused SIF"
    finally:
        (demo_sif.root / "sites" / f"{site}.yaml").unlink()
        for path in cleanup:
            shutil.rmtree(path, ignore_errors=True)

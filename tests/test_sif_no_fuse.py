"""Issue 37, U2: a SIF proved by an unprivileged user who has no FUSE, and its SBOM read without mounting.

On many clusters `/dev/fuse` is root's alone, so squashfuse cannot mount and a user is not root for the
kernel's loop mount. `verify`, `witness` and `sbom --from-content` then extract the judged partition with
unsquashfs (from the same open descriptor) into a private 0700 folder and run it with ch-run; `sbom FILE.sif`
reads the CycloneDX object the SIF carries and mounts nothing.

The unprivileged user is uid 65534 (`setpriv`, this test runs as root in CI and says so), with the checkout's
envport in the podman tests' user venv (tests/test_podman.py `user_venv`: a venv under /var/tmp other users
can run, kept). Its commands run under `bwrap --dev /dev`: a fresh /dev with no fuse device, so the test
holds on a host whose /dev/fuse is world-usable too. Host changes, said so: a folder under /var/tmp holding a
copy of the small SIF (removed afterwards) and that venv.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
from pathlib import Path

import pytest

from .sif_fixtures import build_sif, require_sif_tools
from .support import copy_project, missing, run_envport, write_site, write_spec
from .registry_fixture import registry  # noqa: F401
from .test_podman import user_venv  # noqa: F401

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
NAME = "nofuse"


@pytest.fixture(scope="module")
def small(base_image, tmp_path_factory):
    """A small SIF with witnesses (six, a CLI), built once for this module (lz4: seconds)."""
    require_sif_tools()
    root = copy_project(tmp_path_factory.mktemp("nofuse-project"))
    write_spec(root, NAME, witnesses={"imports": ["six"],
                                      "cli": [{"cmd": "python -c 'import six; print(six.__version__)'",
                                               "expect": "1\\.16\\.0"}]})
    write_site(root, "sif-fast", apptainer={"compression": "lz4"})
    return build_sif(root, NAME, "sif-fast")


@pytest.fixture
def shared(small):
    """The SIF copied into a fresh root-owned 0755 folder under /var/tmp (as an admin's shared folder is), and
    a work folder of uid 65534's own; both removed afterwards."""
    if os.geteuid() != 0:
        missing("acting as another user (setpriv --reuid) needs root")
    for tool in ("setpriv", "bwrap"):
        if shutil.which(tool) is None:
            missing(f"no {tool} (apt-get install util-linux bubblewrap)")
    folder = Path("/var/tmp") / f"envport-nofuse-{secrets.token_hex(6)}"
    folder.mkdir(mode=0o755)
    try:
        sif = folder / small.path.name
        shutil.copyfile(small.path, sif)
        sif.chmod(0o644)
        work = folder / "work"
        work.mkdir(mode=0o700)
        os.chown(work, 65534, 65534)
        yield sif, work
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def as_nobody_without_fuse(venv: Path, work: Path, *argv: str, program: str = "envport") -> subprocess.CompletedProcess:
    """`envport ARGV` (or PROGRAM ARGV) as uid 65534 in WORK, in a /dev without fuse (bwrap --dev), with a
    login-like env."""
    env = ["env", "-i", f"HOME={work}", "USER=nobody", f"PATH={venv}/bin:/usr/sbin:/usr/bin:/sbin:/bin",
           f"TMPDIR={work}"]
    return subprocess.run([*NOBODY, *env, "bwrap", "--dev-bind", "/", "/", "--dev", "/dev", "--",
                           program, *argv], cwd=work, capture_output=True, text=True, timeout=600)


def _leftovers(work: Path) -> list[str]:
    return sorted(p.name for p in work.iterdir() if p.name.startswith("envport-sif-"))


def test_verify_witness_and_sbom_without_fuse_as_another_user(user_venv, shared):
    sif, work = shared
    runs = {
        "verify": ["verify", NAME, "--target", "apptainer", "--sif", str(sif), "--json"],
        "witness": ["witness", NAME, "--target", "apptainer", "--sif", str(sif), "--json"],
        "sbom": ["sbom", str(sif), "--from-content", "-o", str(work / "sbom.cdx.json")],
    }
    for what, argv in runs.items():
        proc = as_nobody_without_fuse(user_venv, work, *argv)
        assert proc.returncode == 0, (what, proc.stdout[-2000:], proc.stderr[-3000:])
        # It really had no FUSE: the extraction says so, and why.
        assert "no FUSE mount for this user: extracting" in proc.stderr, (what, proc.stderr[-2000:])
        assert _leftovers(work) == [], (what, _leftovers(work))  # the extracted tree is gone
        if what != "sbom":
            steps = json.loads(proc.stdout)["steps"]
            assert steps and all(s["verdict"] in ("OK", "skipped") for s in steps), steps
    witnessed = {s["step"] for s in json.loads(as_nobody_without_fuse(user_venv, work, *runs["witness"]).stdout)["steps"]}
    assert "import six" in witnessed, witnessed
    doc = json.loads((work / "sbom.cdx.json").read_text())
    assert "pkg:pypi/six@1.16.0" in {c.get("purl") for c in doc["components"]}


def test_the_carried_sbom_is_read_without_mounting_anything(user_venv, shared):
    """`sbom FILE.sif` as that user without FUSE: the object, no extraction, no mount; equal to the content."""
    sif, work = shared
    carried = as_nobody_without_fuse(user_venv, work, "sbom", str(sif), "-o", str(work / "carried.json"))
    assert carried.returncode == 0, carried.stderr[-2000:]
    assert "the SIF's own SBOM object sbom.cdx.json" in carried.stderr and "extracting" not in carried.stderr
    assert "no signature verified against the site's trust.keys covers it" in carried.stderr
    content = as_nobody_without_fuse(user_venv, work, "sbom", str(sif), "--from-content", "-o",
                                     str(work / "content.json"))
    assert content.returncode == 0, content.stderr[-2000:]
    purls = [sorted(c["purl"] for c in json.loads((work / f).read_text())["components"])
             for f in ("carried.json", "content.json")]
    assert purls[0] == purls[1] and "pkg:pypi/six@1.16.0" in purls[0]


def test_a_signed_carried_sbom_names_the_key_that_covers_it(small, tmp_path):
    from .test_sif_sign import new_key

    priv, pub = new_key(tmp_path, "ed25519")
    copy = tmp_path / small.path.name
    shutil.copyfile(small.path, copy)
    run_envport("sign", str(copy), "--key", str(priv), root=small.root, timeout=300, check=True)
    write_site(small.root, "trusts-it", trust={"keys": [str(pub)]})
    proc = run_envport("sbom", str(copy), "--site", "trusts-it", root=small.root, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"covered by a signature verified against {pub.name}" in proc.stderr, proc.stderr


def test_root_never_extracts(monkeypatch):
    """Root loop-mounts: an extraction as root would recreate setuid-root files and device nodes on disk."""
    from envport.sif import run as sif_run

    if os.geteuid() != 0:
        pytest.skip("judges root's ways to reach a partition: run as root")
    monkeypatch.setenv(sif_run.MOUNT_ENV, sif_run.EXTRACT)
    assert sif_run.EXTRACT not in sif_run.access_kinds()


def test_an_extraction_is_bounded_by_the_judged_partition(small, tmp_path):
    """A squashfs whose superblock claims more bytes than its partition (what unsquashfs bounds its reads by) is
    never extracted: unsquashfs would read past the judged object."""
    import struct

    from envport.sif.format import primary_partition, read_sif
    from envport.sif.handle import SifFile
    from envport.sif.run import MountError, _extract

    copy = tmp_path / "claims-more.sif"
    shutil.copyfile(small.path, copy)
    part = primary_partition(read_sif(copy))
    with open(copy, "r+b") as fh:
        fh.seek(part.offset + 40)
        fh.write(struct.pack("<Q", part.size + 4096))
    dest = tmp_path / "rootfs"
    dest.mkdir()
    with SifFile.open(copy) as sif, pytest.raises(MountError, match="more than its partition"):
        _extract(sif, part.offset, part.size, dest)
    assert list(dest.iterdir()) == []


LMOD_INIT = Path("/usr/share/lmod/lmod/init/bash")


def test_the_admins_day_end_to_end_as_another_user(user_venv, small, registry, tmp_path):
    """Issue 37's admin's day, as uid 65534 without FUSE in a folder holding only a public key and a site file:
    pull from the CI registry (signature verified) -> inspect (content verdict from the spec and pins the SIF
    embeds, signer named) -> witness -> module install -> `module load` with the real Lmod -> the wrapper's
    output; under require_signed the unsigned variant is refused by pull before it gets its name and by witness
    before anything is mounted. Host changes, said so: a folder under /var/tmp (removed) and the registry
    repository this test pushes to (a fresh name)."""
    from .registry_fixture import REGISTRY_DIR
    from .support import unique
    from .test_sif_sign import new_key

    if not LMOD_INIT.is_file():
        missing("Lmod not installed: apt-get install lmod")
    priv, pub = new_key(tmp_path, "ed25519")
    signed = tmp_path / small.path.name
    shutil.copyfile(small.path, signed)
    run_envport("sign", str(signed), "--key", str(priv), root=small.root, timeout=300, check=True)
    write_site(small.root, "push-reg", registry_ca=str(REGISTRY_DIR / "ca.crt"))
    repo = f"envport/{unique('day')}"
    for sif, tag in ((signed, "signed"), (small.path, "unsigned")):
        run_envport("push", NAME, "--site", "push-reg", "--sif", str(sif), "--to", registry.url(repo, tag),
                    root=small.root, timeout=300, check=True)
    folder = Path("/var/tmp") / f"envport-day-{secrets.token_hex(6)}"
    folder.mkdir(mode=0o755)
    try:
        os.chown(folder, 65534, 65534)
        os.chmod(folder, 0o700)
        shutil.copyfile(pub, folder / "builder.pub.pem")
        (folder / "cluster.yaml").write_text(json.dumps({
            "name": "cluster", "registry_ca": str(REGISTRY_DIR / "ca.crt"),
            "trust": {"keys": ["builder.pub.pem"], "require_signed": True}}))
        for p in (folder / "builder.pub.pem", folder / "cluster.yaml"):
            os.chown(p, 65534, 65534)

        def day(*argv: str) -> subprocess.CompletedProcess:
            return as_nobody_without_fuse(user_venv, folder, *argv)

        site = ["--site", "cluster.yaml"]
        pulled = day("pull", registry.url(repo, "signed"), "-o", "sifs", *site, "--json")
        assert pulled.returncode == 0, pulled.stdout + pulled.stderr
        sif = json.loads(pulled.stdout)["steps"][0]["data"]["path"]
        inspected = day("inspect", sif, *site, "--json")
        steps = json.loads(inspected.stdout)["steps"]
        assert inspected.returncode == 0 and "matches the spec it embeds" in steps[0]["detail"], steps
        assert steps[1]["verdict"] == "OK", steps[1]  # the signatures, checked against the site's key
        witnessed = day("witness", NAME, "--target", "apptainer", "--sif", sif, *site, "--json")
        rows = json.loads(witnessed.stdout)["steps"]
        assert witnessed.returncode == 0 and "import six" in {r["step"] for r in rows}, rows
        installed = day("module", "install", sif, "--modulepath", "modules", *site, "--json")
        assert installed.returncode == 0, installed.stdout + installed.stderr
        assert "verified: " in json.loads(installed.stdout)["steps"][0]["data"]["signer"]
        loaded = as_nobody_without_fuse(user_venv, folder, "-c", f"source {LMOD_INIT}; module use {folder}/modules; "
                                        f"module load {NAME}; python -c 'import six; print(six.__version__)'",
                                        program="bash")
        assert loaded.returncode == 0 and loaded.stdout.strip().splitlines()[-1] == "1.16.0", loaded.stderr[-2000:]
        refused = day("pull", registry.url(repo, "unsigned"), "-o", "sifs", *site, "--json")
        assert refused.returncode == 3 and json.loads(refused.stdout)["steps"][0]["reason"] == "unsigned"
        assert sorted(os.listdir(folder / "sifs")) == [Path(sif).name]  # nothing under the unsigned one's name
        shutil.copyfile(small.path, folder / "unsigned.sif")
        os.chown(folder / "unsigned.sif", 65534, 65534)
        ran = day("witness", NAME, "--target", "apptainer", "--sif", "unsigned.sif", *site)
        assert ran.returncode == 3 and "[unsigned]" in ran.stdout + ran.stderr, ran.stdout + ran.stderr
        assert "extracting" not in ran.stderr  # refused before any byte was mounted or extracted
    finally:
        shutil.rmtree(folder, ignore_errors=True)

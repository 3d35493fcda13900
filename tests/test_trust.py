"""Trust: `envport inspect` lists and checks every signature; a site's `trust.require_signed` refuses unsigned
or foreign SIFs before anything is mounted (sif/run.py `admit`) and before `pull` names a file.

The inspect tests read apptainer's own signed test SIFs (shared/sif-testdata, signed by sif's library); the
gate tests run `envport witness` on tiny-sif's SIF (built once a session, tests/sif_fixtures.py) with a
site profile written into the session project (a new file in sites/, nothing else changes there).
"""

from __future__ import annotations

import os
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from .registry_fixture import REGISTRY_DIR, SITE, SMALL, registry, small_project, small_sif  # noqa: F401
from .sif_fixtures import SIF_TIMEOUT, sif_env
from .support import as_json, fail_with, run_envport, unique, write_site
from .test_sif_sign import NAME_AT, TESTDATA, descriptor_at, flip, new_key, upstream

pytest_plugins = ["tests.sif_fixtures"]

SIGNED = "one-group-signed-dsse.sif"
RSA_PUB = TESTDATA / "keys" / "rsa-public.pem"


def inspect(path: Path, root: Path, *args: str):
    return run_envport("inspect", str(path), *args, root=root, timeout=120)


def signature_step(proc) -> dict:
    data = as_json(proc)
    # The envelope every --json output shares (core/verdict.py envelope).
    assert {"command", "exit_code", "steps", "problems"} <= set(data), sorted(data)
    assert data["command"] == "inspect" and data["exit_code"] == proc.returncode
    return next(s for s in data["steps"] if s["step"].startswith("signatures "))


def test_inspect_lists_each_signature_and_verifies_it_with_the_key_given(tmp_path):
    sif = upstream(tmp_path, SIGNED)
    proc = inspect(sif, tmp_path, "--key", str(RSA_PUB))
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("signature "))
    assert "dsse sha256 group 1, covers 1, 2" in line and line.endswith(f"verified by {RSA_PUB} "
                                                                        "(SHA256:BhCwr7qZulYcOMSl2Jt2DuYHxHNnN6th4NdMqR/PGa4)")
    assert "OK       signatures one-group-signed-dsse.sif: groups 1 signed" in proc.stdout
    step = signature_step(inspect(sif, tmp_path, "--key", str(RSA_PUB), "--json"))
    assert step["verdict"] == "OK"


def test_inspect_without_a_key_lists_and_claims_nothing(tmp_path):
    proc = inspect(upstream(tmp_path, SIGNED), tmp_path, "--json")
    step = signature_step(proc)
    assert step["verdict"] == "skipped" and "not checked: no key given" in step["detail"]
    assert as_json(proc)["signatures"]["signatures"][0]["verdict"] == "unchecked"


def test_inspect_names_the_changed_descriptor_as_a_bad_signature(tmp_path):
    sif = upstream(tmp_path, SIGNED)
    flip(sif, descriptor_at(sif, 1) + NAME_AT)  # a byte of object 1's descriptor: its name
    proc = inspect(sif, tmp_path, "--key", str(RSA_PUB), "--json")
    step = signature_step(proc)
    assert proc.returncode == 3 and step["reason"] == "bad_signature", step
    assert "the descriptor of object 1 (FS)" in step["detail"], step["detail"]


def test_inspect_reads_the_sites_trust_keys_and_a_stranger_is_untrusted(tmp_path):
    sif = upstream(tmp_path, SIGNED)
    (tmp_path / "specs").mkdir()
    (tmp_path / "sites").mkdir()
    shutil.copyfile(TESTDATA / "keys" / "ecdsa-public.pem", tmp_path / "sites" / "other.pem")
    write_site(tmp_path, "strangers", trust={"keys": ["other.pem"]})  # relative to the site file's folder
    step = signature_step(inspect(sif, tmp_path, "--site", "strangers", "--json"))
    assert step["reason"] == "untrusted_signer" and "other.pem" in step["detail"], step


def test_require_signed_without_keys_is_an_invalid_site(tmp_path):
    sif = upstream(tmp_path, SIGNED)
    (tmp_path / "specs").mkdir()
    (tmp_path / "sites").mkdir()
    write_site(tmp_path, "strict", trust={"require_signed": True})
    proc = inspect(sif, tmp_path, "--site", "strict")
    assert proc.returncode == 2 and "trust" in proc.stderr and "keys" in proc.stderr, fail_with(proc, "inspect")


MOUNT_TOOLS = ("mount", "squashfuse", "squashfuse_ll", "apptainer")


@dataclass
class Strict:
    sif: Path  # an unsigned copy of tiny-sif's SIF
    site: str  # trusts one fresh key (pub) and requires it
    key: Path  # its private key
    tmp: Path  # TMPDIR of the runs: every mount directory is made here
    marker: Path  # written by the mount tools' wrappers the moment any of them is started
    env: dict


@pytest.fixture
def strict(tiny_sif, tmp_path):
    """A site requiring a fresh key, and PATH wrappers of every tool a SIF mount or run starts (mount,
    squashfuse, squashfuse_ll, apptainer): each appends its name to a marker file and execs the real one
    (no behaviour changes; the marker proves whether a mount was ever attempted, also one later undone)."""
    priv, pub = new_key(tmp_path, "ed25519")
    sif = tmp_path / tiny_sif.path.name
    shutil.copyfile(tiny_sif.path, sif)
    site = write_site(tiny_sif.root, f"strict-{tmp_path.name}"[:60], apptainer={"compression": "lz4"},
                      trust={"keys": [str(pub)], "require_signed": True})
    tmp, bin_dir, marker = tmp_path / "tmp", tmp_path / "bin", tmp_path / "mount-attempts"
    tmp.mkdir()
    bin_dir.mkdir()
    for tool in MOUNT_TOOLS:
        real = shutil.which(tool)
        if real:
            wrapper = bin_dir / tool
            wrapper.write_text(f"#!/bin/sh\necho {tool} >> {shlex.quote(str(marker))}\nexec {shlex.quote(real)} \"$@\"\n")
            wrapper.chmod(0o755)
    env = sif_env(TMPDIR=str(tmp), PATH=f"{bin_dir}:{os.environ['PATH']}")
    yield Strict(sif, site, priv, tmp, marker, env)
    (tiny_sif.root / "sites" / f"{site}.yaml").unlink()


def witness(tiny_sif, sif: Path, strict: Strict):
    return run_envport("witness", tiny_sif.name, "--target", "apptainer", "--sif", str(sif), "--site", strict.site,
                       root=tiny_sif.root, env=strict.env, timeout=SIF_TIMEOUT)


def test_require_signed_refuses_an_unsigned_sif_before_it_is_mounted(tiny_sif, strict):
    proc = witness(tiny_sif, strict.sif, strict)
    assert proc.returncode == 3 and "[unsigned]" in proc.stderr, fail_with(proc, "witness")
    assert not strict.marker.exists(), f"a mount tool was started: {strict.marker.read_text()}"
    assert list(strict.tmp.iterdir()) == [], sorted(p.name for p in strict.tmp.iterdir())


def test_require_signed_gates_the_embedded_spec_before_it_is_read(tiny_sif, strict, tmp_path):
    """An admin without the project (the spec the SIF embeds, issue 27 row 5): the site's gate comes first,
    before the file is listed (unsquashfs) or its spec object trusted."""
    import subprocess
    import sys

    admin, bin_dir = tmp_path / "admin", tmp_path / "bin"
    admin.mkdir()
    lister = bin_dir / "unsquashfs"
    lister.write_text(f"#!/bin/sh\necho unsquashfs >> {shlex.quote(str(strict.marker))}\n"
                      f"exec {shlex.quote(shutil.which('unsquashfs'))} \"$@\"\n")
    lister.chmod(0o755)
    site = tiny_sif.root / "sites" / f"{strict.site}.yaml"
    proc = subprocess.run([sys.executable, "-m", "envport", "witness", tiny_sif.name, "--target", "apptainer",
                           "--sif", str(strict.sif), "--site", str(site)], cwd=admin, capture_output=True,
                          text=True, timeout=SIF_TIMEOUT, env=strict.env)
    assert proc.returncode == 3 and "[unsigned]" in proc.stderr, fail_with(proc, "witness --sif outside a project")
    assert "spec: the one" not in proc.stdout and not strict.marker.exists(), proc.stdout


def test_require_signed_refuses_a_foreign_signer_and_runs_the_trusted_one(tiny_sif, strict, tmp_path):
    (tmp_path / "other").mkdir()
    other, _ = new_key(tmp_path / "other", "rsa")
    foreign = tmp_path / "foreign.sif"
    shutil.copyfile(strict.sif, foreign)
    run_envport("sign", str(foreign), "--key", str(other), root=tiny_sif.root, check=True, timeout=300)
    proc = witness(tiny_sif, foreign, strict)
    assert proc.returncode == 3 and "[untrusted_signer]" in proc.stderr, fail_with(proc, "witness")
    assert not strict.marker.exists() and list(strict.tmp.iterdir()) == []
    run_envport("sign", str(strict.sif), "--key", str(strict.key), root=tiny_sif.root, check=True, timeout=300)
    proc = witness(tiny_sif, strict.sif, strict)
    assert proc.returncode == 0, fail_with(proc, "witness of the SIF the site's key signed")
    # The marker works: the admitted run did start a mount tool through the same wrappers.
    assert strict.marker.read_text().split()[0] in MOUNT_TOOLS


@pytest.fixture
def pushed(registry, small_sif, tmp_path):
    """push(FILE) -> oras:// ref of FILE pushed as tiny-reg's SIF to a fresh repository; and a fresh key."""
    priv, pub = new_key(tmp_path, "ed25519")

    def push(path: Path, *, raw: bool = False) -> str:
        """RAW: the bytes as they are, through the registry engine (envport push refuses a damaged SIF: a
        registry that holds one is what the pull under test must refuse)."""
        repo = f"envport/{unique('trust')}"
        if raw:
            from envport.engines import registry as engine

            engine.push_sif(path, engine.parse_ref(registry.url(repo)), [small_sif.hash[:12]],
                            ca=str(REGISTRY_DIR / "ca.crt"))
        else:
            run_envport("push", SMALL, "--site", SITE, "--sif", str(path), "--to", registry.url(repo),
                        root=small_sif.root, check=True, timeout=600)
        return registry.url(repo, small_sif.hash[:12])

    return push, priv, pub


def pull(small_sif, ref: str, out: Path, *args: str):
    return run_envport("pull", ref, "-o", str(out), "--json", *(args or ("--site", SITE)), root=small_sif.root,
                       timeout=600)


def test_pull_under_require_signed_refuses_an_unsigned_sif_and_names_nothing(pushed, small_sif, tmp_path):
    push, _, pub = pushed
    site = write_site(small_sif.root, f"strict-pull-{tmp_path.name}"[:60], apptainer={"compression": "lz4"},
                      registry_ca=str(REGISTRY_DIR / "ca.crt"), trust={"keys": [str(pub)], "require_signed": True})
    try:
        out = tmp_path / "out"
        proc = pull(small_sif, push(small_sif.path), out, "--site", site)
    finally:
        (small_sif.root / "sites" / f"{site}.yaml").unlink()
    step = as_json(proc)["steps"][0]
    assert proc.returncode == 3 and step["reason"] == "unsigned", fail_with(proc, "pull")
    assert list(out.iterdir()) == [], "a refused pull left a file"


def test_pull_with_a_key_verifies_and_refuses_a_tampered_signed_sif(pushed, small_sif, tmp_path):
    push, priv, pub = pushed
    signed = tmp_path / small_sif.path.name
    shutil.copyfile(small_sif.path, signed)
    run_envport("sign", str(signed), "--key", str(priv), root=small_sif.root, check=True, timeout=300)
    out = tmp_path / "out"
    proc = pull(small_sif, push(signed), out, "--key", str(pub), "--site", SITE)
    assert proc.returncode == 0, fail_with(proc, "pull of a signed SIF")
    assert "signatures verified against" in as_json(proc)["steps"][0]["detail"]
    # pull names the file after the reference (REPO's last part and the tag), never the registry's title
    [pulled] = list(out.iterdir())
    assert pulled.name.endswith(f"_{small_sif.hash[:12]}.sif") and pulled.read_bytes() == signed.read_bytes()

    from envport.sif.format import primary_partition, read_sif

    flip(signed, primary_partition(read_sif(signed)).offset + 100)  # a byte of the signed partition
    out2 = tmp_path / "out2"
    proc = pull(small_sif, push(signed, raw=True), out2, "--key", str(pub), "--site", SITE)
    step = as_json(proc)["steps"][0]
    assert proc.returncode == 3 and step["reason"] == "bad_signature", fail_with(proc, "pull of a tampered SIF")
    assert "the data of object" in step["detail"], step["detail"]
    assert list(out2.iterdir()) == []

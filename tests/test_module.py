"""`envport module`: a SIF through the trust gate, published as an Lmod/Tcl module, loaded by the real Lmod.

The SIF is tiny-sif's (tests/sif_fixtures.py: six only), built for real by envport's own builder. Lmod is
Debian's (`apt-get install lmod`, .ci/install.sh); the wrapper runs `python` inside the SIF (apptainer where
installed, else `envport module exec`: ch-run on the gated partition).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from envport.report.modules import lua_string, tcl_string

from .sif_fixtures import BuiltSif
from .support import REPO, as_json, fail_with, missing, run_envport
from .registry_fixture import registry, small_project, small_sif  # noqa: F401
from .test_sif_sign import new_key

pytest_plugins = ["tests.sif_fixtures"]

LMOD_INIT = Path("/usr/share/lmod/lmod/init/bash")


def _lmod(script: str, modulepath: Path, cwd: Path) -> subprocess.CompletedProcess:
    if not LMOD_INIT.is_file():
        missing("Lmod not installed: apt-get install lmod")
    return subprocess.run(["bash", "-c", f"source {LMOD_INIT}; module use {modulepath}; {script}"],
                          capture_output=True, text=True, timeout=300, cwd=cwd)


def _copy(tiny: BuiltSif, tmp_path: Path) -> Path:
    own = tmp_path / "in" / tiny.path.name
    own.parent.mkdir()
    shutil.copyfile(tiny.path, own)
    return own


def _site(tmp_path: Path, **trust) -> Path:
    data = yaml.safe_load((REPO / "sites" / "local.yaml").read_text())
    data.update(name="admin", trust=trust)
    path = tmp_path / "admin.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.timeout(1800)
def test_install_load_run_help_list_uninstall(tiny_sif: BuiltSif, tmp_path: Path):
    sif = _copy(tiny_sif, tmp_path)
    priv, pub = new_key(tmp_path, "ed25519")
    run_envport("sign", str(sif), "--key", str(priv), root=tmp_path, check=True, timeout=600)
    site = _site(tmp_path, keys=[str(pub)], require_signed=True)
    mp = tmp_path / "modules"
    proc = run_envport("module", "install", str(sif), "--modulepath", str(mp), "--site", str(site), "--default",
                       "--json", root=tmp_path, timeout=600)
    assert proc.returncode == 0, fail_with(proc, "module install")
    step = as_json(proc)["steps"][0]
    assert step["verdict"] == "OK", step
    version = tiny_sif.hash[:12]
    folder = mp / "tiny-sif"
    assert (folder / f"{version}.lua").is_file() and (folder / version).read_text().startswith("#%Module1.0")
    assert (folder / f".{version}" / f"tiny-sif-{version}.sif").read_bytes() == sif.read_bytes()
    assert "verified: " in step["data"]["signer"] and "pub.pem" in step["data"]["signer"], step["data"]

    # The real Lmod: load it, the wrapper runs python inside the SIF, help names the signer.
    run = _lmod('module load tiny-sif; python -c "import six, sys; print(six.__version__, sys.prefix)"', mp,
                tmp_path)
    assert run.returncode == 0 and "not a valid identifier" not in run.stderr, fail_with(run, "module load; python")
    assert run.stdout.split()[0].count(".") >= 1 and run.stdout.split()[1] != shutil.which("python3"), run.stdout
    helped = _lmod("module help tiny-sif", mp, tmp_path)
    said = helped.stdout + helped.stderr
    assert "Signer:    verified: " in said and "pub.pem" in said and "Witnessed: " in said, said
    whatis = _lmod("module whatis tiny-sif", mp, tmp_path)
    assert f"Spec: tiny-sif@{version}" in whatis.stdout + whatis.stderr, whatis.stderr

    # Idempotent: present, nothing rewritten.
    mtime = (folder / f"{version}.lua").stat().st_mtime_ns
    again = run_envport("module", "install", str(sif), "--modulepath", str(mp), "--site", str(site), "--default",
                        root=tmp_path, timeout=600)
    assert again.returncode == 0 and again.stdout.startswith("present"), fail_with(again, "second install")
    assert (folder / f"{version}.lua").stat().st_mtime_ns == mtime

    listed = run_envport("module", "list", "--modulepath", str(mp), "--json", root=tmp_path)
    mods = as_json(listed)["modules"]
    assert [(m["name"], m["version"], m["default"], m["whole"]) for m in mods] == [("tiny-sif", version, True, True)]
    shown = run_envport("module", "show", "tiny-sif", "--modulepath", str(mp), root=tmp_path)
    assert "signer       verified: " in shown.stdout and "wrapper" in shown.stdout, shown.stdout

    gone = run_envport("module", "uninstall", f"tiny-sif/{version}", "--modulepath", str(mp), root=tmp_path)
    assert gone.returncode == 0 and not folder.exists(), fail_with(gone, "uninstall")
    again = run_envport("module", "show", "tiny-sif", "--modulepath", str(mp), root=tmp_path)
    assert again.returncode == 3 and "[module_missing]" in again.stdout, again.stdout


@pytest.mark.timeout(1800)
def test_unsigned_refused_under_require_signed_before_anything_is_written(tiny_sif: BuiltSif, tmp_path: Path):
    sif = _copy(tiny_sif, tmp_path)
    _, pub = new_key(tmp_path, "ed25519")
    site = _site(tmp_path, keys=[str(pub)], require_signed=True)
    mp = tmp_path / "modules"
    proc = run_envport("module", "install", str(sif), "--modulepath", str(mp), "--site", str(site),
                       root=tmp_path, timeout=600)
    assert proc.returncode == 3 and "REFUSED [unsigned]" in proc.stderr, fail_with(proc, "unsigned install")
    assert "ask its builder for a SIF signed by a key" in proc.stderr
    assert not mp.exists()


@pytest.mark.timeout(1800)
def test_two_versions_side_by_side_and_unsigned_named(tiny_sif: BuiltSif, tmp_path: Path):
    """Without require_signed an unsigned SIF is installed and its modulefile says so; two versions of one
    env (a second hash written from the same SIF's record under another name) stay apart."""
    sif = _copy(tiny_sif, tmp_path)
    mp = tmp_path / "modules"
    proc = run_envport("module", "install", str(sif), "--modulepath", str(mp), root=tmp_path, timeout=600)
    assert proc.returncode == 0, fail_with(proc, "install")
    version = tiny_sif.hash[:12]
    lua = (mp / "tiny-sif" / f"{version}.lua").read_text()
    assert 'whatis("Signer: unsigned")' in lua
    # A second version beside it: the payload and modulefiles of another hash, as an older build left them.
    other = "0" * 12
    for rel in (f"{version}.lua", version):
        (mp / "tiny-sif" / rel.replace(version, other)).write_text((mp / "tiny-sif" / rel).read_text())
    shutil.copytree(mp / "tiny-sif" / f".{version}", mp / "tiny-sif" / f".{other}")
    rec = json.loads((mp / "tiny-sif" / f".{other}" / "module.json").read_text())
    rec.update(version=other, hash=other + rec["hash"][12:])
    (mp / "tiny-sif" / f".{other}" / "module.json").write_text(json.dumps(rec))
    avail = _lmod("module -t avail tiny-sif", mp, tmp_path)
    said = avail.stdout + avail.stderr
    assert f"tiny-sif/{version}" in said and f"tiny-sif/{other}" in said, said
    run = _lmod(f'module load tiny-sif/{version}; python -c "import six; print(six.__version__)"', mp, tmp_path)
    assert run.returncode == 0 and run.stdout.strip(), fail_with(run, "load one of two versions")
    gone = run_envport("module", "uninstall", f"tiny-sif/{other}", "--modulepath", str(mp), root=tmp_path)
    assert gone.returncode == 0, fail_with(gone, "uninstall one version")
    assert (mp / "tiny-sif" / f"{version}.lua").is_file() and not (mp / "tiny-sif" / other).exists()


def test_interrupted_install_leaves_no_modulefile(tmp_path: Path, monkeypatch):
    """A failure mid-payload (here: the SIF copy breaks) leaves no partial folder and no modulefile."""
    from envport.report import modules

    module = modules.Module(name="e", hash="a" * 64, description="", source="x.sif", modulepath=tmp_path,
                            signer="unsigned", sbom="none", witnessed="nothing", spec_line="env:e@aaaa",
                            executables=("python",), runner=("envport", "module", "exec"), runtime="envport",
                            gpus=False)

    class Broken:
        def chunks(self, offset, size):
            yield b"SIF"
            raise OSError("disk full")

    with pytest.raises(OSError):
        modules.install(module, Broken(), 10, True)
    assert [p.name for p in (tmp_path / "e").iterdir()] == []


def test_text_from_the_sif_is_a_string_literal():
    evil = 'x"]] os.execute("id") --[[\n$(id) [exec id] {'
    assert lua_string(evil) == '"x\\"]] os.execute(\\"id\\") --[[\\n$(id) [exec id] {"'
    assert tcl_string(evil) == '"x\\"\\]\\] os.execute(\\"id\\") --\\[\\[\\n\\$(id) \\[exec id\\] \\{"'


@pytest.mark.timeout(1800)
def test_install_from_the_registry_with_a_shpc_entry(registry, small_project, small_sif, tmp_path: Path):
    """`module install oras://HOST/REPO:TAG --shpc DIR` in an admin's folder with only a site file and a key: the
    SIF pulled from the real test registry and judged as `envport pull` judges it, the module loaded by the real
    Lmod and its wrapper run; DIR/HOST/REPO/container.yaml pins the tag to the manifest digest the registry
    itself reports; a second run is present twice."""
    from .registry_fixture import REGISTRY_DIR
    from .support import unique

    signed = _copy(small_sif, tmp_path)
    priv, pub = new_key(tmp_path, "ed25519")
    run_envport("sign", str(signed), "--key", str(priv), root=tmp_path, check=True, timeout=600)
    repo, tag = f"envport/{unique('module')}", "v1"
    pushed = run_envport("push", small_sif.name, "--site", small_sif.site, "--sif", str(signed), "--to",
                         registry.url(repo, tag), root=small_project, timeout=600)
    assert pushed.returncode == 0, fail_with(pushed, "push")
    admin = tmp_path / "admin"
    admin.mkdir()
    site = admin / "cluster.yaml"
    site.write_text(yaml.safe_dump({"name": "cluster", "registry_ca": str(REGISTRY_DIR / "ca.crt"),
                                    "trust": {"keys": [str(pub)], "require_signed": True}}))
    mp, shpc = admin / "modules", admin / "shpc-registry"
    argv = ["module", "install", registry.url(repo, tag), "--modulepath", str(mp), "--site", str(site), "--shpc",
            str(shpc), "--json"]
    proc = run_envport(*argv, root=admin, timeout=600)
    assert proc.returncode == 0, fail_with(proc, "module install oras://")
    steps = as_json(proc)["steps"]
    assert [s["verdict"] for s in steps] == ["OK", "OK"], steps
    assert "verified: " in steps[0]["data"]["signer"], steps[0]["data"]
    entry = yaml.safe_load((shpc / registry.host / repo / "container.yaml").read_text())
    status, headers, _ = registry.get(f"/v2/{repo}/manifests/{tag}", accept="application/vnd.oci.image.manifest.v1+json")
    assert status == 200 and entry["tags"] == {tag: headers["Docker-Content-Digest"]} == entry["latest"], entry
    assert entry["oras"] == f"{registry.host}/{repo}" and "python" in entry["aliases"] and entry["maintainer"]
    assert set(entry) <= {"oras", "url", "maintainer", "description", "latest", "tags", "aliases", "features"}
    run = _lmod(f'module load {small_sif.name}; python -c "import six; print(six.__version__)"', mp, admin)
    assert run.returncode == 0 and run.stdout.strip() == "1.16.0", fail_with(run, "module load; python")
    again = run_envport(*argv, root=admin, timeout=600)
    assert [s["verdict"] for s in as_json(again)["steps"]] == ["present", "present"], again.stdout
    local = run_envport("module", "install", str(signed), "--modulepath", str(mp), "--shpc", str(shpc), root=admin)
    assert local.returncode == 2 and "oras://HOST/REPO:TAG" in local.stderr, local.stderr


@pytest.mark.timeout(1800)
def test_the_wrapper_runs_under_srun(slurm, tiny_sif: BuiltSif, tmp_path: Path):
    """A user's batch step: `module load` then the wrapper, as a Slurm task on the CI's one-node cluster (a
    script, not an alias, so it survives srun). The modulepath lies under /var/tmp, where the node sees it."""
    import secrets

    mp = Path("/var/tmp") / f"envport-modules-{secrets.token_hex(6)}"
    try:
        proc = run_envport("module", "install", str(_copy(tiny_sif, tmp_path)), "--modulepath", str(mp),
                           root=tmp_path, timeout=600)
        assert proc.returncode == 0, fail_with(proc, "module install")
        if not LMOD_INIT.is_file():
            missing("Lmod not installed: apt-get install lmod")
        # The task's own rank outside the image (the wrapper runs python with apptainer's clean environment).
        script = (f"source {LMOD_INIT}; module use {mp}; module load tiny-sif; echo task=$SLURM_PROCID; "
                  "python -c 'import six; print(six.__version__)'")
        ran = subprocess.run(["srun", "--ntasks=1", "--time=00:05:00", "bash", "-c", script], capture_output=True,
                             text=True, timeout=600, cwd=tmp_path)
        assert ran.returncode == 0, fail_with(ran, "srun: module load; python")
        assert ran.stdout.split()[-2:] == ["task=0", "1.16.0"], ran.stdout
    finally:
        shutil.rmtree(mp, ignore_errors=True)

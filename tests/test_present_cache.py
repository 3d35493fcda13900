"""The fast `present` paths: a remembered hash is trusted only while nothing changed and the engine still
holds the tag with that hash in its label (docker), or the SIF is the very file this machine's build
wrote (apptainer: its recorded stat, else its content checked)."""

from __future__ import annotations

import io
import shutil
import subprocess
import uuid

import pytest

from envport.builders.docker import present as present_cache

from .support import as_json, copy_project, run_envport

pytest_plugins = ["tests.sif_fixtures"]


@pytest.fixture
def labelled_image(docker_client, base_image):
    hash_ = uuid.uuid4().hex * 2
    tag = f"envport-test/present-cache:{hash_[:12]}"
    dockerfile = f'FROM {base_image}\nLABEL envport.hash="{hash_}"\n'
    docker_client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True)
    yield tag, hash_
    subprocess.run(["docker", "image", "rm", "-f", tag], capture_output=True)


def test_hit_then_misses_on_any_change(project, labelled_image):
    tag, hash_ = labelled_image
    assert present_cache.present(project, "demo-cpu", None) is None  # nothing remembered yet
    present_cache.remember(project, "demo-cpu", None, hash_, tag)
    hit = present_cache.present(project, "demo-cpu", None)
    assert hit and hit["hash"] == hash_ and hit["tag"] == tag and hit["id"].startswith("sha256:")

    assert present_cache.present(project, "demo-cpu", "elsewhere") is None  # another site
    spec = project / "specs" / "demo-cpu.yaml"
    spec.write_text(spec.read_text() + "\n# an edit\n")
    assert present_cache.present(project, "demo-cpu", None) is None  # any spec byte changed


def test_misses_when_the_image_is_gone_or_relabelled(project, labelled_image):
    tag, hash_ = labelled_image
    present_cache.remember(project, "demo-cpu", None, "0" * 64, tag)
    assert present_cache.present(project, "demo-cpu", None) is None  # label carries another hash
    present_cache.remember(project, "demo-cpu", None, hash_, tag)
    subprocess.run(["docker", "image", "rm", "-f", tag], check=True, capture_output=True)
    assert present_cache.present(project, "demo-cpu", None) is None


def test_unreachable_engine_is_a_miss(project, labelled_image, monkeypatch):
    """The same remembered hash and tag that hit with the engine up must miss when it cannot be asked."""
    tag, hash_ = labelled_image
    present_cache.remember(project, "demo-cpu", None, hash_, tag)
    assert present_cache.present(project, "demo-cpu", None) is not None  # a hit while the engine answers
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    assert present_cache.present(project, "demo-cpu", None) is None
    monkeypatch.setenv("DOCKER_HOST", "tcp://127.0.0.1:1")
    assert present_cache.present(project, "demo-cpu", None) is None


# --- what the remembered identity depends on (builders/present_cache.py), for every target ---------------------


@pytest.fixture
def own_code(tmp_path, monkeypatch):
    """envport's code as the digest sees it, in a copy this test may edit."""
    from envport.builders import present_cache as cache

    code = tmp_path / "envport-code"
    (code / "renderers").mkdir(parents=True)
    (code / "cli.py").write_text("# cli\n")
    (code / "renderers" / "Dockerfile.j2").write_text("FROM x\n")
    monkeypatch.setattr(cache, "PACKAGE_DIR", str(code))
    return code


@pytest.mark.parametrize("target", ["docker", "apptainer"])
def test_any_input_change_forgets_the_identity(project, own_code, target, tmp_path, monkeypatch):
    from envport.builders import present_cache as cache

    ca = tmp_path / "ca.pem"
    ca.write_text("one CA\n")
    site = project / "sites" / "withca.yaml"
    site.write_text(f"name: withca\nca_bundle: {ca}\n")

    def remembered() -> tuple[str, str] | None:
        return cache.recall(project, "demo-cpu", "withca", target)

    cache.remember(project, "demo-cpu", "withca", target, "a" * 64, "where-it-lives")
    assert remembered() == ("a" * 64, "where-it-lives")
    assert cache.recall(project, "demo-cpu", "withca", "venv" if target == "docker" else "docker") is None

    ca.write_text("another CA\n")  # the CA bundle's bytes enter the env's hash
    assert remembered() is None
    cache.remember(project, "demo-cpu", "withca", target, "a" * 64, "where-it-lives")
    (own_code / "renderers" / "Dockerfile.j2").write_text("FROM y\n")  # a template edit
    assert remembered() is None
    cache.remember(project, "demo-cpu", "withca", target, "a" * 64, "where-it-lives")
    (project / "specs" / "demo-cpu.lock").write_text("edited\n")  # locks live in specs/
    assert remembered() is None
    cache.remember(project, "demo-cpu", "withca", target, "a" * 64, "where-it-lives")
    # Where an env lives may depend on ~ and the project root (a SIF's sif_dir): the digest asks no target which,
    # so both forget (an image then only asks its engine once more).
    with monkeypatch.context() as elsewhere:
        elsewhere.setenv("HOME", str(tmp_path / "elsewhere"))  # a `~` in sif_dir means another place
        assert remembered() is None
    cache.remember(project, "demo-cpu", "withca", target, "a" * 64, "where-it-lives")
    copy = tmp_path / "copied"
    shutil.copytree(project, copy)  # .cache/present copied along: a relative sif_dir is another place there
    assert cache.recall(copy, "demo-cpu", "withca", target) is None


def test_a_damaged_record_is_a_miss(project, own_code):
    from envport.builders import present_cache as cache

    cache.remember(project, "demo-cpu", None, "docker", "a" * 64, "envport/demo-cpu:aaaaaaaaaaaa")
    record = project / cache.CACHE_DIR / "demo-cpu--local--docker"
    whole = record.read_text()
    for damaged in ("", whole[:-1], whole.replace("envport-present", "other"), whole + "extra\n",
                    whole.replace("a" * 64, "")):
        record.write_text(damaged)
        assert cache.recall(project, "demo-cpu", None, "docker") is None, repr(damaged)
    record.write_text(whole)
    assert cache.recall(project, "demo-cpu", None, "docker") is not None
    cache.remember(project, "demo-cpu", None, "docker", "b" * 64, "line\nbreak")  # no line holds it: forgotten
    assert not record.exists()


def test_the_builders_present_asks_the_engine_socket_first(labelled_image):
    """builder.build's own `present` (commands, `envport up`) answers from one socket request when the image
    carries the hash and its :latest tag; otherwise the SDK path decides (and tags :latest)."""
    from types import SimpleNamespace

    from envport.builders.docker.builder import _present_by_socket, repo

    tag, hash_ = labelled_image
    identity = SimpleNamespace(image_tag=tag, name=f"present-cache-{hash_[:8]}")
    assert _present_by_socket(SimpleNamespace(hash=hash_, identity=identity)) is None  # no :latest yet
    latest = f"{repo(identity.name)}:latest"
    subprocess.run(["docker", "tag", tag, latest], check=True, capture_output=True)
    try:
        hit = _present_by_socket(SimpleNamespace(hash=hash_, identity=identity))
        assert hit is not None and hit.verdict.value == "present" and hit.step == f"image {tag}"
        assert hit.data["image"] == tag and hit.data["image_id"].startswith("sha256:")
        assert _present_by_socket(SimpleNamespace(hash="0" * 64, identity=identity)) is None  # another env's label
    finally:
        subprocess.run(["docker", "image", "rm", latest], capture_output=True)


# --- a SIF is present only as the file this machine's build wrote, or after its content was checked ---------
# (issue 21 F3: a SIF dropped into a shared sif_dir with the env's label was `present`, then run)


def _labelled_stub(root, name: str, tmp_path):
    """A SIF at NAME's identity path carrying its hash in inspect-metadata.json over a stub partition."""
    from envport.builders.apptainer.builder import sif_path
    from envport.builders.apptainer.singularity_d import inspect_metadata
    from envport.sif.format import write_sif
    from envport.plan.site import load_site
    from envport.recipe.identity import resolve
    from envport.spec.loader import load_spec

    site = load_site("sif-fast", root)
    resolved = resolve(load_spec(name, root), site, "apptainer")
    sif = sif_path(site, root, resolved.identity)
    stub = tmp_path / "stub.sqfs"
    stub.write_bytes(b"hsqs" + bytes(5000))
    write_sif(sif, deffile=b"Bootstrap: docker\n", squashfs_path=stub, created=0, uuid=bytes(16),
              inspect_metadata=inspect_metadata(deffile="Bootstrap: docker", environment={},
                                                labels={"envport.hash": resolved.hash, "envport.name": name}))
    return sif, resolved


def test_a_labelled_sif_this_machine_did_not_build_is_not_present(sif_project, tmp_path):
    """Neither the no-op shortcut nor the full path takes it; the build says why and builds the real one."""
    from envport.builders import present_cache as cache
    from envport.sif import record as sif_record
    from envport.builders.apptainer.builder import present
    from envport.commands.fast import fast_argv

    from .sif_fixtures import require_sif_tools, sif_env

    require_sif_tools()
    root = copy_project(tmp_path / "project")
    for d in ("specs", "sites"):
        shutil.rmtree(root / d)
        shutil.copytree(sif_project / d, root / d)
    sif, resolved = _labelled_stub(root, "tiny-sif", tmp_path)
    cache.remember(root, "tiny-sif", "sif-fast", "apptainer", resolved.hash, str(sif))
    argv = ["-C", str(root), "build", "tiny-sif", "--target", "apptainer", "--site", "sif-fast"]
    assert fast_argv(argv) is None  # remembered, labelled, whole: still not this machine's file
    hit = present(sif, resolved.hash, resolved, "3.11")
    assert hit is not None and "rejected" in hit, hit  # its content was read, and is not the env
    proc = run_envport(*argv[2:], "--json", root=root, env=sif_env(), timeout=1200)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    last = as_json(proc)["steps"][-1]
    assert last["verdict"] == "OK" and last["data"]["route"] == "envport", last  # built, not `present`
    assert f"{sif} exists but is not taken as envport.hash={resolved.hash[:12]}" in proc.stderr
    assert sif_record.unchanged(str(sif), resolved.hash)  # the build recorded what it wrote
    assert fast_argv(argv) == 0  # and the no-op takes that file, on its record alone
    sif.touch()  # any write leaves another mtime and ctime
    assert fast_argv(argv) is None


def test_a_copy_of_a_real_sif_is_present_after_its_content_was_checked(tiny_sif, tmp_path):
    """A file built elsewhere (here: copied to a new path, so no record names it) is present once its own
    partition was read and found to be the env; then it is recorded, and the next answer is one stat."""
    from envport.sif import record as sif_record
    from envport.builders.apptainer.builder import present
    from envport.plan.site import load_site
    from envport.recipe.identity import resolve
    from envport.spec.loader import load_spec

    copy = tmp_path / tiny_sif.path.name
    shutil.copyfile(tiny_sif.path, copy)
    resolved = resolve(load_spec("tiny-sif", tiny_sif.root), load_site("sif-fast", tiny_sif.root), "apptainer")
    assert present(tiny_sif.path, tiny_sif.hash)["checked"] == "build record"
    assert present(copy, tiny_sif.hash) is None  # no record, no content check asked for
    assert present(copy, tiny_sif.hash, resolved, "3.11")["checked"] == "content"
    assert present(copy, tiny_sif.hash)["checked"] == "build record"
    assert not sif_record.unchanged(str(copy), "0" * 64)

"""The fast docker `present` path: a remembered hash is trusted only while nothing changed
and the engine still holds the tag with that hash in its label."""

from __future__ import annotations

import io
import subprocess
import uuid

import pytest

from envport.build.docker import present as present_cache


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

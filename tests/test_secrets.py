"""A gated weight's token in the builder's environment never reaches the image.

The build runs with HF_TOKEN=<random> exported (as a user with a gated weight
would have it) and --no-cache, so every layer is made during that build.
Then every byte envport or docker produced is searched for the token:
`docker save` (each layer tar, the image config with its history, env and
labels, the manifest), `docker history --no-trunc`, `docker image inspect`,
the rendered build files, the ledger and the build's own output.
"""

from __future__ import annotations

import io
import json
import os
import secrets
import subprocess
import tarfile

import pytest

from envport.spec.loader import load_spec
from envport.plan.steps import make_plan
from envport.recipe.render import render_plan
from envport.plan.site import apply_site, load_site

from .support import as_json, run_envport, write_spec


def _leaks(blob: bytes, token: bytes) -> bool:
    return token in blob


@pytest.mark.docker
def test_hf_token_never_reaches_the_image(docker_client, base_image, project, throwaway_images, tmp_path):
    token = f"hf_{secrets.token_hex(20)}"
    needle = token.encode()
    name = "tiny-gated"
    throwaway_images.append(name)
    write_spec(project, name,
               weight_dirs={"gated": {"path": "/weights/gated", "env": "HF_HOME", "gated": True,
                                      "auth_hint": "HF_TOKEN", "source": "huggingface-cli download org/model"}})
    env = {**os.environ, "HF_TOKEN": token, "HUGGING_FACE_HUB_TOKEN": token}
    proc = run_envport("build", name, "--target", "docker", "--no-cache", "--json", root=project, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert needle not in proc.stdout.encode() and needle not in proc.stderr.encode()
    image_ref = as_json(proc)["steps"][-1]["data"]["image"]

    saved = subprocess.run(["docker", "save", image_ref], capture_output=True, timeout=300)
    assert saved.returncode == 0, saved.stderr
    scanned = 0
    with tarfile.open(fileobj=io.BytesIO(saved.stdout)) as tar:
        for member in tar.getmembers():
            if not member.isfile():
                continue
            data = tar.extractfile(member).read()
            scanned += 1
            assert not _leaks(data, needle), f"token found in {member.name} of `docker save`"
            if member.name.endswith("layer.tar"):
                # Also file by file: a compressed member inside a layer would hide a plain-bytes match.
                with tarfile.open(fileobj=io.BytesIO(data)) as layer:
                    for f in layer.getmembers():
                        if f.isfile():
                            assert not _leaks(layer.extractfile(f).read(), needle), f"token in {f.name}"
    assert scanned >= 3  # manifest, config, layers

    history = subprocess.run(["docker", "history", "--no-trunc", image_ref], capture_output=True, timeout=60)
    assert history.returncode == 0 and not _leaks(history.stdout, needle)
    inspect = docker_client.api.inspect_image(image_ref)
    assert not _leaks(json.dumps(inspect).encode(), needle)
    assert "HF_TOKEN" not in json.dumps(inspect["Config"]["Env"])

    site = load_site(None, project)
    loaded = load_spec(name, project)
    for rel, (data, _) in render_plan(apply_site(make_plan(loaded), site), "0" * 64, ("docker",)).files.items():
        assert not _leaks(data, needle), f"token in rendered {rel}"
    from envport.report import ledger as envport_ledger
    ledger = envport_ledger.ledger_path(project, name).read_bytes()
    assert not _leaks(ledger, needle)
    assert b'"image_id"' in ledger  # the build was recorded, without the token
    envport_ledger.write_doc(project, name, envport_ledger.read(project, name))
    assert not _leaks((project / "docs" / "envs" / f"{name}.md").read_bytes(), needle)

"""The real registry and a small built env for the push/pull and SBOM tests.

Import what a module uses (`from .registry_fixture import registry, small_project  # noqa: F401`): these
are not registered in tests/conftest.py, so only the modules that import them pay for them.

- ``registry``: Debian's docker-registry on 127.0.0.1:5443 over TLS, CA made by
  `.ci/services/registry.sh` (ENVPORT_REGISTRY_DIR / ENVPORT_REGISTRY_PORT move it, as they move the
  script). Not answering: skipped with the reason locally, an error in CI; ENVPORT_START_SERVICES=1
  runs the script.
- ``small_project``: a project copy with `tiny-reg` (the default small spec of tests/support.py
  write_spec: six only, no torch) and a site `registry` (lz4 SIFs; `registry_ca` the registry's CA).
- ``small_sif``: tiny-reg's SIF built there by envport's own .def builder, once a session.
"""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from .sif_fixtures import BuiltSif, build_sif, require_sif_tools
from .services import _not_up, start_requested
from .support import REPO, copy_project, missing, write_site, write_spec

REGISTRY_DIR = Path(os.environ.get("ENVPORT_REGISTRY_DIR", "/var/lib/envport-registry"))
REGISTRY_HOST = f"127.0.0.1:{os.environ.get('ENVPORT_REGISTRY_PORT', '5443')}"
SMALL = "tiny-reg"
SITE = "registry"
START_TIMEOUT_S = 120


@dataclass(frozen=True)
class Registry:
    host: str  # 127.0.0.1:PORT
    ca: Path  # the CA that signed its certificate

    def url(self, repo: str, tag: str | None = None) -> str:
        return f"oras://{self.host}/{repo}" + (f":{tag}" if tag else "")

    def get(self, path: str, accept: str | None = None) -> tuple[int, dict, bytes]:
        """GET https://HOST/PATH with the registry's CA (plain urllib: the registry's own HTTP API)."""
        req = urllib.request.Request(f"https://{self.host}{path}", headers={"Accept": accept} if accept else {})
        ctx = ssl.create_default_context(cafile=str(self.ca))
        try:
            with urllib.request.urlopen(req, context=ctx, timeout=30) as resp:
                return resp.status, dict(resp.headers), resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers), exc.read()


def _answers(reg: Registry) -> str:
    if not reg.ca.is_file():
        return f"{reg.ca} does not exist"
    try:
        status, _, _ = reg.get("/v2/")
    except OSError as exc:
        return f"https://{reg.host}/v2/ does not answer ({exc})"
    return "" if status == 200 else f"https://{reg.host}/v2/ answered HTTP {status}"


@pytest.fixture(scope="session")
def registry() -> Registry:
    reg = Registry(REGISTRY_HOST, REGISTRY_DIR / "ca.crt")
    why = _answers(reg)
    if why:
        if not shutil.which("docker-registry"):
            missing(f"test registry not up ({why}) and docker-registry is not installed "
                    "(apt-get install docker-registry)")
        if not start_requested():
            missing(_not_up("test registry", why, "registry.sh"))
        proc = subprocess.run(["bash", str(REPO / ".ci" / "services" / "registry.sh")], capture_output=True,
                              text=True, timeout=START_TIMEOUT_S)
        why = _answers(reg)
        if proc.returncode != 0 or why:
            pytest.fail(f"ENVPORT_START_SERVICES=1 but .ci/services/registry.sh failed ({why}):\n"
                        f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}", pytrace=False)
    return reg


@pytest.fixture(scope="session")
def small_project(tmp_path_factory) -> Path:
    root = copy_project(tmp_path_factory.mktemp("registry-project"))
    write_spec(root, SMALL)
    # registry_ca steers push/pull only (not the hash): the SBOM tests use this project without the registry.
    write_site(root, SITE, apptainer={"compression": "lz4"}, registry_ca=str(REGISTRY_DIR / "ca.crt"))
    return root


@pytest.fixture(scope="session")
def small_sif(base_image, small_project) -> BuiltSif:
    require_sif_tools()
    return build_sif(small_project, SMALL, SITE)

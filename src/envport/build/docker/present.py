"""A fast `present` for `envport build --target docker`, without pydantic or the docker SDK.

Loading and validating a spec costs a few hundred milliseconds of imports;
a present image should cost less than the `docker build` it replaces.  After
every docker build that ends OK or present, the content hash is remembered
under a digest of everything it could depend on: the bytes of every file in
specs/ (locks included) and sites/, the site's CA bundle, and envport's own
code (templates included; by path, size and mtime: reading the package's
bytes on every no-op build cost more than the engine's question).  A later
build whose digest matches asks the engine, over its unix socket with
nothing but `socket` and `json` (engines/docker_socket.py), whether the tag
still carries that hash in its label.  Any doubt (another file, another
engine, an image relabelled) falls through to the full path, which decides
for real.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

CACHE_DIR = Path(".cache") / "present"
PACKAGE_DIR = Path(__file__).resolve().parents[2]  # src/envport: every layer can change the hash


def _code_dirs() -> list[Path]:
    import importlib.util
    dirs = [PACKAGE_DIR]
    spec = importlib.util.find_spec("envport.renderers")
    if spec and spec.submodule_search_locations:
        dirs += [Path(p) for p in spec.submodule_search_locations]
    return dirs


def _tree_digest(h, base: Path, suffixes: tuple[str, ...] | None = None, stat_only: bool = False) -> None:
    if not base.is_dir():
        return
    for path in sorted(base.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and (suffixes is None or path.suffix in suffixes):
            if stat_only:
                st = path.stat()
                what = f"{st.st_size}:{st.st_mtime_ns}".encode()
            else:
                what = path.read_bytes()
            h.update(str(path.relative_to(base)).encode() + b"\0" + what + b"\0")


def inputs_digest(root: Path, name: str, site_name: str | None) -> str:
    h = hashlib.sha256(f"{name}\0{site_name or 'local'}\0".encode())
    _tree_digest(h, root / "specs")
    _tree_digest(h, root / "sites")
    for d in _code_dirs():
        _tree_digest(h, d, (".py", ".j2", ".sh", ".json"), stat_only=True)
    # The CA bundle's bytes enter the hash; its path is in the site file.
    site_file = root / "sites" / f"{site_name or 'local'}.yaml"
    if site_file.is_file():
        for line in site_file.read_text(encoding="utf-8").splitlines():
            if line.strip().startswith("ca_bundle:"):
                ca = Path(line.split(":", 1)[1].strip().strip("'\""))
                h.update(ca.read_bytes() if ca.is_file() else b"<missing>")
    return h.hexdigest()


def _cache_file(root: Path, name: str, site_name: str | None) -> Path:
    return root / CACHE_DIR / f"{name}--{site_name or 'local'}--docker.json"


def remember(root: Path, name: str, site_name: str | None, hash_: str, tag: str) -> None:
    from envport.core.files import write_atomic

    write_atomic(_cache_file(root, name, site_name),
                 json.dumps({"digest": inputs_digest(root, name, site_name), "hash": hash_, "tag": tag}))


def present(root: Path, name: str, site_name: str | None) -> dict | None:
    """{'hash', 'tag', 'id', 'size'} when the remembered image is certainly present, else None."""
    path = _cache_file(root, name, site_name)
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if cached.get("digest") != inputs_digest(root, name, site_name):
        return None
    from envport.engines.docker_socket import image_labels

    info = image_labels(cached["tag"])
    if info is None or info["labels"].get("envport.hash") != cached["hash"]:
        return None
    return {"hash": cached["hash"], "tag": cached["tag"], "id": info["id"], "size": info["size"]}

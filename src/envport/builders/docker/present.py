"""A fast `present` for `envport build --target docker`, without pydantic or the docker SDK.

The image tag and hash the last good build of these exact inputs ended with
come from builders/present_cache.py; then the engine is asked, over its unix
socket with nothing but `_socket` and the C json scanner
(engines/docker_socket.py), whether the tag still carries that hash in its
label.  Any doubt (another file, another engine, an image relabelled or
gone) falls through to the full path, which decides for real.
"""

from __future__ import annotations

from envport.builders import present_cache

TARGET = "docker"


def remember(root, name: str, site_name: str | None, hash_: str, tag: str) -> None:
    present_cache.remember(root, name, site_name, TARGET, hash_, tag)


def present(root, name: str, site_name: str | None) -> dict | None:
    """{'hash', 'tag', 'id', 'size'} when the remembered image is certainly present, else None."""
    return present_cache.checked(root, name, site_name, TARGET, _in_engine)


def _in_engine(hash_: str, tag: str) -> dict | None:
    from envport.engines.docker_socket import image_labels

    info = image_labels(tag)
    if info is None or info["labels"].get("envport.hash") != hash_:
        return None
    return {"hash": hash_, "tag": tag, "id": info["id"], "size": info["size"]}

"""One question to the docker engine over its unix socket, with nothing but `_socket` and the C json scanner.

The fast `present` path of `envport build --target docker` asks only "does
this tag exist, and what are its labels?".  `envport.engines.docker` answers
that too, but importing it (http.client and the email package behind it,
subprocess, threading, ctypes) cost more than the question: the whole no-op
build has to stay well under BuildKit's own cached build, so this module
speaks HTTP/1.0 itself over the C socket module (the engine closes the
connection after one reply, so the body is everything after the headers).
"""

from __future__ import annotations

import os

import _socket  # the C module: `socket` adds selectors, enum classes and array, none of which one GET needs


def engine_socket() -> str | None:
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    return host[len("unix://"):] if host.startswith("unix://") else None


def _quote(tag: str) -> str:
    # Image references are [A-Za-z0-9._/:@-]; escape the two that are special in a path segment.
    return tag.replace("%", "%25").replace("/", "%2F").replace(":", "%3A").replace("@", "%40")


def get_json(path: str, timeout: float = 2.0) -> dict | None:
    """GET `path` from the engine: the decoded body of a 200 reply, else None (absent, unreachable)."""
    where = engine_socket()
    if where is None:
        return None
    chunks = []
    try:
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.connect(where)
            sock.sendall(f"GET {path} HTTP/1.0\r\nHost: docker\r\n\r\n".encode())
            while True:
                block = sock.recv(65536)
                if not block:
                    break
                chunks.append(block)
        finally:
            sock.close()
    except OSError:
        return None
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0].split()
    if len(status) < 2 or status[1] != b"200":
        return None
    from envport.core.cjson import loads

    try:
        return loads(body)
    except ValueError:
        return None


def image_labels(tag: str, timeout: float = 2.0) -> dict | None:
    """{'labels', 'id', 'size', 'tags'} of the image, or None when it is absent or the engine does not answer."""
    info = get_json(f"/images/{_quote(tag)}/json", timeout)
    if not isinstance(info, dict):
        return None
    return {"labels": (info.get("Config") or {}).get("Labels") or {}, "id": info.get("Id", ""),
            "size": info.get("Size", 0), "tags": info.get("RepoTags") or []}

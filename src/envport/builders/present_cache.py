"""What a no-op build may know without loading the spec: the identity its last good build ended with.

Loading and validating a spec costs a few hundred milliseconds of imports;
a present env should cost less than the engine's own cached build.  After
every docker or apptainer build that ends OK or present, the content hash
and where the env lives (the image tag, the SIF's path) are remembered under
a digest of everything they could depend on: the bytes of every file in
specs/ (locks included) and sites/, the site's CA bundle, envport's own code
(templates included), the project root, the home directory and $ENVPORT_SIF_DIR (a SIF's
relative sif_dir or a `~` in it means them: a copied project never answers
with the original's file; an image does not depend on them, and a copied
project only asks the engine once more).  The code and the CA bundle enter by path, size, mtime and ctime:
reading their bytes on every no-op build cost more than the engine's
question, and no edit leaves ctime alone.

A remembered identity is never a verdict: builders/docker/present.py still
asks the engine whether the image there carries that hash, and a SIF is
taken only while it is the very file this machine's build wrote (its stat
against sif/record.py's record, commands/fast.py): a label
in a file anyone could have dropped into a shared sif_dir is never enough.  The digest uses the interpreter's
built-in blake2b: loading OpenSSL for hashlib's cost more than the rest of
the no-op build's own work.
"""

from __future__ import annotations

import os

CACHE_DIR = os.path.join(".cache", "present")
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # src/envport: every layer
CODE_SUFFIXES = (".py", ".j2", ".sh", ".json")
RECORD_HEADER = "envport-present 2"


def _hasher(data: bytes):
    try:
        from _blake2 import blake2b
    except ImportError:  # an interpreter built without it
        from hashlib import blake2b
    return blake2b(data, digest_size=32)


def _code_dirs() -> list[str]:
    if os.path.isdir(os.path.join(PACKAGE_DIR, "renderers")):
        return [PACKAGE_DIR]  # installed: renderers/ is inside the package
    import importlib.util  # an editable install maps the top-level renderers/ in

    spec = importlib.util.find_spec("envport.renderers")
    return [PACKAGE_DIR, *(spec.submodule_search_locations or [] if spec else [])]


def _stamp(st: os.stat_result) -> bytes:
    return f"{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}".encode()


def _tree(h, base: str, rel: str = "", code: bool = False) -> None:
    """Every file under BASE in name order: its relative path and its bytes (CODE: its stamp)."""
    try:
        entries = sorted(os.scandir(os.path.join(base, rel) if rel else base), key=lambda e: e.name)
    except OSError:
        return
    for entry in entries:
        path = f"{rel}/{entry.name}" if rel else entry.name
        if entry.is_dir(follow_symlinks=False):
            if entry.name != "__pycache__":
                _tree(h, base, path, code)
        elif entry.is_file():
            if code:
                if entry.name.endswith(CODE_SUFFIXES):
                    h.update(path.encode() + b"\0" + _stamp(entry.stat()) + b"\0")
            else:
                with open(entry.path, "rb") as fh:
                    h.update(path.encode() + b"\0" + fh.read() + b"\0")


def inputs_digest(root: str, name: str, site_name: str | None, target: str) -> str:
    site = site_name or "local"
    h = _hasher(f"{name}\0{site}\0{target}\0".encode())
    h.update(os.path.abspath(root).encode() + b"\0" + os.path.expanduser("~").encode() + b"\0")
    # $ENVPORT_SIF_DIR moves the SIF (plan/site.py): a run with another must never answer with this one's file.
    h.update(os.environ.get("ENVPORT_SIF_DIR", "").encode() + b"\0")
    _tree(h, os.path.join(root, "specs"))
    _tree(h, os.path.join(root, "sites"))
    for d in _code_dirs():
        _tree(h, d, code=True)
    # The CA bundle enters the hash; its path is in the site file.
    try:
        with open(os.path.join(root, "sites", f"{site}.yaml"), encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError:
        lines = []
    for line in lines:
        if line.strip().startswith("ca_bundle:"):
            ca = line.split(":", 1)[1].strip().strip("'\"")
            try:
                h.update(_stamp(os.stat(ca)))
            except OSError:
                h.update(b"<missing>")
    return h.hexdigest()


def _cache_file(root: str, name: str, site_name: str | None, target: str) -> str:
    return os.path.join(root, CACHE_DIR, f"{name}--{site_name or 'local'}--{target}")


def remember(root, name: str, site_name: str | None, target: str, hash_: str, where: str) -> None:
    """After a build that ended OK or present: HASH_ lives at WHERE (an image tag, a SIF's absolute path).

    One line each (a header, the digest, the hash, where): reading it back needs no json module."""
    from envport.core.files import write_atomic

    root = os.fspath(root)
    if "\n" in where or "\r" in where:  # a path no line can hold: never remembered, always the full path
        try:
            os.unlink(_cache_file(root, name, site_name, target))
        except FileNotFoundError:
            pass
        return
    write_atomic(_cache_file(root, name, site_name, target),
                 f"{RECORD_HEADER}\n{inputs_digest(root, name, site_name, target)}\n{hash_}\n{where}\n")


def recall(root, name: str, site_name: str | None, target: str) -> tuple[str, str] | None:
    """(hash, where) remembered for exactly these inputs; None when nothing is, or anything changed."""
    root = os.fspath(root)
    try:
        with open(_cache_file(root, name, site_name, target), encoding="utf-8") as fh:
            lines = fh.read().split("\n")
    except (OSError, ValueError):
        return None
    if len(lines) != 5 or lines[0] != RECORD_HEADER or lines[4] or not (lines[2] and lines[3]):
        return None
    if lines[1] != inputs_digest(root, name, site_name, target):
        return None
    return lines[2], lines[3]


def checked(root, name: str, site_name: str | None, target: str, check) -> dict | None:
    """CHECK(hash, where) on the identity recalled for these inputs: its answer, or None when none is recalled."""
    hit = recall(root, name, site_name, target)
    return None if hit is None else check(*hit)

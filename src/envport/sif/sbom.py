"""A CycloneDX SBOM of a built env, read from what the env holds, never from its spec.

The content is a directory tree: a SIF's partition mounted read-only (`sif_sbom`:
`envport sbom FILE.sif`, and the apptainer-binary build route on the SIF apptainer
wrote), a docker image's layers mounted read-only or just the files this reader
opens streamed out of its export (`image_sbom`, `read_patterns`), or a venv's prefix
(envport's own .def builder reads its rootfs before it is squashed).  Whatever the
tree, only the files below are opened: the SBOM costs what it reads, not the
image's size.  Two sources, the ones syft reads too:

- Debian packages: the tree's `var/lib/dpkg/status`, the paragraphs whose
  Status is `install ok installed` (what `dpkg-query -W` lists as installed),
  as `pkg:deb/debian/NAME@VERSION?arch=A&distro=debian-N`;
- Python distributions: each `*.dist-info/METADATA` in the env interpreter's
  site-packages (the venv envport makes, /opt/envport/venv in containers;
  without one, the tree's python3 site- and dist-packages), as
  `pkg:pypi/NAME@VERSION`: what that interpreter's `pip list` shows. Debian's
  own python3-* packages are already listed as deb components. A METADATA whose
  Name pip would not accept (PEP 508: letters, digits, `.`, `_`, `-`; so no
  `../../../etc/passwd`, no terminal escapes) or whose Version is no PEP 440
  version is no component: it is skipped, counted and named (escaped) on stderr
  and in the SBOM's `envport:skipped` property.

The tree may come from an image nobody vouched for: no symlink inside it is
followed (a `var/lib/dpkg/status` pointing at the host's /etc/shadow is read
as absent, not followed out of the mount).

The output is deterministic: components sorted by purl, the serial number a
UUID5 of the env's hash and the components, the timestamp the env's own
(the SIF header's created time, the image's Created, the venv's pyvenv.cfg
mtime). `sif_object` and `append_to_sif` give the SIF object apptainer's sif
library defines for an SBOM (datatype 0x4009, Extra's first int32 the format
code, 1 = cyclonedx-json); `embed_sbom` is how every SIF envport builds gets
one, by either builder, before it gets its name and before any signature.
"""

from __future__ import annotations

import dataclasses
import email.parser
import errno
import os
import re
import stat
import struct
import sys
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterable, Optional

DPKG_STATUS = ("var", "lib", "dpkg", "status")
CONTAINER_VENV = ("opt", "envport", "venv")
# Without envport's venv: where Debian's and a hand-made image's python3 keep distributions.
SYSTEM_SITE_GLOBS = ("usr/lib/python3*/site-packages", "usr/lib/python3/dist-packages",
                     "usr/local/lib/python3*/site-packages", "usr/local/lib/python3*/dist-packages")
MAX_METADATA_BYTES = 4 << 20  # a METADATA larger than this is not a distribution's
MAX_STATUS_BYTES = 256 << 20
OS_RELEASE = (("etc", "os-release"), ("usr", "lib", "os-release"))
SBOM_DATATYPE = 0x4009
SBOM_FORMAT_CYCLONEDX_JSON = 1
SBOM_NAME = "sbom.cdx.json"
SERIAL_NAMESPACE = uuid.UUID("6f3c1a52-0b8e-4e39-9c1d-2f1e6b0e7a11")  # envport's, for uuid5 serial numbers
# PEP 508's distribution name, as pip and packaging accept it (packaging's canonical form names the purl).
DIST_NAME_RE = re.compile(r"^([A-Z0-9]|[A-Z0-9][A-Z0-9._-]*[A-Z0-9])$", re.IGNORECASE)


@dataclass(frozen=True, order=True)
class Package:
    purl: str
    kind: str  # "deb" or "pypi"
    name: str
    version: str
    where: str  # the file it was read from, relative to the tree


@dataclass(frozen=True)
class EnvFacts:
    """The spec's side of the SBOM: what the env is called and which hash and lock it was built from."""

    name: str
    hash: str
    target: str
    lock: Optional[str] = None  # "specs/x.lock sha256:..." or None: no lock, or not known
    created: Optional[datetime] = None
    skipped: tuple[str, ...] = ()  # "WHERE: why" of each distribution read but not listed (`unaccepted`)
    container: bool = True  # an image or SIF (CycloneDX type container); False: an env on a host (application)


class UnsafeTree(Exception):
    pass


def _open_inside(tree: Path, parts: Iterable[str]) -> Optional[int]:
    """A read-only fd of TREE/PARTS, or None when absent; no symlink is followed, at any level."""
    fd = os.open(tree, os.O_RDONLY | os.O_DIRECTORY)
    try:
        parts = list(parts)
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            flags = os.O_RDONLY | os.O_NOFOLLOW | (0 if last else os.O_DIRECTORY)
            try:
                nxt = os.open(part, flags, dir_fd=fd)
            except (FileNotFoundError, NotADirectoryError):
                return None
            except OSError as exc:  # ELOOP: a symlink, not followed
                if exc.errno == errno.ELOOP:
                    return None
                raise
            os.close(fd)
            fd = nxt
        result, fd = fd, -1
        return result
    finally:
        if fd >= 0:
            os.close(fd)


def _read_inside(tree: Path, parts: Iterable[str], limit: int) -> Optional[bytes]:
    fd = _open_inside(tree, parts)
    if fd is None:
        return None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            return None
        return fh.read(limit)


def _paragraphs(text: str) -> Iterable[dict[str, str]]:
    """dpkg's status file: RFC 822-like paragraphs; continuation lines (a leading space) are skipped."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                yield fields
            fields = {}
        elif not line[0].isspace() and ":" in line:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    if fields:
        yield fields


def debian_release(tree: Path) -> str:
    """`debian-12` from the tree's etc/os-release (usr/lib/os-release), else `debian`."""
    for parts in OS_RELEASE:
        raw = _read_inside(tree, parts, 1 << 16)
        if raw is None:
            continue
        values = dict(line.split("=", 1) for line in raw.decode("utf-8", "replace").splitlines() if "=" in line)
        ident, version = values.get("ID", "").strip('"'), values.get("VERSION_ID", "").strip('"')
        if ident and version:
            return f"{ident}-{version}"
    return "debian"


def debian_packages(tree: Path) -> list[Package]:
    from packageurl import PackageURL

    raw = _read_inside(tree, DPKG_STATUS, MAX_STATUS_BYTES)
    if raw is None:
        return []
    distro = debian_release(tree)
    found = []
    for p in _paragraphs(raw.decode("utf-8", "replace")):
        if p.get("Status") != "install ok installed" or not p.get("Package") or not p.get("Version"):
            continue
        qualifiers = {"arch": p["Architecture"]} if p.get("Architecture") else {}
        qualifiers["distro"] = distro
        purl = PackageURL("deb", "debian", p["Package"], p["Version"], qualifiers).to_string()
        found.append(Package(purl, "deb", p["Package"], p["Version"], "/".join(DPKG_STATUS)))
    return sorted(found)


def site_dirs(tree: Path, venv: Optional[tuple[str, ...]] = CONTAINER_VENV) -> list[tuple[str, ...]]:
    """The env interpreter's site-packages under TREE (as path parts), VENV's when the tree has one.

    The globs may pass through a symlink of the tree; _open_inside then refuses to read there."""
    cfg = _open_inside(tree, (*venv, "pyvenv.cfg")) if venv is not None else None
    if cfg is not None:
        os.close(cfg)
        dirs = sorted(tree.joinpath(*venv).glob("lib/python3*/site-packages"))
    else:
        dirs = sorted(d for g in SYSTEM_SITE_GLOBS for d in tree.glob(g))
    return [d.relative_to(tree).parts for d in dirs]


def unaccepted(name: str, version: str) -> Optional[str]:
    """Why pip would not accept a distribution of this METADATA Name and Version (escaped), or None."""
    from packaging.version import InvalidVersion, Version

    from envport.core.untrusted import shown

    if not DIST_NAME_RE.match(name):
        return f"Name '{shown(name, 80)}' is no distribution name (PEP 508: letters, digits, '.', '_', '-')"
    try:
        Version(version)
    except InvalidVersion:
        return f"Version '{shown(version, 80)}' of {name} is no PEP 440 version"
    return None


def python_distributions(tree: Path, venv: Optional[tuple[str, ...]] = CONTAINER_VENV,
                         skipped: Optional[list[str]] = None) -> list[Package]:
    """The distributions of the env's site-packages; one whose name or version pip would not accept is left
    out, and "WHERE: why" (escaped) appended to SKIPPED."""
    from packageurl import PackageURL
    from packaging.utils import canonicalize_name

    from envport.core.untrusted import shown

    found = []
    parser = email.parser.BytesHeaderParser()
    for parts in site_dirs(tree, venv):
        fd = _open_inside(tree, parts)
        if fd is None:
            continue
        try:
            entries = sorted(e.name for e in os.scandir(fd) if e.name.endswith(".dist-info")
                             and e.is_dir(follow_symlinks=False))
        finally:
            os.close(fd)
        for entry in entries:
            raw = _read_inside(tree, (*parts, entry, "METADATA"), MAX_METADATA_BYTES)
            if raw is None:
                continue
            meta = parser.parsebytes(raw)
            name, version = meta.get("Name"), meta.get("Version")
            if not name or not version:
                continue
            name, version, where = str(name).strip(), str(version).strip(), "/".join((*parts, entry, "METADATA"))
            why = unaccepted(name, version)
            if why is not None:
                if skipped is not None:
                    skipped.append(f"{shown(where)}: {why}")
                continue
            purl = PackageURL("pypi", None, canonicalize_name(name), version).to_string()
            found.append(Package(purl, "pypi", name, version, where))
    return sorted(set(found))


def read_tree(tree: Path, venv: Optional[tuple[str, ...]] = CONTAINER_VENV,
              skipped: Optional[list[str]] = None) -> list[Package]:
    """Every Debian package and Python distribution TREE holds, sorted by purl (SKIPPED: python_distributions)."""
    tree = Path(tree)
    return sorted(debian_packages(tree) + python_distributions(tree, venv, skipped))


def read_patterns(venv: Optional[tuple[str, ...]] = CONTAINER_VENV) -> tuple[str, ...]:
    """Every file read_tree may open, as fnmatch patterns of paths relative to the tree ('*' may cross a '/':
    a superset, harmless, since the reader still picks what it reads).  A tree holding only these files gives
    the same SBOM as the whole tree: an image's SBOM reads just them (`image_sbom`)."""
    fixed = ["/".join(DPKG_STATUS), *("/".join(parts) for parts in OS_RELEASE)]
    sites = list(SYSTEM_SITE_GLOBS)
    if venv:
        fixed.append("/".join((*venv, "pyvenv.cfg")))
        sites.append("/".join((*venv, "lib/python3*/site-packages")))
    return (*fixed, *(f"{site}/*.dist-info/METADATA" for site in sites))


def extract_patterns(venv: Optional[tuple[str, ...]] = CONTAINER_VENV) -> tuple[str, ...]:
    """read_patterns as unsquashfs extract patterns (`sif_sbom` where the partition is extracted, not mounted).
    unsquashfs matches each component as a shell wildcard in which a leading '.' must be matched by a '.', so
    `*.dist-info` would leave out a `.x.dist-info` folder the reader lists: each such pattern comes with
    its dotted twins (`.*.dist-info`, and `.dist-info` itself)."""
    out = []
    for pattern in read_patterns(venv):
        out.append(pattern)
        if "/*.dist-info/" in pattern:
            out += [pattern.replace("/*.dist-info/", "/.*.dist-info/"), pattern.replace("/*.dist-info/", "/.dist-info/")]
    return tuple(out)


def needed(venv: Optional[tuple[str, ...]] = CONTAINER_VENV) -> Callable[[str], bool]:
    """Whether read_tree may open a path (relative, '/'-separated, as a tar member names it): read_patterns."""
    import fnmatch

    pattern = re.compile("|".join(fnmatch.translate(p) for p in read_patterns(venv)))
    return lambda path: pattern.match(path) is not None


def image_sbom(image: str, facts: EnvFacts, fmt: str = "cyclonedx", graph: Optional[dict] = None,
               ) -> tuple[str, list[Package], str]:
    """(text, packages, how) of the docker image IMAGE, read at the cost of what the SBOM reads: its layers
    mounted read-only where this process may, else `docker export` filtered to the files `needed` accepts
    (engines/docker.py `image_files`; HOW says which).  The same SBOM as of the whole exported filesystem.
    GRAPH: the image's GraphDriver (inspect), when the caller has it."""
    from envport.engines.docker import image_files

    with image_files(image, needed(CONTAINER_VENV), graph=graph) as (tree, how):
        text, packages = make_sbom(tree, facts, CONTAINER_VENV, fmt)
    return text, packages, how


def warm_validator() -> None:
    """Import the CycloneDX validator (to_json) in a daemon thread: jsonschema compiles its IRI grammars at
    import, 2-5 s of CPU on a small host, the same whatever a build changed; a builder calls this as its engine
    starts, so the SBOM at its end finds them loaded.  A failed import is left for to_json to report."""
    import threading

    def _load() -> None:
        try:
            import cyclonedx.validation.json  # noqa: F401
            import jsonschema  # noqa: F401
        except Exception:  # to_json imports it again and says what is missing
            pass

    threading.Thread(target=_load, name="envport-sbom-validator", daemon=True).start()


def skipped_note(skipped) -> str:
    """One line for people and for the SBOM: how many distributions were left out, and each, escaped."""
    n = len(skipped)
    return (f"{n} Python distribution{'s' if n != 1 else ''} whose METADATA name or version pip would not accept, "
            f"not listed: " + "; ".join(skipped))


def build_bom(packages: list[Package], facts: EnvFacts):
    """The CycloneDX Bom: the env as metadata.component, one library component per package."""
    from cyclonedx.model import Property
    from cyclonedx.model.bom import Bom
    from cyclonedx.model.component import Component, ComponentType
    from packageurl import PackageURL
    from envport import __version__

    serial = uuid.uuid5(SERIAL_NAMESPACE, "\n".join([facts.hash, *(p.purl for p in packages)]))
    bom = Bom(serial_number=serial)
    if facts.created is not None:
        bom.metadata.timestamp = facts.created
    env = Component(name=facts.name, version=facts.hash[:12], type=ComponentType.CONTAINER
                    if facts.container else ComponentType.APPLICATION,
                    bom_ref=f"env:{facts.name}@{facts.hash[:12]}")
    bom.metadata.component = env
    props = [Property(name="envport:name", value=facts.name), Property(name="envport:hash", value=facts.hash),
             Property(name="envport:target", value=facts.target),
             Property(name="envport:lock", value=facts.lock or "none"),
             Property(name="envport:version", value=__version__)]
    if facts.skipped:
        props.append(Property(name="envport:skipped", value=skipped_note(facts.skipped)))
    for prop in props:
        bom.metadata.properties.add(prop)
    comps = []
    for p in packages:
        comp = Component(name=p.name, version=p.version, type=ComponentType.LIBRARY,
                         purl=PackageURL.from_string(p.purl), bom_ref=p.purl)
        comp.properties.add(Property(name="envport:source", value=p.where))
        bom.components.add(comp)
        comps.append(comp)
    # Flat: what the env holds, not who required whom (dpkg status and METADATA are not read for that).
    bom.register_dependency(env, comps)
    return bom


def to_json(bom) -> str:
    """The Bom as CycloneDX 1.6 JSON, validated against the library's own copy of the schema."""
    from cyclonedx.output.json import JsonV1Dot6
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    text = JsonV1Dot6(bom).output_as_string(indent=2)
    error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(text)
    if error is not None:
        raise ValueError(f"the SBOM does not validate against CycloneDX 1.6: {error}")
    return text + "\n"


def to_spdx_json(packages: list[Package], facts: EnvFacts) -> str:
    """The same content as SPDX 2.3 JSON (spdx-tools), validated by spdx-tools before it is returned: the
    env as the package the document describes, CONTAINS one package per component, each with its purl."""
    import io

    from spdx_tools.spdx.model import (Actor, ActorType, CreationInfo, Document, ExternalPackageRef,
                                       ExternalPackageRefCategory, Relationship, RelationshipType,
                                       SpdxNoAssertion)
    from spdx_tools.spdx.model import Package as SpdxPackage
    from spdx_tools.spdx.validation.document_validator import validate_full_spdx_document
    from spdx_tools.spdx.writer.json.json_writer import write_document_to_stream
    from envport import __version__

    serial = uuid.uuid5(SERIAL_NAMESPACE, "\n".join([facts.hash, *(p.purl for p in packages)]))
    created = (facts.created or timestamp(0)).astimezone(timezone.utc).replace(tzinfo=None)
    info = CreationInfo("SPDX-2.3", "SPDXRef-DOCUMENT", f"{facts.name}@{facts.hash[:12]}",
                        f"https://spdx.org/spdxdocs/envport-{facts.name}-{serial}",
                        [Actor(ActorType.TOOL, f"envport-{__version__}")], created)
    env = SpdxPackage("SPDXRef-env", facts.name, SpdxNoAssertion(), version=facts.hash[:12], files_analyzed=False,
                      comment=f"envport:hash {facts.hash}; envport:target {facts.target}; "
                      f"envport:lock {facts.lock or 'none'}"
                      + (f"; envport:skipped {skipped_note(facts.skipped)}" if facts.skipped else ""))
    pkgs = [SpdxPackage(f"SPDXRef-{p.kind}-{i}", p.name, SpdxNoAssertion(), version=p.version, files_analyzed=False,
                        source_info=f"read from {p.where}", external_references=[
                            ExternalPackageRef(ExternalPackageRefCategory.PACKAGE_MANAGER, "purl", p.purl)])
            for i, p in enumerate(packages, start=1)]
    rels = [Relationship("SPDXRef-DOCUMENT", RelationshipType.DESCRIBES, "SPDXRef-env")]
    rels += [Relationship("SPDXRef-env", RelationshipType.CONTAINS, p.spdx_id) for p in pkgs]
    doc = Document(info, packages=[env, *pkgs], relationships=rels)
    errors = validate_full_spdx_document(doc)
    if errors:
        raise ValueError(f"the SBOM does not validate as SPDX 2.3: {errors[0].validation_message}")
    out = io.StringIO()
    write_document_to_stream(doc, out, validate=False)
    return out.getvalue() + "\n"


FORMATS = ("cyclonedx", "spdx")


def make_sbom(tree: Path, facts: EnvFacts, venv: Optional[tuple[str, ...]] = CONTAINER_VENV,
              fmt: str = "cyclonedx") -> tuple[str, list[Package]]:
    """The SBOM of TREE as JSON text, and the packages in it. Without a created time of the env's own, the
    newest of the files it was read from (not the clock: the same tree gives the same bytes)."""
    skipped: list[str] = []
    packages = read_tree(tree, venv, skipped)
    if skipped:
        facts = dataclasses.replace(facts, skipped=tuple(skipped))
        print(f"envport: sbom: skipped {skipped_note(skipped)}", file=sys.stderr)
    if facts.created is None:
        newest = max((os.lstat(tree / p.where).st_mtime for p in packages), default=0)
        facts = dataclasses.replace(facts, created=timestamp(newest))
    text = to_spdx_json(packages, facts) if fmt == "spdx" else to_json(build_bom(packages, facts))
    return text, packages


def sif_sbom(source, facts: EnvFacts, fmt: str = "cyclonedx") -> tuple[str, list[Package]]:
    """The SBOM of SOURCE, read from its primary partition mounted read-only, nosuid, nodev: a Gated SIF
    (sif/gate.py: `envport sbom FILE.sif`, its partition mounted from the open file the gate judged), or the
    Path of a build's own partial (sif/run.py `mounted_own_build`: the apptainer-binary build route,
    builders/apptainer/binary.py).  SifError when it is no usable SIF, MountError when its partition cannot
    be mounted here (`mount_fix`).  Where it is extracted instead (no FUSE for this user, not root: sif/run.py),
    only the files read_tree opens are (`extract_patterns`), from the same open descriptor."""
    from envport.sif.run import mounted, mounted_own_build

    only = extract_patterns(CONTAINER_VENV)
    with (mounted_own_build(source, only=only) if isinstance(source, Path) else mounted(source, only=only)) as tree:
        return make_sbom(tree, facts, CONTAINER_VENV, fmt)


def embed_sbom(sif: Path, loaded, site, hash_: str, created: int, say: Callable[[str], None],
               rootfs: Optional[Path] = None) -> int:
    """Append the CycloneDX SBOM of the image's content to SIF, still its partial (before the rename: no SIF
    without one under the final name; before any signature, which then covers it); the number of components.
    The content: ROOTFS, the tree envport's own builder squashed (builders/apptainer/builder.py), or without
    one SIF's own partition mounted (`sif_sbom`: the apptainer-binary route, builders/apptainer/binary.py).
    CREATED: the SBOM's timestamp and the object's time (the SIF header's created time)."""
    facts = EnvFacts(loaded.spec.name, hash_, "apptainer", lock=lock_fact(loaded, site), created=timestamp(created))
    text, packages = make_sbom(rootfs, facts) if rootfs is not None else sif_sbom(Path(sif), facts)
    append_to_sif(sif, text.encode("utf-8"), when=created)
    say(f"SBOM: {len(packages)} components (CycloneDX, SIF object {SBOM_NAME})")
    return len(packages)


def sif_facts(info, lock: Optional[str] = None) -> EnvFacts:
    """What the SIF INFO (sif/format.py, as read) says it is: its envport.name / envport.hash labels
    (unsigned claims; its stem and `unknown` without them), LOCK, and the SIF header's created time."""
    from envport.sif.format import sif_labels

    labels = sif_labels(info)
    return EnvFacts(labels.get("envport.name", Path(info.path).stem), labels.get("envport.hash", "unknown"), "apptainer",
                    lock=lock, created=timestamp(info.created))


def mount_fix(unreadable: str) -> str:
    """The fix for a SIF partition that could not be mounted: the tools to install where squashfuse or
    fusermount is missing, else UNREADABLE (the tools are there: the partition itself is at fault)."""
    import shutil

    from envport.sif.run import squashfuse

    if shutil.which(squashfuse()) is None or not (shutil.which("fusermount3") or shutil.which("fusermount")):
        return "install squashfuse and fuse3 (apt-get install squashfuse fuse3), or run as root (a read-only loop mount)"
    return unreadable


def lock_fact(loaded, site) -> Optional[str]:
    """`specs/x.lock sha256:...` when the build used a lock (the site's `lock` and a lock file), else None."""
    from envport.plan.lock import lock_path, sha256_file

    path = lock_path(loaded)
    if not site.lock or not path.is_file():
        return None
    return f"specs/{path.name} sha256:{sha256_file(path)}"


def timestamp(seconds: float) -> datetime:
    return datetime.fromtimestamp(int(seconds), tz=timezone.utc)


# --- the SIF object ----------------------------------------------------------------------

SBOM_EXTRA = struct.Struct("<i")


def sif_object(data: bytes) -> tuple[int, bytes, str]:
    """(datatype, Extra, name) of a cyclonedx-json SBOM object, as apptainer's sif library writes one."""
    return SBOM_DATATYPE, SBOM_EXTRA.pack(SBOM_FORMAT_CYCLONEDX_JSON), SBOM_NAME


def append_to_sif(path: Path, data: bytes, when: Optional[int] = None) -> None:
    """Append DATA as the SBOM object of the SIF at PATH, in the primary partition's group.

    In place: the object goes after the last byte, then its descriptor into the first free slot, then the
    header (free slots, data size, modified time) last, each fsynced, so an interrupted append leaves at
    worst unreferenced bytes at the end. Must run before signing: a signature covers the group's objects.
    WHEN: the object's and header's modified time (default now; the builders pass the SIF's created time, so
    the same build gives the same bytes). `embed_sbom` calls it for both builders, on the partial: after
    write_sif's objects (builders/apptainer/builder.py) or `apptainer build` (binary.py), before the rename
    and before signing."""
    import time
    from envport.sif.format import (DESCRIPTOR, GROUP_MASK, HEADER, SifError, primary_partition, read_sif)

    info = read_sif(path)
    if info.descriptors_free < 1:
        raise SifError("no_free_descriptor", f"{path}: the descriptor table is full; rebuild it")
    part = primary_partition(info)
    datatype, extra, name = sif_object(data)
    used = {d.id for d in info.descriptors}
    new_id = max(used) + 1
    now = int(time.time()) if when is None else int(when)
    with open(path, "r+b") as fh:
        head = HEADER.unpack(fh.read(HEADER.size))
        fh.seek(head[9])
        table = fh.read(head[10])
        slot = next(i for i in range(head[8]) if not DESCRIPTOR.unpack_from(table, i * DESCRIPTOR.size)[1])
        offset = info.file_size
        fh.seek(offset)
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
        desc = DESCRIPTOR.pack(datatype, True, new_id, GROUP_MASK | (part.group or 1), 0, offset, len(data),
                               len(data), now, now, 0, 0, name.encode(), extra)
        fh.seek(head[9] + slot * DESCRIPTOR.size)
        fh.write(desc)
        fh.flush()
        os.fsync(fh.fileno())
        fields = list(head)
        fields[6], fields[7], fields[12] = now, head[7] - 1, offset + len(data) - head[11]
        fh.seek(0)
        fh.write(HEADER.pack(*fields))
        fh.flush()
        os.fsync(fh.fileno())

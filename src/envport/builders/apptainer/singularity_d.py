"""Write the `/.singularity.d` tree into a rootfs the way `apptainer build` does.

Two phases, as in apptainer:

1. `prepare_rootfs` before `%files`/`%post` (apptainer's conveyor-packer: the
   base environment, and for a docker/OCI base `env/10-docker2singularity.sh`,
   the image labels and a runscript from ENTRYPOINT/CMD). `%post` runs with the
   `env/*.sh` sourced, so the base image's ENV is in effect there.
2. `finish_rootfs` after `%post` (apptainer's insertMetadata,
   internal/pkg/build/metadata.go): `%help`, `labels.json`, the def as
   `Singularity`, `%environment` into `env/90-environment.sh`, `%startscript`,
   `%runscript`, `%test`.

What apptainer reads from a SIF at run time is `inspect-metadata.json` (for
`inspect`) and the env scripts (its own action scripts source
`/.singularity.d/env/*.sh` in name order); it does not need the image's
`actions/`. The action scripts here are envport's own: `actions/exec` is what
`ch-run IMAGE -- /.singularity.d/actions/exec CMD` runs where apptainer is
absent.

File contents and modes follow apptainer's (base_environment.go,
metadata.go, conveyorPacker_oci.go), with one deliberate difference noted at
`docker_env_script`.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .deffile import DefFile

SD = ".singularity.d"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Sources every env script in name order, then does its job: the contract
# apptainer's own actions keep, written for envport.
_SOURCE_ENV = """#!/bin/sh
# envport: load the image environment the way apptainer does, every
# /.singularity.d/env/*.sh in name order, then act.
for envport_env in /.singularity.d/env/*.sh; do
    if [ -f "$envport_env" ]; then
        # shellcheck source=/dev/null
        . "$envport_env"
    fi
done
unset envport_env
"""
ACTIONS = {
    "exec": _SOURCE_ENV + 'exec "$@"\n',
    "run": _SOURCE_ENV + """if [ -x /.singularity.d/runscript ]; then
    exec /.singularity.d/runscript "$@"
fi
echo "envport: no runscript in this image, starting /bin/sh" >&2
exec /bin/sh "$@"
""",
    "shell": _SOURCE_ENV + """if [ -x /bin/bash ]; then
    SHELL=/bin/bash
    export SHELL
    exec /bin/bash --norc "$@"
fi
SHELL=/bin/sh
export SHELL
exec /bin/sh "$@"
""",
    "test": _SOURCE_ENV + """if [ -x /.singularity.d/test ]; then
    exec /.singularity.d/test "$@"
fi
echo "envport: no %test in this image" >&2
exec /bin/sh -c true
""",
    "start": _SOURCE_ENV + """if [ -x /.singularity.d/startscript ]; then
    exec /.singularity.d/startscript
fi
""",
}
# apptainer's 99-base.sh puts its libs dir (where `--nv` binds the host's GPU
# libraries) on the library path; without it a `--nv` run finds no libcuda.
ENV_99_BASE = """#!/bin/sh
# envport: the libraries apptainer binds at run time (--nv) live here.
if [ -z "${LD_LIBRARY_PATH:-}" ]; then
    LD_LIBRARY_PATH=/.singularity.d/libs
else
    LD_LIBRARY_PATH="$LD_LIBRARY_PATH:/.singularity.d/libs"
fi
export LD_LIBRARY_PATH
"""
ENV_90_HEADER = "#!/bin/sh\n# envport: the %environment section of the .def follows.\n\n"
# %post appends `export K=V` lines here ($APPTAINER_ENVIRONMENT); sourced after 90-environment.sh.
ENV_91_HEADER = "#!/bin/sh\n# envport: what %post appended to $APPTAINER_ENVIRONMENT follows.\n\n"
SYMLINKS = {
    "singularity": f"{SD}/runscript",
    # apptainer >= 1.0 names it /apptainer; older images and tools look for /singularity.
    "apptainer": f"{SD}/runscript",
    ".run": f"{SD}/actions/run",
    ".exec": f"{SD}/actions/exec",
    ".shell": f"{SD}/actions/shell",
    ".test": f"{SD}/actions/test",
    "environment": f"{SD}/env/90-environment.sh",
}
BUILD_LABELS_FILE = ".build.labels"  # where %post may add labels ($APPTAINER_LABELS)
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September",
          "October", "November", "December")


@dataclass(frozen=True)
class Finished:
    labels: dict[str, str]
    ignored_labels: tuple[str, ...]  # %labels keys the image already had: kept, as apptainer does


def _dq(value: str) -> str:
    """VALUE for the inside of a POSIX double-quoted string."""
    return re.sub(r'([\\"`$])', r"\\\1", value)


def docker_env_script(env: Sequence[str]) -> str:
    """`env/10-docker2singularity.sh` for an image's `K=V` ENV list.

    One `export K="${K:-"v"}"` line per variable (the host's value wins, as in
    apptainer), PATH set outright. Apptainer escapes the value twice (Go %q
    over shell escaping), which turns a `$` or `\\` in an image ENV value into
    a literal backslash; this escapes once, so the variable holds exactly the
    image's value. For plain values the two agree byte for byte."""
    lines = ["#!/bin/sh\n"]
    for item in env:
        key, sep, value = item.partition("=")
        if not _ENV_NAME.fullmatch(key):
            raise ValueError(f"image ENV entry {item!r}: {key!r} is not a shell variable name")
        if not sep:
            lines.append(f'export {key}="${{{key}:-}}"\n')
        elif key == "PATH":
            lines.append(f'export PATH="{_dq(value)}"\n')
        else:
            lines.append(f'export {key}="${{{key}:-"{_dq(value)}"}}"\n')
    return "".join(lines)


def _sq(word: str) -> str:
    return "'" + word.replace("'", "'\"'\"'") + "'"


def oci_runscript(entrypoint: Sequence[str], cmd: Sequence[str]) -> str:
    """A runscript with docker's semantics: ENTRYPOINT + (the arguments, else CMD); a shell if neither."""
    ep = " ".join(_sq(w) for w in entrypoint)
    default = " ".join(_sq(w) for w in cmd)
    if not entrypoint and not cmd:
        return '#!/bin/sh\n\nif [ "$#" -gt 0 ]; then\n    exec "$@"\nfi\nexec /bin/sh\n'
    run_args = f'{ep} "$@"'.strip()
    run_default = f"{ep} {default}".strip()
    return (f'#!/bin/sh\n\nif [ "$#" -gt 0 ]; then\n    exec {run_args}\nfi\n'
            f"exec {run_default}\n")


def _script_file(body: str, args: str) -> str:
    """A %runscript/%test/%startscript body as apptainer writes it: shebang (+ section args), blank, body."""
    shebang, script = "#!/bin/sh", body
    if body.strip().startswith("#!"):
        first, _, script = body.lstrip().partition("\n")
        shebang = first.strip()
    if args:
        shebang += " " + args.split("#", 1)[0]
    return f"{shebang}\n\n{script}\n"


def _write(root: Path, rel: str, text: str, mode: int) -> None:
    """Write ROOT/REL, never through a symlink: an image's absolute link (etc/resolv.conf ->
    /run/...) would otherwise write onto the build host."""
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    real_root, real_parent = os.path.realpath(root), os.path.realpath(path.parent)
    if os.path.commonpath([real_root, real_parent]) != real_root:
        raise ValueError(f"{path}: its directory resolves to {real_parent}, outside the rootfs {real_root} "
                         "(a symlink in the image); refusing to write there")
    if path.is_symlink():
        path.unlink()
    path.write_text(text, encoding="utf-8")
    os.chmod(path, mode)


def _symlink(root: Path, name: str, target: str) -> None:
    link = root / name
    if link.is_symlink() or link.exists():
        return  # apptainer keeps what the image has
    link.symlink_to(target)


def go_json_indent(value) -> str:
    """JSON as Go's json.MarshalIndent(v, "", "\\t") writes a map: sorted keys, <>& escaped."""
    return _go_escapes(json.dumps(value, indent="\t", sort_keys=True, ensure_ascii=False))


def _go_escapes(text: str) -> str:
    r"""Go's encoder escapes <, >, &, U+2028/9 and writes \b \f as \u0008 \u000c."""
    text = re.sub(r"\\(.)", lambda m: {"b": "\\u0008", "f": "\\u000c"}.get(m.group(1), m.group(0)), text)
    for ch, esc in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                    ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(ch, esc)
    return text


def prepare_rootfs(root: str | os.PathLike, *, image_env: Sequence[str] = (),
                   image_labels: Mapping[str, str] | None = None,
                   entrypoint: Sequence[str] = (), cmd: Sequence[str] = ()) -> None:
    """The tree apptainer lays down right after bootstrap, before %files and %post."""
    root = Path(root)
    for d in ("libs", "actions", "env"):
        (root / SD / d).mkdir(parents=True, exist_ok=True)
    for d in ("dev", "proc", "sys", "root", "tmp", "var/tmp", "etc", "home"):
        (root / d).mkdir(parents=True, exist_ok=True)
    for name, target in SYMLINKS.items():
        _symlink(root, name, target)
    for rel in ("etc/hosts", "etc/resolv.conf"):
        _write(root, rel, "", 0o644)
    for name, text in ACTIONS.items():
        _write(root, f"{SD}/actions/{name}", text, 0o755)
    _write(root, f"{SD}/env/10-docker2singularity.sh", docker_env_script(image_env), 0o755)
    _write(root, f"{SD}/env/90-environment.sh", ENV_90_HEADER, 0o755)
    _write(root, f"{SD}/env/91-environment.sh", ENV_91_HEADER, 0o755)
    _write(root, f"{SD}/env/99-base.sh", ENV_99_BASE, 0o755)
    _write(root, f"{SD}/runscript", oci_runscript(entrypoint, cmd), 0o755)
    _write(root, f"{SD}/startscript", "#!/bin/sh\n", 0o755)
    _write(root, f"{SD}/labels.json", go_json_indent(dict(image_labels or {})), 0o644)


def build_labels(deffile: DefFile, *, created: int, arch: str = "amd64") -> dict[str, str]:
    """The labels apptainer adds to every build (addBuildLabels), for time CREATED (UTC).

    `org.label-schema.usage.apptainer.version` is left out: no apptainer made this image."""
    t = time.gmtime(created)
    labels = {
        "org.label-schema.schema-version": "1.0",
        "org.opencontainers.image.created": time.strftime("%Y-%m-%dT%H:%M:%SZ", t),
        "org.label-schema.build-date": (f"{WEEKDAYS[t.tm_wday]}_{t.tm_mday}_{MONTHS[t.tm_mon - 1]}_"
                                        f"{t.tm_year}_{t.tm_hour}:{t.tm_min}:{t.tm_sec}_UTC"),
        "org.opencontainers.image.architecture": arch,
        "org.label-schema.build-arch": arch,
    }
    if deffile.script("help"):
        labels["org.label-schema.usage"] = f"/{SD}/runscript.help"
        labels["org.label-schema.usage.apptainer.runscript.help"] = f"/{SD}/runscript.help"
    for key, value in deffile.header.items():
        labels[f"org.label-schema.usage.singularity.deffile.{key}"] = value
    return labels


def _read_build_labels(root: Path) -> dict[str, str]:
    """Labels %post appended to $APPTAINER_LABELS (`KEY VALUE` lines); the file is consumed."""
    path = root / BUILD_LABELS_FILE
    if not path.is_file():
        return {}
    labels = {}
    # \n only, as apptainer reads it (splitlines() would also cut at U+2028/U+2029/U+0085).
    for line in path.read_text(encoding="utf-8").split("\n"):
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition(" ")
            labels[key.strip()] = value.strip()
    path.unlink()
    return labels


def _merge_labels(root: Path, deffile: DefFile, created: int, arch: str,
                  extra: Mapping[str, str] | None = None) -> Finished:
    """labels.json as insertLabelsJSON builds it: image labels, %post's labels, build labels (and the
    builder's EXTRA ones), then %labels, which never override a label the image already has (apptainer
    without --force)."""
    path = root / SD / "labels.json"
    labels = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    labels.update(_read_build_labels(root))
    labels.update(build_labels(deffile, created=created, arch=arch))
    labels.update(extra or {})
    ignored = []
    for key, value in deffile.labels:
        if key in labels and labels[key] != value:
            ignored.append(key)
            continue
        labels[key] = value
    return Finished(labels=labels, ignored_labels=tuple(ignored))


def finish_rootfs(root: str | os.PathLike, deffile: DefFile, *, created: int,
                  arch: str = "amd64", extra_labels: Mapping[str, str] | None = None) -> Finished:
    """The metadata apptainer writes after %post (with the builder's EXTRA_LABELS); returns the labels."""
    root = Path(root)
    if not (root / SD / "env").is_dir():
        prepare_rootfs(root)
    if help_text := deffile.script("help"):
        _write(root, f"{SD}/runscript.help", help_text + "\n", 0o644)
    finished = _merge_labels(root, deffile, created, arch, extra_labels)
    _write(root, f"{SD}/labels.json", go_json_indent(finished.labels), 0o644)
    singularity = root / SD / "Singularity"
    if singularity.exists():
        history = root / SD / "bootstrap_history"
        history.mkdir(exist_ok=True)
        singularity.rename(history / f"Apptainer{len(list(history.iterdir()))}")
    _write(root, f"{SD}/Singularity", deffile.text, 0o644)
    if env := deffile.script("environment"):
        with open(root / SD / "env" / "90-environment.sh", "a", encoding="utf-8") as fh:
            fh.write("\n" + env + "\n")
    for name in ("startscript", "runscript", "test"):
        if body := deffile.script(name):
            _write(root, f"{SD}/{name}", _script_file(body, deffile.args(name)), 0o755)
    return finished


def write_singularity_d(root: str | os.PathLike, deffile: DefFile, *, created: int,
                        image_env: Sequence[str] = (), image_labels: Mapping[str, str] | None = None,
                        entrypoint: Sequence[str] = (), cmd: Sequence[str] = (),
                        arch: str = "amd64") -> Finished:
    """Both phases at once, for a rootfs whose %files and %post are done (or absent)."""
    prepare_rootfs(root, image_env=image_env, image_labels=image_labels, entrypoint=entrypoint, cmd=cmd)
    return finish_rootfs(root, deffile, created=created, arch=arch)


def inspect_metadata(*, deffile: str, labels: Mapping[str, str], environment: Mapping[str, str],
                     runscript: str = "", test: str = "", helpfile: str = "", startscript: str = "") -> bytes:
    """The `inspect-metadata.json` SIF object: what `apptainer inspect --all` prints.

    Shape from apptainer's pkg/inspect/metadata.go: {"data": {"attributes":
    {...}}, "type": "container"}, attributes in Go's field order (apps,
    environment, labels, runscript, test, helpfile, deffile, startscript),
    empty ones left out (omitempty), maps with sorted keys; encoded compactly
    as the build's json.Marshal does (internal/pkg/build/metadata.go). Values
    are file contents without trailing newlines (cmd/internal/cli/inspect.go
    setAttribute); ENVIRONMENT maps each env script's path in the image
    (`/.singularity.d/env/90-environment.sh`) to its text."""
    attributes = {
        "environment": {k: environment[k] for k in sorted(environment)},
        "labels": {k: labels[k] for k in sorted(labels)},
        "runscript": runscript, "test": test, "helpfile": helpfile, "deffile": deffile,
        "startscript": startscript,
    }
    attributes = {k: v for k, v in attributes.items() if v}
    doc = {"data": {"attributes": attributes}, "type": "container"}
    return _go_escapes(json.dumps(doc, ensure_ascii=False, separators=(",", ":"))).encode("utf-8")


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8").rstrip("\n") if path.is_file() else ""


def inspect_metadata_for_root(root: str | os.PathLike) -> bytes:
    """`inspect_metadata` read back from a finished tree, as apptainer runs `inspect --all` on the
    sandbox it is about to squash: the SIF's JSON then agrees with its squashfs by construction."""
    sd = Path(root) / SD
    env_files = sorted(sd.glob("env/10-docker*.sh")) + sorted(sd.glob("env/9*-environment.sh"))
    labels_path = sd / "labels.json"
    return inspect_metadata(
        deffile=_text(sd / "Singularity"),
        labels=json.loads(labels_path.read_text(encoding="utf-8")) if labels_path.is_file() else {},
        environment={f"/{SD}/env/{p.name}": _text(p) for p in env_files if p.is_file()},
        runscript=_text(sd / "runscript"), test=_text(sd / "test"),
        helpfile=_text(sd / "runscript.help"), startscript=_text(sd / "startscript"))

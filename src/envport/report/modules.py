"""Environment modules for a SIF that passed the trust gate: what `envport module install` writes.

An admin publishes a verified SIF to users as a module, the way shpc does for other people's images, but
generated from the spec the SIF itself embeds (`envport-spec.json`): one Lmod (Lua) and one Environment
Modules (Tcl) modulefile and one wrapper script per executable the spec names (a script, not an alias: it
survives srun and mpirun).  Layout under the modulepath DIR, one version per env hash:

    DIR/NAME/HASH12.lua      Lmod's modulefile (Lmod prefers it to the Tcl one beside it)
    DIR/NAME/HASH12          the Tcl one (#%Module1.0)
    DIR/NAME/.version        `set ModulesVersion HASH12`, with --default (both tools read it)
    DIR/NAME/.HASH12/        the payload (hidden: no tool lists it): bin/<exe> wrappers, the SIF's copy
                             NAME-HASH12.sif, module.json (what was installed, from what, signed by whom)

The SIF is copied from the descriptor the gate judged (never the path again) into the payload, so the
module depends on no file another user controls.  Nothing is half-written: the payload is written into
`.HASH12.partial-PID` beside it and renamed into place; the modulefiles follow, each written atomically,
so a module tool never sees a modulefile whose payload is not complete.  Every text from the SIF goes
into the modulefiles as a quoted Lua or Tcl string, and into the wrappers shell-quoted.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from envport.core.files import remove_dir, swap_dir, write_atomic
from envport.core.verdict import StepResult, Verdict

RECORD = "module.json"
LUA_TEMPLATE = "module.lua.j2"
TCL_TEMPLATE = "module.tcl.j2"
WRAPPER_TEMPLATE = "module_wrapper.sh.j2"
VERSION_FILE = ".version"
# A command word a wrapper may be named after: a plain file name, no path, no shell syntax.
EXECUTABLE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}\Z")
# Words of a CLI witness that are the shell's, not an executable of the env.
SHELL_WORDS = frozenset({"sh", "bash", "env", "echo", "test", "true", "false", "cd", "exec", "command",
                         "printf", "set", "export", "exit", "type", "which", "timeout", "time", "nice"})


@dataclass(frozen=True)
class Module:
    """One version of one env's module: everything the templates and the record need."""

    name: str
    hash: str  # the env's full hash (the image's own envport.hash label, the embedded spec's)
    description: str
    source: str  # the SIF as the admin named it
    modulepath: Path
    signer: str  # "verified: KEY (keyid)" | "unsigned" | "<verdict>: <why>"
    sbom: str
    witnessed: str
    spec_line: str
    executables: tuple[str, ...]
    runner: tuple[str, ...]  # the wrapper's command up to the SIF: apptainer exec ..., or envport module exec ...
    runtime: str  # apptainer | envport (ch-run)
    gpus: bool
    binds: tuple[tuple[str, str], ...] = ()  # (host folder, path in the image): the weights, read-only
    partition_sha256: str = ""
    tool: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def version(self) -> str:
        return self.hash[:12]

    @property
    def folder(self) -> Path:
        return self.modulepath / self.name

    @property
    def payload(self) -> Path:
        return self.folder / f".{self.version}"

    @property
    def bin(self) -> str:
        return str(self.payload / "bin")

    @property
    def sif_name(self) -> str:
        return f"{self.name}-{self.version}.sif"

    @property
    def sif(self) -> str:
        return str(self.payload / self.sif_name)

    @property
    def bind_suffix(self) -> str:
        return ":ro" if self.runtime == "apptainer" else ""

    @property
    def separator(self) -> str:
        return "" if self.runtime == "apptainer" else "-- "

    @property
    def help(self) -> str:
        lines = [f"{self.name} {self.version}: {self.description or 'an envport env'}",
                 f"Spec:      {self.spec_line}",
                 f"Signer:    {self.signer}",
                 f"SBOM:      {self.sbom}",
                 f"Witnessed: {self.witnessed}",
                 f"SIF:       {self.sif}",
                 f"Runtime:   {self.runtime}" + (" (--nv: the spec asks for GPUs)" if self.gpus else ""),
                 "Commands (each runs inside the SIF): " + ", ".join(self.executables)]
        if self.binds:
            lines.append("Weights (bound read-only where the folder exists): "
                         + ", ".join(f"{h} -> {p}" for h, p in self.binds))
        return "\n".join(lines)

    def record(self) -> dict:
        return {"name": self.name, "hash": self.hash, "version": self.version, "source": self.source,
                "sif": self.sif, "partition_sha256": self.partition_sha256, "signer": self.signer,
                "sbom": self.sbom, "witnessed": self.witnessed, "spec": self.spec_line,
                "executables": list(self.executables), "runtime": self.runtime, "gpus": self.gpus,
                "binds": [list(b) for b in self.binds], "runner": list(self.runner)}


def executables(spec) -> tuple[str, ...]:
    """What the spec names to run: `python`, then the first word of each CLI witness that is a plain
    command (not a path, not a shell word), in the spec's order."""
    out = ["python"]
    for check in spec.witnesses.cli:
        try:
            words = shlex.split(check.cmd)
        except ValueError:
            continue
        if words and EXECUTABLE.match(words[0]) and words[0] not in SHELL_WORDS and words[0] not in out:
            out.append(words[0])
    return tuple(out)


def witnessed(spec) -> str:
    """What the spec's witnesses prove, in one line."""
    w = spec.witnesses
    parts = []
    if w.imports:
        parts.append("imports " + ", ".join(w.imports))
    if w.cli:
        parts.append("cli " + "; ".join(c.cmd for c in w.cli))
    if w.kernel:
        parts.append("a GPU kernel")
    if w.collectives:
        parts.append(f"collectives (world size {w.collectives.world_size})")
    if w.dtensor:
        parts.append(f"dtensor (mesh {w.dtensor.mesh})")
    return "; ".join(parts) or "nothing (the spec names no witness)"


def sbom_line(report_facts: dict, sif_name: str) -> str:
    """The SBOM object the SIF carries, or that it carries none."""
    for obj in report_facts.get("objects") or []:
        if str(obj.get("name", "")).startswith("sbom."):
            return (f"object {obj['id']} {obj['name']} ({obj['size']} bytes) in {sif_name}; "
                    f"read it with: envport sbom {sif_name}")
    return f"none: {sif_name} carries no SBOM object"


# --- quoting: every text from the SIF reaches a modulefile as a string literal, never as code -------------

def _quoted(value, specials: str, control) -> str:
    """VALUE between double quotes: SPECIALS backslashed, a newline as \\n, other controls as CONTROL(code)."""
    out = ['"']
    for ch in str(value):
        if ch in specials:
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ord(ch) < 32 or ord(ch) == 127:
            out.append(control(ord(ch)))
        else:
            out.append(ch)
    return "".join(out) + '"'


def lua_string(value) -> str:
    return _quoted(value, '\\"', lambda code: f"\\{code:03d}")


def tcl_string(value) -> str:
    # Tcl substitutes $var, [cmd] and {...} even inside double quotes: each is backslashed.
    return _quoted(value, '\\"$[]{}', lambda code: f"\\x{code:02x}")


def _oneline(value) -> str:
    return re.sub(r"[\x00-\x1f\x7f]", "?", str(value))


def _env():
    import jinja2

    from envport.renderers import ENV

    env = ENV.overlay(loader=jinja2.FileSystemLoader(str(Path(__file__).parent)))
    env.filters.update(lua=lua_string, tcl=tcl_string, sh=shlex.quote, oneline=_oneline)
    return env


def render(module: Module) -> dict[str, str]:
    """The texts of one version, by path relative to the env's folder DIR/NAME."""
    env = _env()
    payload = f".{module.version}"
    texts = {f"{module.version}.lua": env.get_template(LUA_TEMPLATE).render(m=module),
             module.version: env.get_template(TCL_TEMPLATE).render(m=module),
             f"{payload}/{RECORD}": json.dumps(module.record(), indent=2, sort_keys=True) + "\n"}
    wrapper = env.get_template(WRAPPER_TEMPLATE)
    for exe in module.executables:
        texts[f"{payload}/bin/{exe}"] = wrapper.render(m=module, exe=exe)
    return texts


def shpc_entry(module: Module, repository: str, tag: str, digest: str, existing: Optional[dict] = None) -> str:
    """The text of a Singularity-HPC `container.yaml` for MODULE pulled from oras://REPOSITORY:TAG, pinned by
    the manifest DIGEST (`tags`, `latest`), merged into EXISTING (the file there: other tags stay), its aliases
    the module's executables (each the command of that name inside the image), `features.gpu` when the spec
    asks for GPUs. Only the fields shpc's schema allows (it refuses any other)."""
    import yaml

    old = existing if isinstance(existing, dict) else {}
    tags = {str(k): str(v) for k, v in (old.get("tags") or {}).items()} if isinstance(old.get("tags"), dict) else {}
    tags[tag] = digest
    entry = {
        "oras": repository,
        "url": f"oras://{repository}",
        "maintainer": f"envport module install (signer: {module.signer})",
        "description": module.description or f"envport env {module.name}",
        "latest": {tag: digest},
        "tags": dict(sorted(tags.items())),
        "aliases": {exe: exe for exe in module.executables},
    }
    if module.gpus:
        entry["features"] = {"gpu": True}
    return ("# Written by `envport module install oras://... --shpc DIR` from the spec the SIF embeds; "
            "shpc reads it unchanged.\n" + yaml.safe_dump(entry, sort_keys=False, allow_unicode=False))


# --- install, list, show, uninstall -------------------------------------------------------------------------

def _same(folder: Path, texts: dict[str, str], module: Module) -> bool:
    for rel, text in texts.items():
        try:
            if (folder / rel).read_text() != text:
                return False
        except (OSError, UnicodeDecodeError):
            return False
    sif = Path(module.sif)
    return sif.is_file() and not sif.is_symlink()


def install(module: Module, sif_file, size: int, default: bool) -> StepResult:
    """Write MODULE (module docstring): `present` when every file is already what it would write. SIF_FILE:
    the gated open file (sif/handle.py SifFile), copied by its descriptor, SIZE bytes."""
    step = f"module {module.name}/{module.version}"
    texts = render(module)
    folder = module.folder
    if _same(folder, texts, module) and (not default or _default_of(folder) == module.version):
        return StepResult(step, Verdict.PRESENT, f"already in {module.modulepath}", data=module.record())
    folder.mkdir(parents=True, exist_ok=True)
    _remove_stale_partials(folder)
    partial = folder / f".{module.version}.partial-{os.getpid()}"
    try:
        (partial / "bin").mkdir(parents=True)
        with open(partial / module.sif_name, "xb") as out:
            for chunk in sif_file.chunks(0, size):
                out.write(chunk)
        os.chmod(partial / module.sif_name, 0o644)
        prefix = f".{module.version}/"
        for rel, text in texts.items():
            if rel.startswith(prefix):
                target = partial / rel[len(prefix):]
                target.write_text(text)
                os.chmod(target, 0o755 if "/bin/" in rel else 0o644)
        for d in (partial / "bin", partial):
            os.chmod(d, 0o755)
        swap_dir(partial, module.payload)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    for rel, text in texts.items():
        if not rel.startswith("."):
            write_atomic(folder / rel, text, 0o644)
    if default:
        write_atomic(folder / VERSION_FILE, f"#%Module1.0\nset ModulesVersion {tcl_string(module.version)}\n")
    return StepResult(step, Verdict.OK, f"{len(module.executables)} wrapper(s) ({', '.join(module.executables)}) "
                      f"and Lua + Tcl modulefiles in {folder}", data=module.record())


def _remove_stale_partials(folder: Path) -> None:
    """`.HASH12.partial-PID` and `.old-PID` folders whose process is gone (an interrupted install)."""
    for p in folder.glob(".*-*"):
        kind, _, pid = p.name.rpartition("-")
        if not kind.endswith((".partial", ".old")) or not pid.isdigit() or Path(f"/proc/{pid}").exists():
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)


def _default_of(folder: Path) -> Optional[str]:
    try:
        text = (folder / VERSION_FILE).read_text()
    except OSError:
        return None
    found = re.search(r'set ModulesVersion "?([^"\s]+)"?', text)
    return found.group(1) if found else None


def installed(modulepath: Path) -> list[dict]:
    """Every version under MODULEPATH that envport wrote: its record, `default` and whether it is whole."""
    out = []
    for folder in sorted(p for p in Path(modulepath).iterdir() if p.is_dir() and not p.name.startswith(".")) \
            if Path(modulepath).is_dir() else []:
        default = _default_of(folder)
        for payload in sorted(folder.glob(".*/" + RECORD)):
            try:
                rec = json.loads(payload.read_text())
            except (OSError, ValueError):
                continue
            version = str(rec.get("version", ""))
            whole = (folder / f"{version}.lua").is_file() and (folder / version).is_file()
            out.append({**rec, "default": version == default, "whole": whole,
                        "modulefile": str(folder / f"{version}.lua")})
    return out


def find(modulepath: Path, ref: str) -> list[dict]:
    """The installed versions REF names: NAME (every version) or NAME/VERSION (a prefix of the hash)."""
    name, _, version = ref.partition("/")
    return [r for r in installed(modulepath)
            if r.get("name") == name and (not version or str(r.get("hash", "")).startswith(version))]


def uninstall(modulepath: Path, rec: dict) -> StepResult:
    """Remove one version: its modulefiles first (so no tool loads a module without its payload), then the
    payload; `.version` when it named this version, the env's folder when it is empty."""
    folder = Path(modulepath) / rec["name"]
    version = rec["version"]
    for rel in (f"{version}.lua", version):
        with contextlib.suppress(FileNotFoundError):
            (folder / rel).unlink()
    if _default_of(folder) == version:
        (folder / VERSION_FILE).unlink()
    payload = folder / f".{version}"
    remove_dir(payload)
    with contextlib.suppress(OSError):
        folder.rmdir()
    return StepResult(f"module {rec['name']}/{version}", Verdict.OK, f"removed from {modulepath}")

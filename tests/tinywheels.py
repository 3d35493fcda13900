"""Small local wheels and a venv build that reaches no network: what the shell-builder tests install.

- ``make_wheelhouse(dir)``: real wheels (zip, dist-info with METADATA, WHEEL, RECORD, entry points) for a
  few tiny packages with versions and dependencies chosen to reproduce the issue's cases: `beta 2.0`
  requires `alpha>=2` (a later phase moves a pinned package), `gamma` pulls `delta` (a removed package
  leaves its dependency behind), `alpha` has a console script (a moved venv breaks shebangs).
  Real pip installs them; building them takes milliseconds, so every test can afford fresh envs.
- ``make_wheel(dir, name, version, requires, files)``: one such wheel, of a tiny package or of the files given;
  ``local_phase(root, *packages)``: a pip phase that only ROOT/wheels serves.
- ``ShellProject``: a project root with one spec, built by the real CLI into its own ENVPORT_ENVS_DIR,
  with pip pointed at the wheelhouse only (`PIP_NO_INDEX`, `PIP_CONFIG_FILE=/dev/null`: the host's pip
  config, constraints and find-links, stay out).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional, Sequence, Union

import yaml

# name -> version -> requirements
PACKAGES: dict[str, dict[str, list[str]]] = {
    "alpha": {"1.0": [], "2.0": []},
    "beta": {"1.0": ["alpha"], "2.0": ["alpha>=2"]},
    "gamma": {"1.0": ["delta"]},
    "delta": {"1.0": [], "1.1": []},
    "epsilon": {"1.0": []},
}


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def make_wheel(out: Path, name: str, version: str, requires: Sequence[str] = (),
               files: Optional[Mapping[str, Union[str, bytes]]] = None) -> Path:
    """A real pure-python wheel NAME-VERSION in OUT (made if missing), the same bytes each time. It installs
    FILES ({path in site-packages: content}), else a package NAME with `__version__` and `main()` (and
    alpha's console script); REQUIRES are its Requires-Dist lines."""
    stem = f"{name.replace('-', '_')}-{version}"
    dist = f"{stem}.dist-info"
    extra: dict[str, str] = {}
    if files is None:
        files = {f"{name}/__init__.py": f"__version__ = {version!r}\n\ndef main():\n    print({name!r}, __version__)\n"}
        extra[f"{dist}/top_level.txt"] = f"{name}\n"
        if name == "alpha":
            extra[f"{dist}/entry_points.txt"] = "[console_scripts]\nalpha-cli = alpha:main\n"
    meta = {f"{dist}/METADATA": ("Metadata-Version: 2.1\n"
                                 f"Name: {name}\nVersion: {version}\n"
                                 + "".join(f"Requires-Dist: {r}\n" for r in requires)
                                 + f"\nTiny test package {name}.\n"),
            f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: envport-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    entries = {p: d.encode() if isinstance(d, str) else d for p, d in {**files, **meta, **extra}.items()}
    record = "".join(_record_line(p, d) + "\n" for p, d in entries.items()) + f"{dist}/RECORD,,\n"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{stem}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for p, d in entries.items():
            zf.writestr(zipfile.ZipInfo(p, (2020, 1, 1, 0, 0, 0)), d)
        zf.writestr(zipfile.ZipInfo(f"{dist}/RECORD", (2020, 1, 1, 0, 0, 0)), record)
    return path


def local_phase(root: Path, *packages: str) -> dict:
    """A pip phase served only by ROOT/wheels (its own empty file:// index stands in for PyPI)."""
    (root / "simple").mkdir(exist_ok=True)
    return {"packages": list(packages), "index_url": f"file://{root}/simple", "find_links": [str(root / "wheels")]}


def make_wheelhouse(out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    for name, versions in PACKAGES.items():
        for version, requires in versions.items():
            make_wheel(out, name, version, requires)
    return out


def pip_env(wheelhouse: Path, envs_dir: Path, **extra: str) -> dict:
    env = dict(os.environ)
    for key in list(env):
        if key.startswith("PIP_") or key in ("ENVPORT_REBUILD", "ENVPORT_ROOT", "VIRTUAL_ENV"):
            env.pop(key)
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(wheelhouse),
               PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_WARN_SCRIPT_LOCATION="1",
               ENVPORT_ENVS_DIR=str(envs_dir))
    env.update(extra)
    return env


def spec_data(name: str, phases: list, env: dict | None = None, **fields) -> dict:
    data = {"name": name, "base": "envport/debian-bookworm:base", "python": "3.11", "pip_phases": phases}
    if env:
        data["env"] = env
    data.update(fields)
    return data


@dataclass
class ShellProject:
    """A project root with specs/, one envs dir, one wheelhouse; `build` runs the real CLI."""

    root: Path
    envs_dir: Path
    wheelhouse: Path
    extra_env: dict = field(default_factory=dict)

    @classmethod
    def make(cls, base: Path, wheelhouse: Path, envs: str = "envs") -> "ShellProject":
        (base / "specs").mkdir(parents=True, exist_ok=True)
        return cls(base, base / envs, wheelhouse)

    def write(self, data: dict) -> Path:
        path = self.root / "specs" / f"{data['name']}.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    def env(self, **extra: str) -> dict:
        return pip_env(self.wheelhouse, self.envs_dir, **{**self.extra_env, **extra})

    def argv(self, name: str, *args: str) -> list[str]:
        return [sys.executable, "-m", "envport", "-C", str(self.root), "build", name, "--target", "venv", "--json",
                *args]

    def build(self, name: str, *args: str, timeout: float = 300, **extra: str) -> "Built":
        proc = subprocess.run(self.argv(name, *args), cwd=self.root, capture_output=True, text=True,
                              timeout=timeout, env=self.env(**extra))
        try:
            out = json.loads(proc.stdout)
        except ValueError:
            out = {}
        return Built(proc, out)

    def prefix(self, name: str) -> Path:
        return self.envs_dir / name


@dataclass
class Built:
    proc: subprocess.CompletedProcess
    out: dict

    @property
    def rc(self) -> int:
        return self.proc.returncode

    @property
    def last(self) -> dict:
        return (self.out.get("steps") or [{}])[-1]

    @property
    def verdict(self) -> str:
        return self.last.get("verdict", "")

    def why(self) -> str:
        return f"exit {self.proc.returncode}\n--- stdout\n{self.proc.stdout[-4000:]}\n--- stderr\n{self.proc.stderr[-4000:]}"


def freeze(prefix: Path) -> list[str]:
    """`pip freeze --all` of the env, the way a user compares two envs."""
    proc = subprocess.run([str(prefix / "bin" / "python"), "-m", "pip", "freeze", "--all",
                           "--disable-pip-version-check"], capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in os.environ.items() if not k.startswith("PIP_")} | {
                              "PIP_CONFIG_FILE": os.devnull})
    assert proc.returncode == 0, proc.stderr
    return sorted(proc.stdout.splitlines())


def env_vars(prefix: Path) -> dict[str, str]:
    """The variables a shell that activates the env gets from envport's env block."""
    proc = subprocess.run(["bash", "-c", '. "$1/.envport/env.sh" && env -0', "x", str(prefix)],
                          capture_output=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    pairs = (item.split(b"=", 1) for item in proc.stdout.split(b"\0") if b"=" in item)
    return {k.decode(): v.decode() for k, v in pairs if k not in (b"PWD", b"SHLVL", b"_", b"PATH")}

"""What `python3.X -m venv` needs on a Debian/Ubuntu system: the interpreter and its `python3.X-venv`.

Debian splits `venv`'s ensurepip out of the interpreter package, so `python3.11 -m venv` on a plain
`debian:bookworm` or `ubuntu:22.04` (or a host without the package) fails at build time with "ensurepip
is not available".  An import adds the packages to system_pkgs; a build refuses early, naming them.
The `python:` images (python.org builds in /usr/local) carry venv whole, and images of unknown make are
not judged: only the official Debian, Ubuntu and nvidia/cuda (Ubuntu-based) names.
"""

from __future__ import annotations

import re
from typing import Optional

DEBIAN_LIKE = re.compile(r"^(?:docker\.io/)?(?:library/)?(?:debian|ubuntu)(?:[:@]|$)|^(?:docker\.io/)?nvidia/cuda:")
# Debian/Ubuntu releases -> their python3: `python3-venv` is that version's venv package.
DISTRO_PYTHON = {"bookworm": "3.11", "debian:12": "3.11", "bullseye": "3.9", "debian:11": "3.9", "trixie": "3.13",
                 "ubuntu24.04": "3.12", "ubuntu:24.04": "3.12", "noble": "3.12", "ubuntu22.04": "3.10",
                 "ubuntu:22.04": "3.10", "jammy": "3.10", "ubuntu20.04": "3.8", "ubuntu:20.04": "3.8", "focal": "3.8"}


def distro_python(base: str) -> Optional[str]:
    return next((v for k, v in DISTRO_PYTHON.items() if k in base), None)


def venv_packages(base: str, python: str, system_pkgs: list[str]) -> list[str]:
    """The Debian packages BASE lacks, of those `python{PYTHON} -m venv` needs, that SYSTEM_PKGS does not
    install; [] for a base this cannot judge."""
    if not DEBIAN_LIKE.match(base or "") or not re.match(r"^3\.\d{1,2}$", python or ""):
        return []
    have = {p.split("=", 1)[0] for p in system_pkgs}
    own = distro_python(base) == python
    need = []
    if f"python{python}" not in have and not (own and have & {"python3", "python3-venv", "python3-full"}):
        need.append(f"python{python}")
    if f"python{python}-venv" not in have and not (own and have & {"python3-venv", "python3-full"}):
        need.append(f"python{python}-venv")
    return need


def host_venv_missing(python: str) -> str:
    """Why `python{PYTHON} -m venv` would fail on this machine ("" when it would not): run before a venv build,
    so the refusal names the package instead of ensurepip's traceback minutes in."""
    from envport.core.proc import run

    ran = run([f"python{python}", "-c", "import ensurepip, venv"], timeout=30)
    if ran.returncode is None or ran.ok:
        return ""  # not on PATH is preflight's own finding; a probe that did not answer is not a verdict
    return (f"python{python} has no venv/ensurepip (`python{python} -c 'import ensurepip, venv'` failed), so "
            f"`python{python} -m venv` cannot make the env: the package python{python}-venv is missing")

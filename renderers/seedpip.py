"""ensurepip's own wheels, for a venv that uv seeds instead of `python -m venv`'s pip.

`python -m venv` runs ensurepip, which starts pip to install the pip (and, before
3.12, setuptools) wheels that Python ships: seconds of a cold build.  A site that
installs with uv makes the venv `--without-pip` and has uv install the same wheels
instead, so the env holds the same distributions either way.  This script runs
with the new venv's python (stdlib only), copies those wheels into DIR and prints
one `name==version` per line for uv; it exits 1 when this Python keeps them in a
way it does not know, and the recipe falls back to ensurepip itself.

    python -I seedpip.py DIR
"""

import shutil
import sys
from importlib import resources
from pathlib import Path

import ensurepip


def wheels():
    """Context managers that give each wheel's path, as ensurepip itself finds them."""
    if hasattr(ensurepip, "_get_packages"):  # 3.10-3.12: bundled, or the distribution's WHEEL_PKG_DIR
        return [resources.as_file(Path(p.wheel_path) if p.wheel_path else
                                  resources.files("ensurepip") / "_bundled" / p.wheel_name)
                for p in ensurepip._get_packages().values()]
    if hasattr(ensurepip, "_get_pip_whl_path_ctx"):  # 3.13+: pip only
        return [ensurepip._get_pip_whl_path_ctx()]
    return []


def main(dest: str) -> int:
    found = wheels()
    for ctx in found:
        with ctx as wheel:
            shutil.copy(wheel, dest)
            name, version = Path(wheel).name.split("-")[:2]
            print(f"{name}=={version}")
    return 0 if found else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

#!/usr/bin/env bash
# The quickstart from README.md: install envport, check the committed
# renderings, build demo-cpu as a venv on this host (no daemon needed), and
# prove it with its witnesses.  Safe to re-run: a built env reports `present`.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m pip install --quiet --disable-pip-version-check -e .
envport validate --all
envport render --all --check
envport build demo-cpu --target venv
if envport --help | grep -q ' witness '; then
    envport witness demo-cpu --target venv
fi

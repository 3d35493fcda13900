#!/usr/bin/env bash
# The quickstart from README.md: install envport into .venv, check the
# committed renderings, build demo-cpu as a venv on this host (no daemon
# needed) and prove it with its witnesses.  Safe to re-run: a built env
# reports `present`.
set -euo pipefail
cd "$(dirname "$0")/.."

# The build extra: verify and up need pytest and testinfra, import dockerfile-parse, docker the SDK;
# just (PyPI's rust-just) runs the Justfile. A .venv from an older quickstart without them is completed.
if [ ! -x .venv/bin/envport ] || [ ! -x .venv/bin/just ] || ! .venv/bin/python -c 'import testinfra, docker' 2>/dev/null; then
    echo "== installing envport with its build extra, and just (rust-just), into .venv"
    [ -x .venv/bin/python ] || python3 -m venv .venv
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[build]' 'rust-just>=1.30'
fi
export PATH="$PWD/.venv/bin:$PATH"
echo "== validating specs and checking images/ against them"
envport validate --all
envport render --all --check
echo "== building demo-cpu as a venv in ${ENVPORT_ENVS_DIR:-$HOME/.envport/envs} (the first build installs a CPU torch)"
envport build demo-cpu --target venv
echo "== fetching demo-cpu's pinned weight with the spec's own source command, then verifying it"
envport weights fetch demo-cpu
if envport --help | grep -q '^    witness'; then
    echo "== running demo-cpu's witnesses inside the venv"
    envport witness demo-cpu --target venv
fi

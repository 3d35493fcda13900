#!/usr/bin/env bash
# The Debian base image for the tests: the same code path a user runs
# (`envport base debian-bookworm`); present in ~0.02 s when the tag exists.
set -euo pipefail
tag=${1:-envport/debian-bookworm:base}
if command -v envport >/dev/null 2>&1; then
    exec envport base debian-bookworm --tag "$tag"
fi
# Before the project is installed (e.g. a fixture on a bare checkout).
exec bash "$(dirname "$0")/../../src/envport/data/debian-base-image.sh" "$tag"

# envport tasks. `just --list` shows them; every recipe is a thin wrapper over
# the `envport` CLI, so `envport COMMAND --help` explains the options.
set positional-arguments

# Every recipe runs this checkout's envport (scripts/envport.sh): .venv/bin/envport, which
# scripts/demo.sh installs, else python3's when it imports this checkout's src/; otherwise the recipe
# is refused in one line. `just which` prints the one it runs.
envport := "bash scripts/envport.sh"

default:
    @just --list

# The envport every recipe runs.
which:
    @{{envport}} --which

# Set up envport and build the demo env as a venv (no daemon needed), then check it.
demo:
    bash scripts/demo.sh

# Install envport with test and build extras into the current Python.
setup:
    python3 -m pip install -e '.[test]'

# Render every spec to images/ (Dockerfile, .def, setup scripts).
render *args:
    @{{envport}} render --all "$@"

# Lint the tree with ruff (rules in pyproject.toml's [tool.ruff]; .ci/run runs the same check).
lint:
    ruff check .

# Fail if images/ or docs/spec.schema.json drifted from the specs.
check:
    @{{envport}} validate --all
    @{{envport}} render --all --check
    @{{envport}} schema --check

# Write docs/spec.schema.json.
schema:
    @{{envport}} schema

# Build an env: `just build demo-cpu --target docker`; `--target apptainer` makes <name>-<hash12>.sif
# with apptainer where installed, else envport's own .def builder (docs/apptainer.md); the card's
# `just build proteomics-gpu --target apptainer` is refused here in one line (its CUDA base is not local).
build name *args:
    @{{envport}} build "$@"

# Preflight, build, weights, verify, witness in one command: `just up demo-cpu venv` (or docker, apptainer).
up name target *args:
    #!/usr/bin/env bash
    set -euo pipefail
    {{envport}} up "$1" --target "$2" "${@:3}"

# Read a .sif without apptainer: what it holds and whether it matches its spec (`just inspect X.sif`).
inspect file *args:
    @{{envport}} inspect "$@"

# Verify a built env with the spec's testinfra assertions.
verify name *args:
    @{{envport}} verify "$@"

# Run an env's witnesses inside it.
witness name *args:
    @{{envport}} witness "$@"

# Local Debian base image for offline builds and the tests.
base-image:
    @{{envport}} base debian-bookworm

# Download an env's wheels for --no-index builds.
wheelhouse name *args:
    @{{envport}} wheelhouse "$@"

# Inventory this host's GPUs and software stack.
doctor *args:
    @{{envport}} doctor "$@"

# The full CI: install, start dockerd/slurm/sshd, run every test.
ci:
    bash .ci/run

# Just the tests (services must already be up: `bash .ci/services/all.sh`).
test *args:
    python3 -m pytest "$@"

# Witnesses as a Slurm job: `just slurm demo-cpu --cluster local --target venv [--check collectives] [--dry-run]`
slurm name *args:
    @{{envport}} slurm submit "$@"

# Build on every target this host can run (docker, venv, venv over SSH) and diff them.
parity name *args:
    @{{envport}} parity "$@"

# Every spec x target: `just matrix` lists what each pair needs and whether this host can run it;
# `just matrix --run --jobs 2` runs `envport up` for each runnable pair (reports/matrix.xml, reports/matrix-summary.md).
matrix *args:
    @{{envport}} matrix "$@"

# A venv on the SSH site host `test`: build, verify (testinfra ssh://), witnesses.
ssh-build name *args:
    @{{envport}} build "$@" --target venv --host test

ssh-verify name *args:
    @{{envport}} verify "$@" --target venv --host test

ssh-witness name *args:
    @{{envport}} witness "$@" --target venv --host test

# Regenerate docs/cli.md's command and target tables from the parser and the target registry
# (tests/test_cli_docs.py fails when they drift).
docs:
    @PYTHONPATH=src python3 -c 'from pathlib import Path; from envport.cli import build_parser; from envport.commands.clidoc import write; write(Path("docs/cli.md"), build_parser())'

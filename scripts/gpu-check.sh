#!/usr/bin/env bash
# The GPU path's first real run, as one prepared script.
#
#   bash scripts/gpu-check.sh prepare   # here, with PyPI: envport's wheel + what the GPU host's python lacks -> .whl/
#   bash scripts/gpu-check.sh run       # on the GPU host, in the repo root, .whl/ carried along
#
# `run` installs envport from the carried wheels into the host's python3 (which
# already has torch; nothing is fetched there), then runs `envport doctor
# --json`, the kernel witness, and the collectives and DTensor witnesses: on
# NCCL at the largest world the GPUs allow, at the spec's full world on gloo,
# the rest SKIPPED with its reason.  Everything it printed goes to
# docs/infra-gpu.md (and to $OUT/infra-gpu.md when $OUT is set, so it comes
# back from a lent device machine).  Exit status: the witness run's (0 ok,
# 1 failed, 5 no accelerator).
#
# On this project's lent device machine (/work/.library/device/README.md): run
# `prepare` here, then one device call with carry [".whl"], command
# `bash scripts/gpu-check.sh run` and timeout_s 360 (about 2 minutes of work
# on 16 cores; the rest leaves room for one rerun within the 15-minute lease),
# then copy the returned infra-gpu.md to docs/.
#
# The lent machine's python3 is 3.12 with torch 2.11.0+cu130 and has PyYAML,
# Jinja2 and packaging but not pydantic (/work/.library/device/KINDS.md), so
# prepare fetches pydantic and its own needs as cp312 manylinux wheels.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WHL="$ROOT/.whl"
PY_TAG="${PY_TAG:-3.12}"  # the GPU host's python
# pydantic and what it needs that the GPU host's image lacks; the versions this checkout is tested with.
# EXTRA_DEPS (space-separated pins) adds more, e.g. to try `run` on a host whose python lacks PyYAML.
read -ra EXTRA <<<"${EXTRA_DEPS:-}"
DEPS=(pydantic==2.13.4 pydantic-core==2.46.4 annotated-types==0.7.0 typing-inspection==0.4.2 "${EXTRA[@]}")
# The spec's worlds: collectives at 2 and a 2x2 mesh, so a one-GPU host shows NCCL at world 1,
# the full worlds on gloo and the SKIPPED lines; a 4-GPU host runs them all on NCCL.
WORLD=2
MESH="[2, 2]"
DEADLINE=180  # per witness script; NCCL's own timeouts fire at half of it

prepare() {
    mkdir -p "$WHL"
    grep -qx '/.whl/' "$ROOT/.git/info/exclude" 2>/dev/null || echo '/.whl/' >>"$ROOT/.git/info/exclude"
    rm -f "$WHL"/*.whl
    # Build from a copy: a wheel built in the checkout leaves build/ and egg-info behind.
    local src
    src="$(mktemp -d)"
    trap 'rm -rf "$src"' RETURN
    (cd "$ROOT" && git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf -) | tar -xf - -C "$src"
    python3 -m pip wheel -q --no-deps -w "$WHL" "$src"
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PY_TAG" --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$WHL" "${DEPS[@]}"
    ls -l "$WHL"
}

run_on_gpu_host() {
    local py="${PYTHON:-python3}" site="${ENVPORT_SITE_DIR:-/tmp/envport-site}"
    local doc="$ROOT/docs/infra-gpu.md" log work
    work="$(mktemp -d)"
    log="$work/log.txt"
    if [[ "${SKIP_INSTALL:-0}" != 1 ]]; then
        "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$WHL"/*.whl
        export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    fi
    export PYTHONUNBUFFERED=1
    local pyver
    pyver="$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
    mkdir -p "$work/project/specs"
    cat >"$work/project/specs/gpu-check.yaml" <<EOF
name: gpu-check
description: the GPU path's first real run (scripts/gpu-check.sh)
base: nvidia/cuda:13.0.0-runtime-ubuntu24.04
python: "$pyver"
witnesses:
  imports: [torch]
  kernel: true
  collectives: {world_size: $WORLD}
  dtensor: {mesh: $MESH}
resources: {cpus: 4, mem_gib: 16, gpus: 1}
EOF
    local status=0
    {
        echo "## uname, nvidia-smi"
        echo
        echo '```'
        uname -a
        nvidia-smi 2>&1 || echo "(nvidia-smi: exit $?)"
        nvidia-smi topo -m 2>&1 || true
        "$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "arch", torch.cuda.get_arch_list(), "available", torch.cuda.is_available(), "devices", torch.cuda.device_count())' 2>&1
        echo '```'
        echo
        echo "## envport doctor --json --python $py"
        echo
        echo '```json'
        "$py" -m envport -C "$work/project" doctor --json --python "$(command -v "$py")" 2>&1 || echo "(doctor: exit $?)"
        echo '```'
        echo
        echo "## envport doctor (text)"
        echo
        echo '```'
        "$py" -m envport -C "$work/project" doctor --python "$(command -v "$py")" 2>&1 || true
        echo '```'
        echo
        echo "## envport witness gpu-check --target venv (kernel, collectives, dtensor: NCCL and gloo)"
        echo
        echo '```'
        "$py" -m envport -C "$work/project" witness gpu-check --target venv --python "$(command -v "$py")" \
            --no-ledger --deadline "$DEADLINE" 2>&1 || status=$?
        echo "(witness: exit $status)"
        echo '```'
    } 2>&1 | tee "$log"
    status="$(sed -n 's/^(witness: exit \([0-9]*\))$/\1/p' "$log" | tail -n 1)"
    {
        echo "# GPU run"
        echo
        echo "What \`bash scripts/gpu-check.sh run\` printed on $(hostname) on $(date -u +%Y-%m-%d)" \
             "(envport $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')). Regenerate it by running the"
        echo "script again on a GPU host; do not edit by hand."
        echo
        cat "$log"
    } >"$doc"
    if [[ -n "${OUT:-}" ]]; then cp "$doc" "$OUT/infra-gpu.md"; fi
    echo "wrote $doc (witness exit ${status:-?})"
    rm -rf "$work"
    return "${status:-1}"
}

case "${1:-}" in
    prepare) prepare ;;
    run) run_on_gpu_host ;;
    *) echo "usage: bash scripts/gpu-check.sh prepare|run" >&2; exit 2 ;;
esac

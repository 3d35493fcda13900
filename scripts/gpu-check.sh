#!/usr/bin/env bash
# The GPU path's first real run, as one prepared script that brings back a record whatever happens.
#
#   bash scripts/gpu-check.sh prepare   # here, with PyPI: envport's wheel and every dependency -> .whl/
#   bash scripts/gpu-check.sh run       # on the GPU host, in the root of the copied tree, .whl/ carried along
#   bash scripts/gpu-check.sh spec N    # the spec `run` writes for N usable GPUs
#
# The GPU host is a machine with NVIDIA GPUs and a python that has torch (a
# CUDA build) preinstalled, but no network and no docker: the project tree is
# copied over (without .git) with .whl/ beside it, and one command runs there
# under a time limit.  `run` installs envport from the carried wheels into a
# scratch folder first on PYTHONPATH (nothing is fetched, the host's python is
# not changed), then records: the host (uname, nvidia-smi, topology), a raw
# `import torch`, `envport doctor --json` (probed once; its text is rendered
# from the same JSON), and the kernel, collectives and DTensor witnesses, one
# `envport witness --only ... --json` each: on NCCL at the largest world the
# GPUs allow, at the full world on gloo, the rest SKIPPED with its reason.
# JAX and Triton are recorded where the host's python has them, never assumed:
# the doctor section says what each sees (JAX's backend and cards, Triton's
# version, its ptxas targets and its tl.sum compile probe, run as a child from
# a file), and the spec's `kernel: true` makes the kernel part run every
# framework found: torch's pass, JAX's jit-compiled pass (GPU against CPU) and
# the Triton probe, each its own row in witness-kernel.json.
#
# The record: $OUT/infra-gpu.md (OUT: the folder whatever runs this hands back;
# a scratch folder when unset), copied to docs/infra-gpu.md at the end.  Its
# header is written first and each section is appended as it begins and ends,
# so a kill at the time limit still returns every section up to the one it
# stopped in; an EXIT trap closes the record (`## end`: how it stopped, each
# section's exit status) and ends every process this run started, witness
# ranks in their own sessions included.  A record without `## end` was cut off
# by SIGKILL: it stopped in the last section begun.  Each probe and envport
# call runs under `timeout`, so one hang costs one section, not the record.
# The doctor report and each witness result are also files of their own in
# $OUT (stderr apart), validated against docs/doctor.schema.json and
# docs/witness.schema.json.
#
# Time: the whole run is budgeted to BUDGET_S (240 s); each section gets at
# most its own limit and never more than what is left of the budget.  Call it
# with a 300 s limit on the command (timeout_s=300): the 60 s over the budget
# cover the start and the trap, and a 300 s try leaves room for a rerun on a
# fresh machine when the GPU host is had for about 15 minutes in all.
#
# Exit status: the first witness part's that is not 0 (1 failed, 5 no
# accelerator), 1 when envport did not install or import, else 0.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WHL="${WHL_DIR:-$ROOT/.whl}"
PY_TAG="${PY_TAG:-3.12}"  # the GPU host's python
# Besides envport's own dependencies, carried for the record's schema checks.
EXTRA_REQS=(jsonschema)
# EXTRA_DEPS (space-separated requirements) adds more, e.g. a package the host's python lacks.
read -ra EXTRA <<<"${EXTRA_DEPS:-}"
BUDGET_S="${BUDGET_S:-240}"
DEADLINE="${DEADLINE:-75}"  # per witness script (dist.py's group deadline; NCCL's own timeouts fire at half of it)
WITNESS_CAP_S="${WITNESS_CAP_S:-150}"  # per witness part (census, its scripts, their launch margins)
MARK=ENVPORT_GPU_CHECK_RUN  # every process a run starts carries it, so the trap can find them

prepare() {
    set -e
    mkdir -p "$WHL"
    if [[ $WHL == "$ROOT/.whl" && -d "$ROOT/.git" ]] && ! grep -qx '/.whl/' "$ROOT/.git/info/exclude" 2>/dev/null; then
        echo '/.whl/' >>"$ROOT/.git/info/exclude"
    fi
    rm -f "$WHL"/*.whl "$WHL/SOURCE" "$WHL/constraints.txt"
    # Build from a copy: a wheel built in the checkout leaves build/ and egg-info behind.
    local src
    src="$(mktemp -d)"
    (cd "$ROOT" && git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf -) | tar -xf - -C "$src"
    python3 -m pip wheel -q --no-deps -w "$WHL" "$src"
    rm -rf "$src" || true  # a leftover scratch copy is no reason to fail
    # Every dependency, pure-Python ones included (the host's own may be too old: pydantic-core needs a
    # newer typing_extensions than 4.12), pinned to the versions this checkout's python has installed,
    # i.e. the ones its tests ran with, and resolved for the GPU host's python.
    python3 -m pip list --format=freeze --exclude-editable 2>/dev/null | grep -iv '^envport=' >"$WHL/constraints.txt"
    python3 -m pip download -q --only-binary=:all: --python-version "$PY_TAG" --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -c "$WHL/constraints.txt" -d "$WHL" "$WHL"/envport-*.whl "${EXTRA_REQS[@]}" "${EXTRA[@]}"
    # The copy on the GPU host has no .git: the commit travels with the wheels.
    local commit dirty
    commit="$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)"
    dirty="$(git -C "$ROOT" status --porcelain --untracked-files=no 2>/dev/null | wc -l)"
    echo "commit $commit dirty $([[ $dirty -gt 0 ]] && echo "yes ($dirty tracked files changed)" || echo no)" \
        "prepared $(date -u +%Y-%m-%dT%H:%M:%SZ) for python $PY_TAG" >"$WHL/SOURCE"
    cat "$WHL/SOURCE"
    ls -l "$WHL"
}

# --- run: the record ----------------------------------------------------------------------

now() { echo $((SECONDS - T0)); }
say() { printf '%s\n' "$@" >>"$RECORD"; }

# begin TITLE LIMIT: the section's header goes out before its work, so a kill leaves it as the last one begun.
begin() {
    CURRENT="$1"
    say "" "## $1" "" "(begun at +$(now) s, limit $2 s)" "" '```'
}

# end_section STATUS: close the open section with how it ended.
end_section() {
    local why=""
    [[ $1 == 124 ]] && why=" (timed out)"
    say '```' "" "($CURRENT: exit $1$why, at +$(now) s)"
    STATUSES+=("$CURRENT: $1$why")
    CURRENT=""
}

# limit CAP: seconds a section may take, CAP or what is left of the budget (0: nothing left).
limit() {
    local left=$((BUDGET_S - $(now)))
    ((left < 0)) && left=0
    echo $((left < $1 ? left : $1))
}

# probe LIMIT STDOUT STDERR CMD...: run CMD under timeout in the background and wait for it, so a
# TERM to this script runs the trap at once instead of after CMD.  Sets RC.
probe() {
    local lim="$1" out="$2" err="$3"
    shift 3
    if ((lim < 1)); then
        echo "(not run: the ${BUDGET_S} s budget is spent)" >>"$out"
        RC=124
        return
    fi
    timeout -k 5 "$lim" "$@" >>"$out" 2>>"$err" </dev/null &
    CHILD=$!
    wait "$CHILD"
    RC=$?
    CHILD=""
    if ((RC == 124 || RC == 137)); then
        # timeout signals CMD's process group; witness ranks in their own sessions outlive it.
        end_marked "$RUN_ID"
        ((ENDED)) && say "(timed out; ended $ENDED process(es) it left running)"
    fi
    return 0
}

# section TITLE CAP CMD...: one whole section whose output goes into the record.
section() {
    local title="$1" lim
    lim="$(limit "$2")"
    shift 2
    begin "$title" "$lim"
    probe "$lim" "$RECORD" "$RECORD" "$@"
    end_section "$RC"
}

# marked VALUE: PIDS = the processes other than this shell whose environment has MARK=VALUE (any value
# but this run's when VALUE is empty).  Builtins only: a helper process would find itself.
marked() {
    local env pid vars var
    PIDS=()
    for env in /proc/[0-9]*/environ; do
        pid="${env#/proc/}"
        pid="${pid%/environ}"
        [[ $pid == "$$" ]] && continue
        mapfile -d '' -t vars 2>/dev/null <"$env" || continue
        for var in "${vars[@]}"; do
            [[ $var == "$MARK="* ]] || continue
            if [[ -n $1 && $var == "$MARK=$1" ]] || [[ -z $1 && $var != "$MARK=$RUN_ID" ]]; then
                PIDS+=("$pid")
            fi
            break
        done
    done
}

# end_marked VALUE: TERM, then KILL, every marked process; ENDED = how many there were.
end_marked() {
    marked "$1"
    ENDED=${#PIDS[@]}
    ((ENDED)) || return 0
    kill -TERM "${PIDS[@]}" 2>/dev/null
    sleep 2
    marked "$1"
    ((${#PIDS[@]})) && kill -KILL "${PIDS[@]}" 2>/dev/null
    return 0
}

finish() {
    local rc=$?
    trap - EXIT TERM INT HUP
    [[ -n $CHILD ]] && kill -TERM "$CHILD" 2>/dev/null
    [[ -n $CURRENT ]] && end_section "${STOPPED:+stopped by }${STOPPED:-$rc}"
    end_marked "$RUN_ID"
    say "" "## end" ""
    if [[ -n $STOPPED ]]; then
        say "stopped by $STOPPED in section \"${STOPPED_IN:-?}\" at +$(now) s of the ${BUDGET_S} s budget"
    else
        say "ran to the end in $(now) s of the ${BUDGET_S} s budget"
    fi
    say "processes of this run still running at exit, ended: $ENDED" "" "sections (exit status):" ""
    for s in "${STATUSES[@]}"; do say "- $s"; done
    say "" "exit status: ${EXIT_STATUS:-$rc}"
    if [[ -d $ROOT/docs ]]; then cp "$RECORD" "$ROOT/docs/infra-gpu.md" 2>/dev/null; fi
    echo "gpu-check: record $RECORD; $(now) s of ${BUDGET_S} s; exit ${EXIT_STATUS:-$rc}" >&2
    rm -rf "$WORK"
    exit "${EXIT_STATUS:-$rc}"
}

on_signal() {
    STOPPED="$1"
    STOPPED_IN="${CURRENT:-between sections}"
    EXIT_STATUS="$2"
    exit "$2"
}

# spec_for N: the spec sized to the N GPUs torch can use: collectives at world max(2, N), DTensor on
# the largest square mesh N holds (at least 2x2, so the gloo run is 2-D too).  PYVER: the host's python.
spec_for() {
    local n="$1" side=2 world
    while (((side + 1) * (side + 1) <= n)); do side=$((side + 1)); done
    world=$((n > 2 ? n : 2))
    cat <<EOF
# $n GPU(s) torch can use -> collectives at world $world, DTensor mesh ${side}x${side}
name: gpu-check
description: the GPU path's first real run (scripts/gpu-check.sh)
base: nvidia/cuda:13.0.0-runtime-ubuntu24.04
python: "${PYVER:-3.12}"
witnesses:
  imports: [torch]
  kernel: true
  collectives: {world_size: $world}
  dtensor: {mesh: [$side, $side]}
resources: {cpus: 4, mem_gib: 16, gpus: 1}
EOF
}

run_on_gpu_host() {
    T0=$SECONDS
    STATUSES=()
    CURRENT="" CHILD="" STOPPED="" STOPPED_IN="" EXIT_STATUS=""
    RUN_ID="$$.$(date +%s%N)"
    export "$MARK=$RUN_ID"
    WORK="$(mktemp -d)"
    mkdir -p "${OUT:=$WORK/out}"
    RECORD="$OUT/infra-gpu.md"
    trap finish EXIT
    trap 'on_signal SIGTERM 143' TERM
    trap 'on_signal SIGINT 130' INT
    trap 'on_signal SIGHUP 129' HUP

    local py site source
    py="$(command -v "${PYTHON:-python3}" || echo "${PYTHON:-python3}")"
    site="$WORK/site"
    source="$(cat "$WHL/SOURCE" 2>/dev/null || echo "no $WHL/SOURCE: not made by \`prepare\`")"
    : >"$RECORD"
    say "# GPU run" "" \
        "What \`bash scripts/gpu-check.sh run\` recorded on $(hostname) on $(date -u +%Y-%m-%dT%H:%M:%SZ)." \
        "Source: ${source}. Regenerate it by running the script again on a GPU host; do not edit by hand." "" \
        "Budget: ${BUDGET_S} s for the whole script (call it with a 300 s limit); each section names its limit." \
        "Witness deadline: ${DEADLINE} s per script. Python: $py." \
        "A record that ends without \`## end\` was cut off (SIGKILL): it stopped in the last section begun."

    end_marked ""
    ((ENDED)) && say "" "(ended $ENDED process(es) a killed earlier run left behind)"

    local installed=0
    begin "install" "$(limit 60)"
    say "the carried wheels into a scratch folder first on PYTHONPATH"
    if ! compgen -G "$WHL/*.whl" >/dev/null; then
        say "no wheels in $WHL: run \`bash scripts/gpu-check.sh prepare\` where PyPI is reachable and carry .whl/"
        RC=1
    elif "$py" -m pip --version >/dev/null 2>&1; then
        probe "$(limit 60)" "$RECORD" "$RECORD" "$py" -m pip install -q --no-index --no-deps --no-compile \
            --disable-pip-version-check --no-cache-dir --target "$site" "$WHL"/*.whl
    else
        # No pip in the host's python: a wheel is a zip of the files to install.
        say "(no pip: unpacking the wheels)"
        RC=0
        for w in "$WHL"/*.whl; do
            probe "$(limit 30)" "$RECORD" "$RECORD" "$py" -m zipfile -e "$w" "$site"
            [[ $RC == 0 ]] || break
        done
    fi
    end_section "$RC"
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
    if [[ $RC == 0 ]]; then
        section "import check" 30 \
            "$py" "$ROOT/scripts/gpu_check_record.py" versions "$WHL" "$site"
        [[ $RC == 0 ]] && installed=1
    fi

    section "host: uname" 10 uname -a
    section "host: nvidia-smi" 20 nvidia-smi
    section "host: topology" 20 nvidia-smi topo -m
    section "torch" 60 "$py" -c 'import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "arch", torch.cuda.get_arch_list())
print("available", torch.cuda.is_available(), "devices", torch.cuda.device_count())'
    PYVER="$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || echo 3.12)"

    if ((installed == 0)); then
        EXIT_STATUS=1
        say "" "envport did not install or import (above): doctor and witnesses not run"
        return 1
    fi
    local envport=("$py" -m envport -C "$WORK/project")
    mkdir -p "$WORK/project"
    local lim
    lim="$(limit 90)"
    begin "doctor --json" "$lim"
    say "envport doctor --json, probed once: \$OUT/doctor.json (stderr: doctor.stderr.txt)"
    probe "$lim" "$OUT/doctor.json" "$OUT/doctor.stderr.txt" "${envport[@]}" doctor --json --python "$py"
    say "(doctor: exit $RC)"
    probe "$(limit 20)" "$RECORD" "$RECORD" "$py" "$ROOT/scripts/gpu_check_record.py" doctor "$OUT/doctor.json" \
        "$ROOT/docs/doctor.schema.json"
    end_section "$RC"
    section "doctor text" 20 \
        "${envport[@]}" doctor --from-json "$OUT/doctor.json"

    local n
    n="$("$py" -c 'import json, sys; print(json.load(open(sys.argv[1]))["testable"]["max_gpu_world_size"])' \
        "$OUT/doctor.json" 2>/dev/null)" || n=""
    if [[ -z $n ]]; then  # no doctor answer: what nvidia-smi lists, unconfirmed by torch
        n="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')" || n=0
    fi
    mkdir -p "$WORK/project/specs"
    spec_for "$n" >"$WORK/project/specs/gpu-check.yaml"
    say "" "spec: $(head -n 1 "$WORK/project/specs/gpu-check.yaml" | cut -c3-)"

    local part only worst=0
    for part in kernel collectives dtensor basic; do
        only=("--only" "$part")
        [[ $part == basic ]] && only=(--only python --only imports)
        lim="$(limit "$WITNESS_CAP_S")"
        begin "witness $part" "$lim"
        say "envport witness ${only[*]} --json: \$OUT/witness-$part.json (stderr: witness-$part.stderr.txt)"
        probe "$lim" "$OUT/witness-$part.json" "$OUT/witness-$part.stderr.txt" \
            "${envport[@]}" witness gpu-check --target venv --python "$py" --no-ledger --deadline "$DEADLINE" \
            --json "${only[@]}"
        local wrc=$RC
        say "(witness: exit $wrc)"
        probe "$(limit 20)" "$RECORD" "$RECORD" "$py" "$ROOT/scripts/gpu_check_record.py" witness \
            "$OUT/witness-$part.json" "$ROOT/docs/witness.schema.json"
        [[ $RC != 0 ]] && tail -n 20 "$OUT/witness-$part.stderr.txt" >>"$RECORD" 2>/dev/null
        end_section "$wrc"
        ((worst == 0 && wrc != 0)) && worst=$wrc
    done
    EXIT_STATUS=$worst
}

case "${1:-}" in
    prepare) prepare ;;
    run) run_on_gpu_host ;;
    spec) spec_for "${2:?usage: bash scripts/gpu-check.sh spec N (GPUs)}" ;;
    *) echo "usage: bash scripts/gpu-check.sh prepare|run|spec N" >&2; exit 2 ;;
esac

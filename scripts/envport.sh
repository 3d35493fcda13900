#!/usr/bin/env bash
# The envport the Justfile runs: this checkout's, never whichever envport is first on PATH (another
# venv, a pyenv shim), which would silently run other code. This checkout's .venv (scripts/demo.sh
# makes it), else python3 when the envport it imports is this checkout's src/; anything else is
# refused in one line. `scripts/envport.sh --which` prints the command it runs.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd -P)"
run=()
if [ -x "$root/.venv/bin/envport" ]; then
    run=("$root/.venv/bin/envport")
else
    where=""
    py="$(command -v python3 || true)"
    if [ -n "$py" ]; then
        where="$("$py" -c 'import envport, os; print(os.path.realpath(envport.__file__))' 2>/dev/null || true)"
    fi
    if [[ "$where" == "$root/src/envport/"* ]]; then
        run=("$py" -m envport)
    else
        other=""
        if [ -n "$where" ]; then other=" (python3 imports another envport: $where)"; fi
        echo "envport: this checkout ($root) has no envport installed${other}; run: bash scripts/demo.sh" >&2
        exit 2
    fi
fi
if [ "${1:-}" = "--which" ]; then
    echo "${run[*]}"
    exit 0
fi
exec "${run[@]}" "$@"

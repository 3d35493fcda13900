"""`envport build NAME --target T` on a present env, answered before anything else loads.

A no-op docker build has to be well ahead of BuildKit's own fully cached
build (~0.09 s here), a no-op SIF build under 0.1 s, and the interpreter
alone takes ~0.035 s to start, so this path imports only os, the built-in
blake2b and the C json scanner (builders/present_cache.py, core/cjson.py), then
`_socket` (builders/docker/present.py, engines/docker_socket.py); a SIF is
taken only while its stat is what this machine's build recorded
(sif/record.py: one stat, no read of the file). Which targets have such an
answer, and how they give it, is theirs (targets/fast.py). No argparse, no json
module (but for `--json` output), no pathlib, no other command module, not
even the verdict module (its line and its `--json` shape are written here;
tests/test_fast_argv.py holds them equal to what core/verdict prints).
Anything it does not recognise, or any doubt about the env, returns None and
the full path decides.
"""

from __future__ import annotations

import os
import sys

from envport.targets.fast import ANSWERS


def fast_argv(argv: list[str]) -> int | None:
    """`[-C ROOT] build NAME --target T [--site S] [--json]` for a T with a fast answer, else None."""
    root = None
    if argv[:1] in (["-C"], ["--root"]) and len(argv) > 2:
        root, argv = argv[1], argv[2:]
    if argv[:1] != ["build"] or len(argv) < 2 or argv[1].startswith("-"):
        return None
    opts: dict[str, str | None] = {"--target": None, "--site": None}
    as_json, rest = False, argv[2:]
    while rest:
        if rest[0] in opts and len(rest) > 1 and not rest[1].startswith("-"):
            opts[rest[0]], rest = rest[1], rest[2:]
        elif rest[0] == "--json":
            as_json, rest = True, rest[1:]
        else:
            return None
    if opts["--target"] not in ANSWERS:
        return None
    return answer(argv[1], opts["--target"], opts["--site"], root, as_json)


def answer(spec: str, target: str, site: str | None, root: str | None, as_json: bool) -> int | None:
    """Print `present` and return 0 when the env is certainly present; None otherwise."""
    if spec.endswith((".yaml", ".yml")) or "/" in spec:
        return None
    base = os.path.abspath(root) if root else os.getcwd()
    if not os.path.isfile(os.path.join(base, "specs", f"{spec}.yaml")):
        return None  # not at the project root: the full path finds it
    hit = ANSWERS[target](base, spec, site)
    if hit is None:
        return None
    hash_, step, detail, data = hit
    if as_json:
        import json

        # core.verdict's `--json` shape (envelope of one StepResult.to_dict()), without importing it.
        result = {"step": step, "verdict": "present", "detail": detail, "reason": "", "lines": [], "seconds": 0.0,
                  "data": data}
        json.dump({"command": "build", "exit_code": 0, "steps": [result], "problems": []}, sys.stdout, indent=2,
                  ensure_ascii=False)
        sys.stdout.write("\n")
        return 0
    sys.stdout.write(f"{'present':<8} {step}: {detail}\npresent {spec}@{hash_[:12]} --target {target}\n")
    return 0


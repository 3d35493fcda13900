"""`envport build NAME --target docker` on a present image, answered before anything else loads.

A no-op build has to be well ahead of BuildKit's own fully cached build
(~0.12 s here), and the interpreter alone takes ~0.035 s to start, so this
path imports only json, hashlib and socket (build/docker/present.py and
engines/docker_socket.py): no argparse, no other command module, not even
the verdict module (its line and its `--json` shape are written here;
tests/test_fast_argv.py holds them equal to what core/verdict prints).
Anything it does not recognise, or any doubt about the image, returns None
and the full path decides.
"""

from __future__ import annotations

import os
import sys


def fast_argv(argv: list[str]) -> int | None:
    """`[-C ROOT] build NAME --target docker [--site S] [--json]`, else None."""
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
    if opts["--target"] != "docker":
        return None
    return answer(argv[1], opts["--site"], root, as_json)


def answer(spec: str, site: str | None, root: str | None, as_json: bool) -> int | None:
    """Print `present` and return 0 when the image is certainly present; None otherwise."""
    if spec.endswith((".yaml", ".yml")):
        return None
    base = os.path.abspath(root) if root else os.getcwd()
    if not os.path.isfile(os.path.join(base, "specs", f"{spec}.yaml")):
        return None  # not at the project root: the full path finds it
    from pathlib import Path

    from envport.build.docker.present import present

    hit = present(Path(base), spec, site)
    if hit is None:
        return None
    step, detail = f"image {hit['tag']}", f"{hit['id'][:19]} ({hit['size'] / 1e9:.2f} GB)"
    if as_json:
        import json

        # core.verdict's `--json` shape (envelope of one StepResult.to_dict()), without importing it.
        result = {"step": step, "verdict": "present", "detail": detail, "reason": "", "lines": [], "seconds": 0.0,
                  "data": {"image": hit["tag"], "image_id": hit["id"], "size": hit["size"]}}
        json.dump({"command": "build", "exit_code": 0, "steps": [result], "problems": []}, sys.stdout, indent=2,
                  ensure_ascii=False)
        sys.stdout.write("\n")
        return 0
    sys.stdout.write(f"{'present':<8} {step}: {detail}\npresent {spec}@{hit['hash'][:12]} --target docker\n")
    return 0

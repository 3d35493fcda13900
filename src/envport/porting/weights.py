"""Weights a recipe downloaded during its build, made real `weight_dirs` entries where that is safe.

The shell reader suggests one entry per download (porting/shell/weights.py `suggest_weights`): its `path` is
where the recipe put the files, its `source` the recipe's own command. `envport weights fetch` runs a
`source` on the host with `ENVPORT_WEIGHT_DIR` set to the weight's folder, so the recipe's absolute
folder (`-P /opt/esm/checkpoints`) would write outside it, as root on a CI host. An entry is written
for real only when every mention of that folder can be replaced by `$ENVPORT_WEIGHT_DIR` and the command
names no other absolute path but scratch space (`/tmp`): a script copied into the image
(`bash /opt/tool/download.sh`) does not exist where `fetch` runs, so that one stays a commented
suggestion for a person to decide.
"""

from __future__ import annotations

import re

from envport.porting.report import Draft, turned_into

WEIGHT_DIR = "$ENVPORT_WEIGHT_DIR"
SCRATCH = ("/tmp/", "/var/tmp/", "/dev/null")


def pointed_at_weight_dir(source: str, path: str) -> str | None:
    """SOURCE with PATH (the recipe's folder for the weights) as $ENVPORT_WEIGHT_DIR; None when it cannot
    be: PATH is not named in it, or another absolute path outside scratch space is."""
    if not path.startswith("/") or path == "/":
        return None
    folder = re.compile(r"(?<![\w./-])" + re.escape(path.rstrip("/")) + r"(?=/|[\s'\";&|)]|$)")
    spots = [m.start() for m in folder.finditer(source)]
    if not spots or any(source[:i].endswith("'") for i in spots):
        return None  # not named, or inside single quotes, where the variable would not expand
    # Inside double quotes the variable expands as it is; elsewhere it is quoted so a space cannot split it.
    rewritten = folder.sub(lambda m: WEIGHT_DIR if source[:m.start()].endswith('"') else f'"{WEIGHT_DIR}"',
                           source)
    local = re.sub(r"[a-z][a-z0-9+.-]*://\S+", "", rewritten)  # a URL's path is the server's, not a folder here
    local = re.sub(r'"?\$ENVPORT_WEIGHT_DIR"?(/[\w./-]*)?', "", local)  # the weight folder and files in it
    others = [w for w in re.findall(r"(?<![\w.$-])/[\w./-]+", local) if not w.startswith(SCRATCH)]
    return None if others else rewritten


def promote_weights(draft: Draft) -> None:
    """Move each suggested weight whose source can be pointed at its weight folder into weight_dirs."""
    kept = []
    for name, entry in draft.suggested_weights:
        source = pointed_at_weight_dir(entry.get("source", ""), entry.get("path", ""))
        if source is None:
            kept.append((name, entry))
            continue
        while name in draft.weight_dirs:
            name += "-2"
        draft.weight_dirs[name] = {**entry, "source": source}
        draft.note(None, f"weight_dirs.{name}", turned_into("weight_dirs"),
                   f"the build's download into {entry['path']}, fetched at run time instead (never baked): its "
                   f"`source` writes to {WEIGHT_DIR}, the folder `envport weights fetch` gives it",
                   "pin its files (`files:` with size and sha256): `envport weights fetch` runs the `source` "
                   "when pinned files are absent")
    draft.suggested_weights = kept

"""Each target's answer for the no-op build's fast path (commands/fast.py), with the standard library only.

`envport build NAME --target T` on a present env must answer before argparse, pydantic or a target module
loads (a no-op docker build well under BuildKit's own cached one), so the targets that have such an answer
keep it here, importable alone: `ANSWERS[name](root, spec, site)` is `(hash, step, detail, data)` when the
env is certainly present, else None (the full path decides). A target without an entry takes the full path;
tests/test_fast_argv.py holds each entry to its target's own `present`.
"""

from __future__ import annotations

import os


def docker(root: str, spec: str, site: str | None) -> tuple[str, str, str, dict] | None:
    """The remembered image, while the engine says its tag still carries the hash (builders/docker/present.py)."""
    from envport.builders.docker.present import present

    hit = present(root, spec, site)
    if hit is None:
        return None
    data = {"image": hit["tag"], "image_id": hit["id"], "size": hit["size"]}
    return hit["hash"], f"image {hit['tag']}", f"{hit['id'][:19]} ({hit['size'] / 1e9:.2f} GB)", data


def apptainer(root: str, spec: str, site: str | None) -> tuple[str, str, str, dict] | None:
    """Only the SIF this machine's build wrote, untouched since (its recorded stat): never a label."""
    from envport.builders import present_cache

    hit = present_cache.checked(root, spec, site, "apptainer", _recorded_sif)
    if hit is None:
        return None
    from envport.core.progress import human_size  # sys and typing only: the path stays fast

    sif, size = hit["sif"], hit["size"]
    data = {"sif": sif, "size": size, "route": "present", "checked": "build record"}
    return hit["hash"], f"sif {os.path.basename(sif)}", f"{sif} ({human_size(size)})", data  # as the builder words it


def _recorded_sif(hash_: str, sif: str) -> dict | None:
    from envport.sif import record as sif_record

    if not sif_record.unchanged(sif, hash_):
        return None
    return {"hash": hash_, "sif": sif, "size": os.stat(sif).st_size}


ANSWERS = {"docker": docker, "apptainer": apptainer}

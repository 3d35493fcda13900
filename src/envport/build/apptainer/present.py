"""A fast `present` for `envport build --target apptainer`, without pydantic or engines/sif.py's imports.

The SIF path and hash the last good build of these exact inputs ended with
come from build/present_cache.py (commands/build.py remembers them); then
the SIF itself is read: its header, its descriptor table and its
`inspect-metadata.json` (engines/sif_header.py, a few kilobytes, nothing of
the partition), the same checks and the same label as builder.present.  Any
doubt (another input, a file missing, truncated, foreign or relabelled)
falls through to the full path, which decides for real and says why.
"""

from __future__ import annotations

from envport.build import present_cache

TARGET = "apptainer"


def present(root, name: str, site_name: str | None) -> dict | None:
    """{'hash', 'sif', 'size'} when the remembered SIF is whole and its labels carry its hash, else None."""
    return present_cache.checked(root, name, site_name, TARGET, _in_file)


def _in_file(hash_: str, sif: str) -> dict | None:
    from envport.core.cjson import loads
    from envport.engines.sif_header import generic_json

    found = generic_json(sif, "inspect-metadata.json")
    if found is None:
        return None
    try:
        label = loads(found[0])["data"]["attributes"]["labels"]["envport.hash"]
    except (ValueError, KeyError, TypeError):
        return None
    return {"hash": hash_, "sif": sif, "size": found[1]} if label == hash_ else None

"""What the targets share for `envport gc`: finding their old builds by envport's own marks, and sizing them.

A thing is envport's only when it carries the marks envport's build leaves, not because of its name: an
image tagged `envport/<name>:<hash12>` whose `envport.name` and `envport.hash` labels say that env and hash;
a SIF named `<name>-<hash12>.sif` in the site's sif_dir, owned by this user, whose build record or labels
say that hash; a venv build under the envs dir holding `.envport/hash`.  Anything else named like one is
listed as foreign and never touched.
"""

from __future__ import annotations

import re
from typing import Callable

from envport.targets.base import Artefact

HASH12 = re.compile(r"[0-9a-f]{12}")


def image_artefacts(target: str, name: str, images: list[dict], rm_hint: str) -> list[Artefact]:
    """The `envport/NAME:<hash12>` tags of IMAGES (engines' repo_images shape), one artefact each."""
    repo = f"envport/{name}"
    out = []
    for img in images:
        tags = img["tags"]
        for tag in sorted(tags):
            r, _, hash12 = tag.rpartition(":")
            if r != repo or not HASH12.fullmatch(hash12):
                continue
            labels = img["labels"]
            foreign = ""
            if labels.get("envport.name") != name or not str(labels.get("envport.hash", "")).startswith(hash12):
                foreign = (f"its labels say envport.name={labels.get('envport.name', '(none)')}, envport.hash="
                           f"{str(labels.get('envport.hash', '(none)'))[:12]}: no envport build of {name}@{hash12}")
            busy = ""
            if img["containers"]:
                names = " ".join(img["containers"])
                busy = f"container(s) {names} use it (`{rm_hint} {names}` lets gc remove it)"
            # `latest` follows the newest build; on this image it goes with it, never onto another one.
            drop = [tag] + ([f"{repo}:latest"] if f"{repo}:latest" in tags else [])
            out.append(Artefact(target, name, hash12, tag, img["bytes"], img["created"],
                                handle={"id": img["id"], "tags": drop}, foreign=foreign, busy=busy))
    return out


def remove_image(art: Artefact, untag: Callable[[str], str], tags_now: Callable[[str], list | None]) -> str:
    """Untag ART's tags (its hash tag, `latest` where it is on the same image); '' when the image is gone."""
    for tag in art.handle["tags"]:
        why = untag(tag)
        if why:
            return f"{tag} stays: {why}"
    left = tags_now(art.handle["id"])
    if left:
        return f"untagged {art.where}, but the image stays tagged {', '.join(sorted(left))} (not envport's to remove)"
    return ""

"""`envport base debian-bookworm`: a local base image from Debian, no registry needed."""

from __future__ import annotations

from envport.builders.base_image import RECIPES, build_base
from envport.core.progress import stderr_progress
from envport.core.verdict import report


def register(sub) -> None:
    p = sub.add_parser("base", help="build a local base image with debootstrap + docker import",
                       description="Build a base image from Debian with debootstrap and `docker import` "
                       "(for offline sites and the tests). `present` when the tag exists; the rootfs "
                       "tarball is cached under $ENVPORT_CACHE (default /var/cache/envport).")
    p.add_argument("recipe", choices=sorted(RECIPES), help="which base")
    p.add_argument("--tag", default=None, help="image tag (default envport/debian-<suite>:base)")
    p.add_argument("--rebuild", action="store_true", help="debootstrap again even when present")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args) -> int:
    return report([build_base(args.recipe, stderr_progress, args.tag, args.rebuild)], args.json, command="base")

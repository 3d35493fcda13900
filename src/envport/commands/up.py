"""`envport up NAME --target T`: preflight -> build -> weights -> verify -> witness (in progress)."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("up", help="preflight, build, weights, verify, witness in one command")
    p.add_argument("spec", metavar="NAME|PATH")
    p.set_defaults(func=lambda args: 2)

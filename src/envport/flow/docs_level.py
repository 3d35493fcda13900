"""The docs level's inputs for one run: which docs, and which of them passed already on this very env.

A doc is re-run after the env is rebuilt (its hash changes) or the doc is edited (its sha256 changes),
and skipped in one line otherwise (seed 004: the expensive pass is for the moments doc and env drift
apart); `rerun` runs it anyway.  The ledger is this machine's (report/ledger.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

from envport.witness.doc_sources import Doc, docs_for


def docs_to_check(loaded, root: Path, *, target: str, hash_: str, paths: Optional[Sequence[str]] = None,
                  rerun: bool = False, ssh_host: Optional[str] = None, ledger_dir: Optional[str] = None) -> list[Doc]:
    """The docs to check (`paths` replace the spec's), each marked `passed_on` where the ledger says this
    env (TARGET, HASH_, SSH_HOST) passed those same bytes."""
    from envport.report import ledger

    docs = docs_for(loaded, paths)
    if rerun or not any(d.sha256 for d in docs):
        return docs
    passes = ledger.doc_passes(ledger.read(root, loaded.spec.name, ledger_dir), target=target, hash_=hash_,
                               ssh_host=ssh_host)
    for d in docs:
        if d.sha256 in passes:
            d.passed_on = f"{passes[d.sha256]} on env {hash_[:12]}"
    return docs

"""The trust policy's verifier: a SIF's signatures against the keys a site trusts (plan/site.py `trust`).

engines/sif_run.py `admit` asks it before every mount and run, `envport pull` before it names a file;
`install` hands it down to sif_run (which cannot import this layer), and the CLI calls `install` first.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence


def judge(path: Path, key_files: Sequence[str]) -> tuple[str, str]:
    """(verdict, detail) of PATH's signatures against the PEM public keys KEY_FILES: `verified`, or the reason
    token (unsigned, untrusted_signer, bad_signature; not_a_sif for a file that does not read) and why."""
    from envport.engines.sif import SifError
    from envport.sif.keys import KeyFileError, load_public_key
    from envport.sif.verify import UNCHECKED, UNTRUSTED, check_signatures

    try:
        keys = [load_public_key(f) for f in key_files]
    except KeyFileError as exc:
        return UNTRUSTED, f"a trusted key does not load: {exc}"
    try:
        checked = check_signatures(path, keys)
    except SifError as exc:
        return exc.reason, exc.message
    verdict = UNTRUSTED if checked.verdict == UNCHECKED else checked.verdict
    return verdict, "; ".join(checked.problems) or "verified"


def install() -> None:
    """Make `judge` the verifier of engines/sif_run.py's trust gate."""
    from envport.engines import sif_run

    sif_run.install_verifier(judge)

"""The docs a witness run checks: the spec's `witnesses.docs` (files under specs/, as shim sources are)
or the files `--docs` names, each read once with its sha256 (the ledger's key, with the env's hash)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from envport.core.verdict import Verdict


@dataclass
class Doc:
    label: str  # how verdicts name it: the spec's own spelling (specs/files/demo-cpu/USAGE.md as `files/...`) or the path given
    path: Path
    text: str = ""
    sha256: str = ""
    problem: str = ""  # why it cannot be checked (not found, not UTF-8, no project)
    problem_verdict: Verdict = Verdict.FAILED
    passed_on: str = ""  # when this env and these bytes last passed (the ledger), so it is not run again

    @property
    def step(self) -> str:
        return f"docs {self.label}"


def read_doc(label: str, path: Path) -> Doc:
    doc = Doc(label, path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        doc.problem = f"{path} does not exist (fix: write it, or drop it from witnesses.docs)"
        return doc
    except OSError as exc:
        doc.problem = f"{path}: {exc.strerror or exc}"
        return doc
    try:
        doc.text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        doc.problem = f"{path}: not UTF-8 text (byte {exc.start}); a doc is markdown"
        return doc
    doc.sha256 = hashlib.sha256(data).hexdigest()
    return doc


def spec_docs(loaded) -> list[Doc]:
    """The spec's named docs, read from specs/; a SIF's embedded spec names them but carries no bytes."""
    names = list(loaded.spec.witnesses.docs)
    if getattr(loaded, "embedded_in", None) is not None:
        return [Doc(n, Path(n), problem=f"the spec comes from {loaded.embedded_in}, which names this doc but does "
                    "not carry it; run inside the project, or pass --docs FILE", problem_verdict=Verdict.SKIPPED)
                for n in names]
    return [read_doc(n, loaded.specs_dir / n) for n in names]


def given_docs(paths: Sequence[str]) -> list[Doc]:
    """Docs named on the command line (a doc under review), labelled as the user typed them."""
    return [read_doc(p, Path(p).expanduser()) for p in paths]


def docs_for(loaded, paths: Optional[Sequence[str]]) -> list[Doc]:
    """`--docs` files when given (they replace the spec's for this run), else the spec's own."""
    return given_docs(paths) if paths else spec_docs(loaded)

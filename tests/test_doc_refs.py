"""The docs cite only files that are in the repo: every path-looking reference in docs/*.md, README.md and
tests/README.md resolves (beside the doc, from the repo root, or in the package, src/envport/), so a reader
never looks for a notes file that lives on someone's machine (docs once cited a RECIPES.md seven times)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from .support import REPO

PACKAGE = REPO / "src" / "envport"
DOCS = sorted((REPO / "docs").glob("*.md")) + [REPO / "README.md", REPO / "tests" / "README.md"]
# Files a doc tells the reader to make: named, not cited.
MADE_BY_THE_READER = {
    ("docs/gpu.md", "docs/infra-gpu.md"): "the GPU machine's report the reader commits",
    ("docs/gpu.md", "infra-gpu.md"): "the same report, as `doctor --write-docs` names it there",
    ("docs/cli.md", "tests/images/"): "the project's own image tests, a folder its user makes",
}
# `code` spans and link targets; a word in one is a path when it starts with a folder of the repo or of the
# package (specs/x.yaml, .ci/run, engines/ssh.py), or is a Markdown file's name (RECIPES.md).
CODE = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\]\(([^)\s#]+)")
PLACEHOLDER = re.compile(r"[<>*{}$%|\[\]]|\.\.\.|\bNAME\b|\bFILE\b|\bN\b|\b[xX]\b")  # specs/<name>.yaml, sites/x.yaml


def _roots() -> set[str]:
    # reports/ is what runs write (CI's junit, matrix's reports; ignored, never committed): a doc naming
    # reports/junit.xml names an output, and whether the folder exists yet depends on which test ran first.
    names = {p.name for p in REPO.iterdir()
             if not p.name.startswith((".git", ".venv", ".cache", ".pytest", "reports"))}
    return names | {p.name for p in PACKAGE.iterdir() if p.is_dir() and not p.name.startswith("_")}


def references(text: str, roots: set[str]) -> list[str]:
    """The path-looking words in TEXT's code spans and link targets, in order, each once."""
    words = [m.group(1) for m in LINK.finditer(text) if "://" not in m.group(1) and not m.group(1).startswith("mailto:")]
    words += [w for m in CODE.finditer(text) for w in m.group(1).split()]
    found = []
    for word in words:
        word = word.strip(",.;:()\"'")
        if not word or "://" in word or PLACEHOLDER.search(word) or word.startswith(("/", "~", "-", "$")):
            continue
        first = word.split("/", 1)[0]
        if ("/" in word and first in roots) or re.fullmatch(r"[\w.-]+\.md", word):
            if word not in found:
                found.append(word)
    return found


def resolves(word: str, doc: Path) -> bool:
    return any((base / word).exists() for base in (doc.parent, REPO, PACKAGE))


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_file_a_doc_cites_is_in_the_repo(doc):
    rel = doc.relative_to(REPO).as_posix()
    missing = [w for w in references(doc.read_text(encoding="utf-8"), _roots())
               if not resolves(w, doc) and (rel, w) not in MADE_BY_THE_READER]
    assert not missing, f"{rel} cites files that are not in the repo: {missing}; cite one that is, or say it " \
                        "in the doc's own words"


def test_the_check_finds_a_cited_file_and_skips_what_is_not_one():
    text = ("see `RECIPES.md` and [notes](docs/nowhere.md); `specs/demo-cpu.yaml`, `engines/ssh.py`;\n"
            "not `/etc/ssl/certs`, `bin/activate`, `specs/<name>.yaml`, [site](https://example.org/a.md)")
    assert references(text, _roots()) == ["docs/nowhere.md", "RECIPES.md", "specs/demo-cpu.yaml", "engines/ssh.py"]
    assert not resolves("RECIPES.md", REPO / "docs" / "cli.md") and resolves("engines/ssh.py", REPO / "README.md")


def test_the_allowance_names_docs_that_exist():
    for rel, _ in MADE_BY_THE_READER:
        assert (REPO / rel).is_file(), rel


# Markdown names in the code that are not citations of this repo's files.
NOT_CITATIONS = {"RELEASE.md": "pytorch's release notes, named with the project (witness/arch.py)",
                 "reports/matrix-summary.md": "what `matrix` writes (commands/matrix.py)",
                 "matrix-summary.md": "the same file, by its name"}


def test_the_code_cites_only_markdown_files_in_the_repo():
    # Docstrings and comments are docs too: a module once pointed its reader at RECIPES.md and SIF-TRUST.md.
    # renderers/ is left out: its source bytes enter every env's hash (renderer_version), so its two such
    # comments change with the next renderer change, not alone.
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for word in re.findall(r"(?<![\w/.-])((?:[\w-]+/)*[\w-]+\.md)\b", line):
                if PLACEHOLDER.search(word) or word in NOT_CITATIONS:
                    continue
                if not any((base / word).exists() for base in (path.parent, REPO, REPO / "docs")):
                    missing.append(f"{path.relative_to(REPO)}:{n}: {word}")
    assert not missing, "cited but not in the repo:\n" + "\n".join(missing)

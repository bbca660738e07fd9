"""Paths the documentation names exist in the repository.

A doc that points to a file that has moved (``tests/data/zoo/...`` for a module
in ``tests/e2e/zoo/``) sends a reader nowhere. Checked: every relative Markdown
link, and every backticked token that reads as a repository path (it has a
``/`` and starts with a top-level entry of the repository, or ``..``; or it is
a ``.py`` file under a subpackage of ``flextrain``, ``master/ledger.py``).
Placeholders and globs (``<job>``, ``*``, ``{...}``) are not paths.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = sorted([*REPO.glob("docs/*.md"), REPO / "README.md", *REPO.glob("*/README.md")])

# Paths in other projects, named as such in the text.
ELSEWHERE = {
    ("docs/accelerate.md", "examples/auto_accelerate/train.py"),  # ATorch's example the module adapts
}

_TICKED = re.compile(r"`([^`\s]+)`")
_LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)\s]*)?\)")
_NOT_A_PATH = re.compile(r"[<>*{}$~?=|]|^[a-z]+://")


def _ticked_paths(line: str, top: set[str], package: set[str]):
    """``(token, where it must be)`` for each backticked repository path of ``line``."""
    for match in _TICKED.finditer(line):
        token = match.group(1).rstrip(".,;").split(":")[0]  # model_zoo/x.py:Model names the file
        if "/" not in token or _NOT_A_PATH.search(token) or token.startswith("/"):
            continue
        first = token.split("/")[0]
        if first in top or first == "..":
            yield token, token
        elif first in package and token.endswith(".py"):  # `master/ledger.py`: a module of the package
            yield token, f"flextrain/{token}"


def _missing(text: str, rel: str) -> list[str]:
    """The paths named in ``text``, the doc at ``rel`` in the repository, that do not exist."""
    top = {p.name for p in REPO.iterdir() if not p.name.startswith(".")}
    package = {p.name for p in (REPO / "flextrain").iterdir() if p.is_dir() and not p.name.startswith("_")}
    here = (REPO / rel).parent
    missing = []
    for n, line in enumerate(text.splitlines(), 1):
        for target in _LINK.findall(line):
            if not _NOT_A_PATH.search(target) and not (here / target).exists():
                missing.append(f"{rel}:{n}: link {target}")
        for token, path in _ticked_paths(line, top, package):
            where = here / path if path.startswith("../") else REPO / path
            if not where.exists() and (rel, token) not in ELSEWHERE:
                missing.append(f"{rel}:{n}: `{token}`")
    return missing


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_path_a_doc_names_exists(doc):
    assert _missing(doc.read_text(encoding="utf-8"), doc.relative_to(REPO).as_posix()) == []


def test_the_check_finds_a_moved_file_and_a_dead_link():
    text = (REPO / "docs" / "data.md").read_text(encoding="utf-8")
    assert "`tests/e2e/zoo/converted_digits.py`" in text
    stale = text.replace("tests/e2e/zoo/converted_digits.py", "tests/data/zoo/converted_digits.py")
    found = _missing(stale + "\nsee [nowhere](nowhere.md), `flextrain/<x>/a.py`, `model_zoo/x.py:Model`, "
                             "`master/gone.py` and `data/digits.db`\n", "docs/data.md")
    assert [m.split(": ", 1)[1] for m in found] == ["`tests/data/zoo/converted_digits.py`", "link nowhere.md",
                                                     "`model_zoo/x.py`", "`master/gone.py`"], found

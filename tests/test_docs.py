"""The docs point at things that exist: every relative link in README.md and docs/ resolves,
every ``dt.`` name and ``disttensor`` import they show is real, and no doc, docstring or
comment cites a file that is not in the repository."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

import disttensor as dt

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SOURCES = [
    p
    for d in ("disttensor", "tests", "bench", "demos", "docs")
    for p in sorted((ROOT / d).rglob("*"))
    if p.suffix in (".py", ".md")
] + [ROOT / "README.md", ROOT / "pyproject.toml"]

LINK = re.compile(r"\]\(([^)\s]+)\)")
DT_NAME = re.compile(r"(?<![\w.])dt\.([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)")
IMPORT = re.compile(r"^\s*(?:>>> )?from (disttensor(?:\.\w+)*) import ([\w, ]+)", re.M)
FILE = re.compile(r"(?<![\w/.-])((?:\.\./)*(?:[\w-]+/)*[\w-]+\.(?:md|py|toml|ipynb))\b")
# file names that stand for the user's own files in examples, or files a test writes itself
EXAMPLE_FILES = {"script.py", "train.py", "crash.py", "rank1.py"}
# every file in the repository by name: a tree listing (docs/architecture.md) names them bare
IN_REPO = {
    p.name for d in ("disttensor", "tests", "bench", "demos", "docs") for p in (ROOT / d).rglob("*")
}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_relative_links_resolve(doc: Path) -> None:
    broken = []
    for target in LINK.findall(doc.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue  # a web address or an anchor in the same page
        if not (doc.parent / target.split("#")[0]).exists():
            broken.append(target)
    assert not broken, f"{doc.name} links to missing files: {broken}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_dt_names_exist(doc: Path) -> None:
    missing = []
    for name in sorted(set(DT_NAME.findall(doc.read_text()))):
        obj = dt
        for part in name.split("."):
            if not hasattr(obj, part):
                missing.append(f"dt.{name}")
                break
            obj = getattr(obj, part)
    assert not missing, f"{doc.name} shows names disttensor does not have: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_imports_shown_exist(doc: Path) -> None:
    missing = []
    for module, names in IMPORT.findall(doc.read_text()):
        mod = importlib.import_module(module)
        missing += [
            f"{module}.{n}" for n in re.split(r"[,\s]+", names) if n and not hasattr(mod, n)
        ]
    assert not missing, f"{doc.name} imports names that do not exist: {missing}"


def test_no_file_cites_a_missing_file() -> None:
    """A path in the README, docs/, a docstring or a comment must be a file of the repository
    (relative to the root, the package, the citing file's folder or one above it, or a bare
    name from a tree listing)."""
    missing = []
    for source in SOURCES:
        for token in set(FILE.findall(source.read_text())):
            name = Path(token).name
            if name in EXAMPLE_FILES or ("/" not in token and name in IN_REPO):
                continue
            here = [ROOT / token, ROOT / "disttensor" / token]
            here += [
                d / token
                for d in (source.parent, *source.parent.parents)
                if ROOT in (d, *d.parents)
            ]
            if not any(p.resolve().is_file() for p in here):
                missing.append(f"{source.relative_to(ROOT)}: {token}")
    assert not missing, "files cited that are not in the repository:\n" + "\n".join(missing)

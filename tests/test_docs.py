"""Documentation stays inside the repository, and every section citation names a heading that exists.

Rules (checked over the package, its tests, experiments, benchmarks, the README and docs/):

* nothing refers to files a user of the package does not have: the old specification and architecture notes,
  the paper folder beside the repository, or any path that climbs out of it;
* ``docs/<file>.md`` names a file of docs/, and ``docs/<file>.md §N.M`` a heading of that file numbered N.M;
* a bare ``§N.M`` is either a paper citation (right after a paper key: ``[W] §4.2``) or a section of the docs
  file cited last on the same line (``docs/theory.md §1.1, §1.3``), else of docs/theory.md (inside a docs file:
  of that file). Ranges ``§3.4-3.5`` need both ends. A ``§`` without a number is an error;
* no tracked ``.py`` or ``.md`` file points at a numbered tracker issue (the word followed by its number): the
  text says what it refers to, and the tracker's numbers stay in the git history.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
DEFAULT_DOC = "theory.md"
SCANNED_DIRECTORIES = ("dpaudit", "attacks", "accountants", "tests", "experiments", "benchmarks")
SCANNED_FILES = ("README.md", "Makefile", "pyproject.toml")
TEXT_SUFFIXES = {".py", ".md", ".toml", ".txt", ".csv", ".cfg", ".ini"}
SKIPPED_DIRECTORIES = {"__pycache__", "runs", "out", ".pytest_cache"}

# Written so that this file does not match its own patterns.
_OUTSIDE_NAMES = [r"\bSPEC\b", r"\bARCHITECTURE\.md", r"(?<![\w.-])shared(?=/)"]
OUTSIDE_REFERENCES_IN_DOCS = re.compile("|".join(_OUTSIDE_NAMES))
OUTSIDE_REFERENCES = re.compile("|".join([*_OUTSIDE_NAMES, re.escape("..") + "(?=/)"]))
DOC_NAME = re.compile(r"docs/([\w-]+\.md)")
SECTION = re.compile(r"§\s?(\d+(?:\.\d+)*)?(?:\s*[-–]\s*§?(\d+(?:\.\d+)*))?")
PAPER_KEY_BEFORE = re.compile(r"\[[A-Z]\]\s*$")
HEADING_NUMBER = re.compile(r"^#{1,6}\s+(\d+(?:\.\d+)*)\.?\s", re.MULTILINE)
MARKDOWN_LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
# The word, an optional plural, then a number (``#12``, `` 12``, ``-12``). Spelt in two parts so that this file
# does not match it.
_ISSUE_WORD = "iss" + "ue"
ISSUE_REFERENCE = re.compile(rf"\b{_ISSUE_WORD}s?(?:\s?#?|-)\d", re.IGNORECASE)


def _scanned_files() -> list[Path]:
    files = [ROOT / name for name in SCANNED_FILES if (ROOT / name).is_file()]
    for directory in SCANNED_DIRECTORIES:
        for path in sorted((ROOT / directory).rglob("*")):
            skipped = SKIPPED_DIRECTORIES.intersection(path.relative_to(ROOT).parts)
            # This file holds bad citations on purpose: the examples that show the checks can fail.
            if path.is_file() and path.suffix in TEXT_SUFFIXES and not skipped and path != Path(__file__).resolve():
                files.append(path)
    return files


def _tracked_sources() -> list[Path]:
    """Every tracked ``.py`` and ``.md`` file (git's index; without git, the scanned files of those suffixes)."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--", "*.py", "*.md"], cwd=ROOT, capture_output=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return [path for path in [*_scanned_files(), Path(__file__).resolve()] if path.suffix in {".py", ".md"}]
    return [ROOT / name for name in listed.decode().split("\0") if name and (ROOT / name).is_file()]


def _doc_files() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def section_numbers(text: str) -> set[str]:
    """The numbers of a markdown file's numbered headings: ``## 2. Bounds`` → "2", ``### 2.10 …`` → "2.10"."""
    return set(HEADING_NUMBER.findall(text))


def _doc_sections() -> dict[str, set[str]]:
    return {path.name: section_numbers(path.read_text(encoding="utf-8")) for path in _doc_files()}


def citation_errors(line: str, sections: dict[str, set[str]], default_doc: str = DEFAULT_DOC) -> list[str]:
    """What is wrong with the docs names and § citations of one line (rules of the module docstring)."""
    errors = []
    mentions = [(match.end(), match.group(1)) for match in DOC_NAME.finditer(line)]
    for _, name in mentions:
        if name not in sections:
            errors.append(f"docs/{name} does not exist")
    for match in SECTION.finditer(line):
        if PAPER_KEY_BEFORE.search(line[: match.start()]):
            continue
        cited = [doc for end, doc in mentions if end <= match.start()]
        target = cited[-1] if cited else default_doc
        numbers = [number for number in match.groups() if number is not None]
        if not numbers:
            errors.append(f"'{match.group(0).strip()}' has no section number")
        for number in numbers:
            if target in sections and number not in sections[target]:
                errors.append(f"§{number} is not a numbered heading of docs/{target}")
    return errors


def issue_references(line: str) -> list[str]:
    """The numbered tracker-issue references of one line."""
    return [match.group(0) for match in ISSUE_REFERENCE.finditer(line)]


def outside_references(line: str, in_docs: bool = False) -> list[str]:
    """The references of one line to files outside the repository (docs/ may link to the top-level README)."""
    pattern = OUTSIDE_REFERENCES_IN_DOCS if in_docs else OUTSIDE_REFERENCES
    return [match.group(0) for match in pattern.finditer(line)]


def _lines(path: Path):
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        yield f"{path.relative_to(ROOT)}:{number}", line


def test_theory_keeps_the_specification_numbering():
    required = {"0", "1", "2", "3", "4"} | {f"1.{k}" for k in range(1, 8)} | {"2.1", "3.1"}
    assert required <= _doc_sections()["theory.md"]


def test_nothing_refers_outside_the_repository():
    found = [
        f"{where}: {hit!r}"
        for path in _scanned_files()
        for where, line in _lines(path)
        for hit in outside_references(line)
    ]
    found += [
        f"{where}: {hit!r}"
        for path in _doc_files()
        for where, line in _lines(path)
        for hit in outside_references(line, in_docs=True)
    ]
    assert found == []


def test_no_numbered_issue_references():
    sources = _tracked_sources()
    assert Path(__file__).resolve() in sources and ROOT / "README.md" in sources
    found = [f"{where}: {hit!r}" for path in sources for where, line in _lines(path) for hit in issue_references(line)]
    assert found == []


@pytest.mark.parametrize(
    "line, hits",
    [
        ("guarantees (" + _ISSUE_WORD + " 14, docs/run-directory.md)", 1),
        (_ISSUE_WORD.capitalize() + " 15: the factor pair", 1),
        ("see " + _ISSUE_WORD + "s 13 and 14, " + _ISSUE_WORD + "#7, " + _ISSUE_WORD + "-3", 3),
        ("fewer than the " + _ISSUE_WORD + "'s 1000; tissue 5 is not one", 0),
    ],
)
def test_issue_reference_check_flags_numbered_issues(line, hits):
    assert len(issue_references(line)) == hits


def test_docs_links_resolve_inside_the_repository():
    broken = []
    for path in _doc_files():
        for where, line in _lines(path):
            for target in MARKDOWN_LINK.findall(line):
                if re.match(r"[a-z]+:", target):
                    continue
                resolved = (path.parent / target).resolve()
                if not resolved.exists() or not resolved.is_relative_to(ROOT):
                    broken.append(f"{where}: {target}")
    assert broken == []


def test_every_section_citation_resolves():
    sections = _doc_sections()
    errors = [
        f"{where}: {error}"
        for path in _scanned_files()
        for where, line in _lines(path)
        for error in citation_errors(line, sections)
    ]
    errors += [
        f"{where}: {error}"
        for path in _doc_files()
        for where, line in _lines(path)
        for error in citation_errors(line, sections, default_doc=path.name)
    ]
    assert errors == []


@pytest.mark.parametrize(
    "line, expected",
    [
        ("see docs/theory.md §1.6 and docs/architecture.md §4", 0),
        ("docs/theory.md §1.1, §1.3, §2.3-2.7", 0),
        ("[W] §4.2 of the paper", 0),
        ("registry column: §1.2, [W] Sec. 2", 0),
        ("see docs/theory.md §9.9", 1),
        ("docs/theory.md §1.1, §1.8", 1),
        ("docs/theory.md §3.4-3.99", 1),
        ("a bare §42", 1),
        ("docs/nowhere.md §1", 1),
        ("docs/theory.md §N.M", 1),
    ],
)
def test_citation_check_flags_bad_citations(line, expected):
    sections = {"theory.md": {"0", "1", "1.1", "1.2", "1.3", "1.6", "2", "2.3", "2.7", "3.4"}, "architecture.md": {"4"}}
    assert len(citation_errors(line, sections)) == expected


@pytest.mark.parametrize(
    "line, hits",
    [
        ("(" + "SP" + "EC" + " §2)", 1),
        ("see " + "ARCHITECTURE" + ".md", 1),
        ("in `" + "shared" + "/papers/`", 1),
        ("`" + ".." + "/" + "shared" + "/x`", 2),
        ("shared with M1/M2; specification", 0),
    ],
)
def test_outside_reference_check_flags_outside_paths(line, hits):
    assert len(outside_references(line)) == hits

"""The repository's documentation stands alone: it links only to what the repository holds (or to
public standards), refers to no document outside it, and names what the code has.

- Every markdown link in README.md, CHANGELOG.md and docs/*.md resolves to a file in the
  repository (and an ``#anchor`` to a heading of that file), or is an http(s) URL of a public
  standard (RFCs, the A2A specification).
- No file of the repository (tracked, or new and not ignored) refers to a document that is not in
  the repository.
- docs/events.md has a section for every event type of
``cardfence.engine.core.events.KNOWN_EVENTS``,
  under its stream; docs/rules.md has one for each of R1-R17; every test the docs cite as
  ``tests/…/file.py::name`` exists.
"""

from __future__ import annotations

import ast
import re
import subprocess
from functools import cache
from pathlib import Path

import pytest

from cardfence.engine.core import content
from cardfence.engine.core import events as ev
from cardfence.store.records import NewEvent

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

# Built from parts, so that this file does not itself mention what it looks for.
OUTSIDE_REFERENCES = (
    "../" + "shared",
    "CLI" + ".md",
    "DESIGN" + ".md",
    "DESIGN" + " §",
    "STYLE" + ".md",
    "seeds" + "/",
)

# Public standards a document may link to: the RFCs and the A2A specification.
STANDARD_HOSTS = frozenset(
    {
        "www.rfc-editor.org",
        "rfc-editor.org",
        "datatracker.ietf.org",
        "a2a-protocol.org",
    }
)
STANDARD_PREFIXES = ("https://github.com/a2aproject/A2A",)

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.DOTALL)
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.MULTILINE)
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$", re.MULTILINE)
CITED_TEST = re.compile(r"`((?:tests/)?[\w/]*?(test_\w+\.py))::(\w+)`")


def markdown_documents() -> list[Path]:
    return [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted(DOCS.glob("*.md"))]


def prose(text: str) -> str:
    """The text without fenced code blocks and code spans (links there are not links)."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def links(text: str) -> list[str]:
    body = prose(text)
    return INLINE_LINK.findall(body) + REFERENCE_LINK.findall(body)


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"<[^>]+>", "", heading.replace("`", "")).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    out: set[str] = set()
    for _, title in HEADING.findall(FENCE.sub("", path.read_text(encoding="utf-8"))):
        base = slug(title)
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return frozenset(out)


def link_problem(document: Path, target: str) -> str | None:
    """Why ``target`` (a link in ``document``) does not stand alone, or None when it does."""
    if target.startswith(("http://", "https://")):
        host = target.split("/")[2].split(":")[0].lower()
        if host in STANDARD_HOSTS or target.startswith(STANDARD_PREFIXES):
            return None
        return "an external link that is not a public standard"
    if re.match(r"^[a-z][a-z0-9+.-]*:", target):
        return "not a link to a file (scheme)"
    path_part, _, anchor = target.partition("#")
    resolved = (document.parent / path_part).resolve() if path_part else document.resolve()
    if not resolved.is_relative_to(ROOT.resolve()):
        return "a file outside the repository"
    if not resolved.exists():
        return "a file that does not exist"
    if anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
        return f"no heading with the anchor #{anchor} in {resolved.relative_to(ROOT)}"
    return None


def test_every_markdown_link_resolves_inside_the_repository_or_to_a_public_standard() -> None:
    problems = []
    for document in markdown_documents():
        for target in links(document.read_text(encoding="utf-8")):
            problem = link_problem(document, target)
            if problem is not None:
                problems.append(f"{document.relative_to(ROOT)}: ({target}) is {problem}")
    assert problems == []


def test_the_link_checker_sees_links_and_refuses_what_is_outside() -> None:
    text = "See [rules](rules.md#r1-continuation-is-never-gated-by-discovery), `[no](x.md)`.\n"
    assert links(text) == ["rules.md#r1-continuation-is-never-gated-by-discovery"]
    readme = ROOT / "README.md"
    assert link_problem(DOCS / "cli.md", "rules.md#the-incidents") is None
    assert link_problem(readme, "../" + "shared/x.md") == "a file outside the repository"
    assert link_problem(readme, "docs/nothing.md") == "a file that does not exist"
    assert link_problem(readme, "docs/rules.md#nowhere") is not None
    assert link_problem(readme, "https://example.com/") is not None
    assert link_problem(readme, "https://www.rfc-editor.org/rfc/rfc8785") is None


def repository_files() -> list[Path]:
    """Tracked files, and new files git does not ignore (so a new document is checked too)."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=ROOT,
            check=True,
            capture_output=True,
            timeout=60,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"not a git checkout: {exc}")
    paths = (ROOT / name for name in listed.decode().split("\0") if name)
    return sorted({p for p in paths if p.is_file() and not p.is_symlink()})


def text_of(path: Path) -> str | None:
    """The file's text, or None for a binary file."""
    data = path.read_bytes()
    if b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def test_no_file_in_the_repository_refers_to_documents_outside_it() -> None:
    found = []
    for path in repository_files():
        text = text_of(path)
        if text is None:
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            for reference in OUTSIDE_REFERENCES:
                if reference in line:
                    found.append(f"{path.relative_to(ROOT)}:{number}: {reference!r}")
    assert found == []


def sections(text: str, level: int) -> dict[str, str]:
    """The body of each heading of ``level`` (``##`` = 2), by heading text."""
    marker = "#" * level + " "
    out: dict[str, str] = {}
    current: str | None = None
    for line in FENCE.sub("", text).splitlines():
        if line.startswith(marker):
            current = line[len(marker) :].strip()
            out[current] = ""
        elif line.startswith("#" * (level - 1) + " ") and level > 1:
            current = None
        elif current is not None:
            out[current] += line + "\n"
    return out


def test_the_event_catalogue_has_a_section_for_every_event_type_under_its_stream() -> None:
    text = (DOCS / "events.md").read_text(encoding="utf-8")
    by_stream = sections(text, 2)
    documented = {
        "agent": set(re.findall(r"^### `(\w+)`$", by_stream["Agent stream"], re.MULTILINE)),
        "task": set(re.findall(r"^### `(\w+)`$", by_stream["Task stream"], re.MULTILINE)),
    }
    assert documented == {"agent": set(ev.AGENT_EVENTS), "task": set(ev.TASK_EVENTS)}
    assert documented["agent"] | documented["task"] == set(ev.KNOWN_EVENTS)


def test_the_catalogue_states_the_schema_version_every_event_is_recorded_at() -> None:
    # docs/events.md names the types at schema version 2 (content out of line, R17) and says
    # every other is at 1, the store's default; engine/core/content.py holds the versions.
    assert NewEvent("AnyType").schema_version == 1
    row = next(
        line
        for line in (DOCS / "events.md").read_text(encoding="utf-8").splitlines()
        if line.startswith("| `schema_version` |")
    )
    at_two = set(re.findall(r"`(\w+)`", row.split("**2**")[1].split("**1**")[0]))
    assert at_two == {t for t, v in content.SCHEMA_VERSIONS.items() if v == 2}
    assert "**1** for every other type" in row


def test_the_rules_page_has_a_section_for_each_of_r1_to_r17_and_the_lifecycle() -> None:
    headings = list(sections((DOCS / "rules.md").read_text(encoding="utf-8"), 2))
    numbered = [int(m.group(1)) for h in headings if (m := re.match(r"R(\d+) ", h))]
    assert numbered == list(range(1, 18))
    assert "The lifecycle" in headings
    assert "The incidents" in headings


def test_every_rule_section_cites_a_test_that_proves_it() -> None:
    by_heading = sections((DOCS / "rules.md").read_text(encoding="utf-8"), 2)
    uncited = [
        heading
        for heading, body in by_heading.items()
        if (re.match(r"R\d+ ", heading) or heading == "The lifecycle")
        and not CITED_TEST.search(body)
    ]
    assert uncited == []


@cache
def names_defined_in(path: Path) -> frozenset[str]:
    """Names defined at the top of a test module: functions, classes, assigned names."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return frozenset(names)


def cited_tests() -> list[tuple[Path, str, str, str]]:
    """(document, cited path, file name, test name) for every ``tests/…py::name`` in the docs."""
    out = []
    for document in markdown_documents():
        for cited, file_name, name in CITED_TEST.findall(document.read_text(encoding="utf-8")):
            out.append((document, cited, file_name, name))
    return out


def test_every_test_the_docs_cite_exists() -> None:
    citations = cited_tests()
    assert len({(c, n) for _, c, _, n in citations if c.startswith("tests/")}) >= 60
    missing = []
    for document, cited, file_name, name in citations:
        if cited.startswith("tests/"):
            candidates = [ROOT / cited]
        else:  # a bare file name (docs/proofs.md's tables): any test module of that name
            candidates = sorted((ROOT / "tests").rglob(file_name))
        if not any(p.is_file() and name in names_defined_in(p) for p in candidates):
            missing.append(f"{document.relative_to(ROOT)}: {cited}::{name}")
    assert missing == []

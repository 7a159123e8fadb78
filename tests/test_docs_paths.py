"""What README.md, BENCHMARKS.md and docs/*.md name exists: every repository path (`bench/x.py`,
`docs/sql.md`, `tests/<part>/test_x.py`, a relative Markdown link), every `make <target>` (a rule in the
Makefile) and every `lightning-otel <subcommand>` (listed by `python -m lightning_otel --help`).
Placeholders (`examples/<name>/run.py`, globs, `...`) are not paths and are left out."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", REPO / "BENCHMARKS.md", *sorted((REPO / "docs").glob("*.md"))]
FOLDERS = ["core", "instrument", "gateway", "collector", "trainer", "dashboards", "cli", "testing"]
FOLDERS += ["examples", "tests", "bench", "docs", "deploy", r"\.ci"]
# A path starts at one of the repository's folders, not inside a URL or another path.
PATH = re.compile(r"(?<![\w./~:-])((?:" + "|".join(FOLDERS) + r")/[^\s`'\"()\[\]<>{}|,;:]*)")
PLACEHOLDER = ("<", "{", "*", "...", "…")
LINK = re.compile(r"\]\(([^)\s]+)\)")
MAKE = re.compile(r"(?:^|[\s;&|(])make((?:[ \t]+[a-z][\w-]*)+)")
CLI = re.compile(r"(?<![\w-])lightning-otel[ \t]+([a-z][\w-]*)")


def repository_paths(text: str) -> list[str]:
    """Repository-relative paths named in `text`, placeholders left out, trailing punctuation cut."""
    found = []
    for match in PATH.finditer(text):
        path = match.group(1)
        following = text[match.end() : match.end() + 1]
        if any(mark in path for mark in PLACEHOLDER) or (following and following in "<{*…"):
            continue
        found.append(path.rstrip("."))
    return found


def link_targets(text: str, doc: Path) -> list[Path]:
    """Files a relative Markdown link points at, resolved from the document's folder."""
    targets = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue
        targets.append((doc.parent / target.split("#")[0]).resolve())
    return targets


def code_text(text: str) -> str:
    """Fenced blocks and inline code spans: where commands are written."""
    pieces, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced or line.startswith("    "):
            pieces.append(line)
        else:
            pieces += re.findall(r"`([^`]+)`", line)
    return "\n".join(pieces)


def make_targets_named(text: str) -> list[str]:
    return [word for words in MAKE.findall(code_text(text)) for word in words.split()]


def subcommands_named(text: str) -> list[str]:
    return CLI.findall(code_text(text))


def makefile_targets() -> set[str]:
    targets = set()
    for line in (REPO / "Makefile").read_text().splitlines():
        rule = re.match(r"^([A-Za-z0-9_. -]+?)\s*:(?!=)", line)
        if rule and not line.startswith("\t"):
            targets.update(name for name in rule.group(1).split() if not name.startswith("."))
    return targets


@pytest.fixture(scope="module")
def subcommands() -> set[str]:
    shown = subprocess.run(
        [sys.executable, "-m", "lightning_otel", "--help"], capture_output=True, text=True, timeout=120
    )
    assert shown.returncode == 0, shown.stderr
    listed = re.search(r"\{([\w,-]+)\}", shown.stdout)
    assert listed, shown.stdout
    return set(listed.group(1).split(","))


def _missing_paths(doc: Path) -> list[str]:
    text = doc.read_text()
    missing = [path for path in repository_paths(text) if not (REPO / path).exists()]
    missing += [str(target) for target in link_targets(text, doc) if not target.exists()]
    return missing


@pytest.mark.parametrize("doc", DOCS, ids=lambda doc: str(doc.relative_to(REPO)))
def test_every_path_a_document_names_exists(doc):
    assert _missing_paths(doc) == []


@pytest.mark.parametrize("doc", DOCS, ids=lambda doc: str(doc.relative_to(REPO)))
def test_every_make_target_a_document_names_is_a_rule(doc):
    targets = makefile_targets()
    assert [name for name in make_targets_named(doc.read_text()) if name not in targets] == []


@pytest.mark.parametrize("doc", DOCS, ids=lambda doc: str(doc.relative_to(REPO)))
def test_every_subcommand_a_document_names_is_listed(doc, subcommands):
    assert [name for name in subcommands_named(doc.read_text()) if name not in subcommands] == []


def test_the_documents_name_enough_to_check():
    # The scanners find what the documents hold (a pattern that matched nothing would pass the above).
    everything = "\n".join(doc.read_text() for doc in DOCS)
    assert len(set(repository_paths(everything))) >= 30
    assert {"demo", "test"} <= set(make_targets_named(everything))
    assert {"collector", "sql", "train", "gateway"} <= set(subcommands_named(everything))


def test_the_scanners_tell_a_wrong_name_from_a_right_one(tmp_path):
    doc = tmp_path / "docs" / "x.md"
    doc.parent.mkdir()
    text = (
        "See `bench/micro.py`, bench/no_such_bench.py, `examples/<name>/run.py`, https://h/docs/nothing.md\n"
        "and [a link](../README.md), [another](gone.md), [out](https://example.com/a.md).\n"
        "```\nmake demo\nmake no-such-target   # comment\nlightning-otel sql x\nlightning-otel frobnicate\n```\n"
        "Prose: make sure the lightning-otel-core wheel is built; lightning-otel frobnicate outside code.\n"
    )
    doc.write_text(text)
    assert repository_paths(text) == ["bench/micro.py", "bench/no_such_bench.py"]
    assert [target.name for target in link_targets(text, doc)] == ["README.md", "gone.md"]
    assert make_targets_named(text) == ["demo", "no-such-target"]
    assert subcommands_named(text) == ["sql", "frobnicate"]
    assert "no-such-target" not in makefile_targets() and "demo" in makefile_targets()

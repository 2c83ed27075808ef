"""Every relative link in the project's Markdown resolves: the file exists, and an ``#anchor``
names a heading of the page it points to (GitHub's heading ids). And README.md and the pages under
docs/ name only code that exists: each repository path and each dotted name
(``policies.policy.matching.applicability``) in their inline code.

The pages are README.md and every ``.md`` under docs/, deploy/, policies/ and examples/ (the corpus
under tests/data/ quotes outside documents and is left out). Links inside fenced code blocks and
inline code are text, not links. External links (``https:``, ``mailto:``) are not fetched: the test
run has no network.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from tests.paths import ROOT

PAGES = sorted([ROOT / "README.md", *(page for folder in ("docs", "deploy", "policies", "examples")
                                      for page in (ROOT / folder).rglob("*.md"))])

_FENCE = re.compile(r"^(```|~~~)")
_INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
_LINK = re.compile(r"\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_DEFINITION = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def slug(heading: str) -> str:
    """GitHub's id for a heading: markup dropped, lower case, punctuation removed (letters,
    digits, ``_`` and ``-`` kept), each space a hyphen.

    >>> slug("`gpuguard gpus` — what does this workload ask for?")
    'gpuguard-gpus--what-does-this-workload-ask-for'
    """
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _prose_lines(text: str, *, code: bool = False) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks; inline code spans blanked unless
    ``code`` (a heading's id is made from its code spans too)."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, line if code else _INLINE_CODE.sub("", line)))
    return lines


def anchors(page: Path) -> set[str]:
    """The heading ids of ``page``, duplicates numbered ``-1``, ``-2``… as GitHub numbers them."""
    seen: dict[str, int] = {}
    for _, line in _prose_lines(page.read_text(encoding="utf-8"), code=True):
        match = _HEADING.match(line)
        if match:
            base = slug(match[2])
            count = seen.get(base, 0)
            seen[base] = count + 1
            if count:
                seen.setdefault(f"{base}-{count}", 1)
    return set(seen)


def links(page: Path) -> list[tuple[int, str]]:
    """(line, target) of every link and link definition in the prose of ``page``."""
    text = page.read_text(encoding="utf-8")
    found: list[tuple[int, str]] = []
    for number, line in _prose_lines(text):
        found += [(number, m[1]) for m in _LINK.finditer(line)]
        definition = _DEFINITION.match(line)
        if definition:
            found.append((number, definition[1]))
    return found


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    """One line per relative link of ``page`` that does not resolve (empty when all do); paths
    in the messages are relative to ``root``, which no link may leave."""
    problems = []
    for number, target in links(page):
        if _SCHEME.match(target):
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        where = f"{page.relative_to(root)}:{number}: {target}"
        if not resolved.is_relative_to(root):
            problems.append(f"{where}: points outside the repository")
        elif not resolved.exists():
            problems.append(f"{where}: {resolved.relative_to(root)} does not exist")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            problems.append(f"{where}: no heading #{anchor} in {resolved.relative_to(root)}")
        elif anchor and resolved.suffix != ".md":
            problems.append(f"{where}: an anchor into a file that is not Markdown")
    return problems


def test_the_pages_are_found():
    names = {str(p.relative_to(ROOT)) for p in PAGES}
    assert {"README.md", "docs/ARCHITECTURE.md", "docs/commands/README.md",
            "deploy/README.md", "policies/library/README.md"} <= names


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    assert broken_links(page) == []


def test_github_heading_ids():
    assert slug("Exit codes") == "exit-codes"
    assert slug("`gpuguard serve` — the admission webhook") == "gpuguard-serve--the-admission-webhook"
    assert slug("Testing policies: `GPUPolicyTest` and `gpuguard test`") == \
        "testing-policies-gpupolicytest-and-gpuguard-test"
    assert slug("What it reads") == "what-it-reads"
    assert slug("TLS and authenticating the API server") == "tls-and-authenticating-the-api-server"


def test_a_broken_link_is_reported(tmp_path):
    (tmp_path / "other.md").write_text("# Other page\n\n## Exit codes\n\n## Exit codes\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n"
        "[ok](other.md#exit-codes) [ok too](other.md#exit-codes-1) [self](#page)\n"
        "[gone](missing.md) [no anchor](other.md#nowhere) [out](../../etc/passwd)\n"
        "`[code](missing.md)` and https://example.com are not links.\n\n"
        "```sh\n[fenced](missing.md)\n```\n\n"
        "[def]: other.md#other-page\n[bad def]: missing-too.md\n")
    assert broken_links(page, root=tmp_path) == [
        "page.md:4: missing.md: missing.md does not exist",
        "page.md:4: other.md#nowhere: no heading #nowhere in other.md",
        "page.md:4: ../../etc/passwd: points outside the repository",
        "page.md:12: missing-too.md: missing-too.md does not exist",
    ]


#: Pages whose inline code names the code itself (paths, modules, functions); deploy/README.md
#: also names files the commands write (``certs/ca.key``), so it is left out.
CODE_PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
_PACKAGES = ("policies", "webhook", "audit", "kube", "certs", "gpuguard")
_TOP = ("policies", "webhook", "audit", "kube", "certs", "gpuguard", "tests", "benchmarks",
        "deploy", "docs", "examples")
_CODE_PATH = re.compile(rf"^(?:{'|'.join(_TOP)})/[\w./-]*$")
_DOTTED = re.compile(rf"^(?:{'|'.join(_PACKAGES)})(?:\.\w+)+$")
_FILE_NAME = re.compile(r"\.(?:md|py|ya?ml|json|sh)$")  # `policies.md` is a page, not a module


def _resolves(dotted: str) -> bool:
    """Whether ``dotted`` is a module of gpuguard's packages, or an attribute chain of one."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(value, name):
                return False
            value = getattr(value, name)
        return True
    return False


def missing_code(page: Path, root: Path = ROOT) -> list[str]:
    """One line per inline-code path or dotted name in ``page`` that does not exist."""
    problems = []
    for number, line in _prose_lines(page.read_text(encoding="utf-8"), code=True):
        for match in _INLINE_CODE.finditer(line):
            span = match[0].strip("`").strip()
            where = f"{page.relative_to(root)}:{number}: `{span}`"
            if _CODE_PATH.match(span) and not (root / span).exists():
                problems.append(f"{where}: no such file or directory")
            elif _DOTTED.match(span) and not _FILE_NAME.search(span) and not _resolves(span):
                problems.append(f"{where}: no such module, class or function")
    return problems


@pytest.mark.parametrize("page", CODE_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_code_pages_name_code_that_exists(page):
    assert missing_code(page) == []


def test_a_stale_code_name_is_reported(tmp_path):
    (tmp_path / "policies").mkdir()
    page = tmp_path / "page.md"
    page.write_text("`policies/` and `policies/gone.py`; `policies.policy.matching.applicability`"
                    " and `policies.policy.matching.gone`, `nvidia.com/gpu`\n")
    assert missing_code(page, root=tmp_path) == [
        "page.md:1: `policies/gone.py`: no such file or directory",
        "page.md:1: `policies.policy.matching.gone`: no such module, class or function",
    ]

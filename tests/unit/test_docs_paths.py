"""The docs name only repository paths that exist, and their links land on headings that exist.

Scans README.md and every Markdown file under docs/. A repository path is a word that starts with one of the
repository's top directories (`libs/x.py`, `services/agent/`, `services/accounting/migrations/*.sql`);
`libs/core/limits.qos_of` names an attribute of `libs/core/limits.py` and counts when that module exists.
A Markdown link to a Markdown file (`[x](docs/decisions/agent.md#restarts)`) must name an existing file and,
with an anchor, one of its headings.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]

# The repository's top directories: a word starting with one of them is taken as a path into the repository.
TOPS = ("schemas", "libs", "services", "corral", "tests", "bench", "infra", "docs", "src")

# Preceded by nothing path-like (so `$XDG_RUNTIME_DIR/corral/` and `../shared/x` are not repository paths),
# then a top directory, a slash and path characters.
PATH_RE = re.compile(r"(?<![\w./<>$~-])((?:" + "|".join(TOPS) + r")/[\w./*{},-]*)")

# A Markdown link: [text](target), the target without a title.
LINK_RE = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _docs() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _exists(name: str) -> bool:
    """Whether a path named in prose exists: a file, a directory, a glob with matches, or `module.attr`."""
    if "*" in name:
        return any(ROOT.glob(name))
    if (ROOT / name).exists():
        return True
    # `libs/core/limits.qos_of`: an attribute that `libs/core/limits.py` defines.
    head, _, last = name.rpartition("/")
    module, _, attr = last.partition(".")
    source = ROOT / head / f"{module}.py"
    if not attr or not source.is_file():
        return False
    first = re.escape(attr.split(".")[0])
    defined = rf"^\s*(?:(?:async )?def |class ){first}\b|^{first}\s*[:=]"
    return re.search(defined, source.read_text(), re.M) is not None


def named_paths(text: str) -> list[str]:
    """The repository paths a Markdown text names, in order (URLs left out)."""
    text = re.sub(r"https?://\S+", "", text)
    # A sentence's full stop or a list's comma ends the path, not belongs to it.
    return [m.group(1).rstrip(".,") for m in PATH_RE.finditer(text)]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of a Markdown file's headings (outside fenced code)."""
    found: set[str] = set()
    fenced = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#{1,6} (.+)", line)):
            found.add(slug(m.group(1)))
    return found


def broken_links(doc: Path) -> list[str]:
    """The links of a Markdown file to Markdown files that do not exist or lack the linked heading."""
    broken = []
    for target in LINK_RE.findall(doc.read_text()):
        if "://" in target or target.startswith("mailto:"):
            continue
        file, _, anchor = target.partition("#")
        dest = (doc.parent / file).resolve() if file else doc
        missing_heading = dest.exists() and anchor and dest.suffix == ".md" and anchor not in anchors(dest)
        if not dest.exists() or missing_heading:
            broken.append(target)
    return broken


@pytest.mark.parametrize("doc", _docs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_named_paths_exist(doc: Path) -> None:
    missing = [name for name in named_paths(doc.read_text()) if not _exists(name)]
    assert not missing, f"{doc.relative_to(ROOT)} names paths that do not exist: {missing}"


@pytest.mark.parametrize("doc", _docs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_links_land(doc: Path) -> None:
    broken = broken_links(doc)
    assert not broken, f"{doc.relative_to(ROOT)} links to missing files or headings: {broken}"


def test_the_checks_see_a_wrong_path_and_anchor() -> None:
    """The scanner finds the paths prose names, and tells a wrong one from a right one."""
    text = (
        "see `libs/core/limits.qos_of`, `libs/core/limits.qos_off`, libs/nowhere.py and"
        " `$XDG_RUNTIME_DIR/corral/` (docs/simulator.md)."
    )
    named = named_paths(text)
    wanted = ["libs/core/limits.qos_of", "libs/core/limits.qos_off", "libs/nowhere.py", "docs/simulator.md"]
    assert named == wanted
    assert [_exists(n) for n in named] == [True, False, False, True]
    assert slug("Topology (blocks, `--switches`, `--segment`)") == "topology-blocks---switches---segment"
